"""scripts/bench_shapes.py's layers beyond a plain decoder's (each one's tensors as (name, shape,
is a matrix) and, for deepseek2 and gemma4, their metadata) and its files' vocabulary."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mla:
    """deepseek2's multi-head latent attention (kv_lora_rank: the latent cached per token, with the
    key's shared RoPE part of qk_rope; each head's nope part of Q and its V out of it), its first
    n_dense_lead layers dense, its experts' shared ones, and its YaRN (factor, original context,
    mscale_all_dim); Q uncompressed (q_lora_rank 0, DeepSeek-V2-Lite's)."""

    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int
    n_dense_lead: int
    n_expert_shared: int
    yarn_factor: float
    yarn_orig_ctx: int
    mscale_all_dim: float

    def add_metadata(self, w) -> None:
        """The keys llama.cpp's convert_hf_to_gguf.py writes for DeepseekV2ForCausalLM (the cache's
        K row latent | RoPE part, its V the latent; the heads' own sizes in the _mla keys)."""
        import gguf

        R, rot = self.kv_lora_rank, self.qk_rope
        w.add_key_length(R + rot)
        w.add_value_length(R)
        w.add_key_length_mla(self.qk_nope + rot)
        w.add_value_length_mla(self.v_head)
        w.add_kv_lora_rank(R)
        w.add_q_lora_rank(0)
        w.add_rope_dimension_count(rot)
        w.add_leading_dense_block_count(self.n_dense_lead)
        w.add_expert_shared_count(self.n_expert_shared)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(False)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(self.yarn_factor)
        w.add_rope_scaling_orig_ctx_len(self.yarn_orig_ctx)
        w.add_rope_scaling_yarn_log_mul(0.1 * self.mscale_all_dim)


def mla_layer(shape, p: str, il: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """One deepseek2 layer (shape: bench_shapes.Shape with its mla): MLA in the converter's split
    layout (attn_k_b, attn_v_b per head), then a dense FFN or the experts with their shared ones."""
    m, D, H = shape.mla, shape.n_embd, shape.n_head
    R, nope, rot, dv = m.kv_lora_rank, m.qk_nope, m.qk_rope, m.v_head
    out = [(p + "attn_norm.weight", (D,), False), (p + "attn_q.weight", (H * (nope + rot), D), True),
           (p + "attn_kv_a_mqa.weight", (R + rot, D), True), (p + "attn_kv_a_norm.weight", (R,), False),
           (p + "attn_k_b.weight", (H, R, nope), True), (p + "attn_v_b.weight", (H, dv, R), True),
           (p + "attn_output.weight", (D, H * dv), True), (p + "ffn_norm.weight", (D,), False)]
    if il < m.n_dense_lead:
        F = shape.n_ff
        return out + [(p + "ffn_gate.weight", (F, D), True), (p + "ffn_up.weight", (F, D), True),
                      (p + "ffn_down.weight", (D, F), True)]
    E, Fe, Fs = shape.n_expert, shape.n_ff_exp, shape.n_ff_exp * m.n_expert_shared
    return out + [(p + "ffn_gate_inp.weight", (E, D), True), (p + "ffn_gate_exps.weight", (E, Fe, D), True),
                  (p + "ffn_up_exps.weight", (E, Fe, D), True), (p + "ffn_down_exps.weight", (E, D, Fe), True),
                  (p + "ffn_gate_shexp.weight", (Fs, D), True), (p + "ffn_up_shexp.weight", (Fs, D), True),
                  (p + "ffn_down_shexp.weight", (D, Fs), True)]


def qwen35_mixer(shape, p: str, attention: bool) -> list[tuple[str, tuple[int, ...], bool]]:
    """One qwen35 layer's tensors (shape: bench_shapes.Shape) before its FFN: gated attention (Q
    with its output gate, Q/K norms) or a gated delta net (QKV, gate, beta, alpha, the
    convolution, decays, norm, out)."""
    D, H, Hkv, hd = shape.n_embd, shape.n_head, shape.n_head_kv, shape.head_dim
    out = [(p + "attn_norm.weight", (D,), False), (p + "post_attention_norm.weight", (D,), False)]
    if attention:
        return out + [(p + "attn_q.weight", (2 * H * hd, D), True), (p + "attn_k.weight", (Hkv * hd, D), True),
                      (p + "attn_v.weight", (Hkv * hd, D), True), (p + "attn_output.weight", (D, H * hd), True),
                      (p + "attn_q_norm.weight", (hd,), False), (p + "attn_k_norm.weight", (hd,), False)]
    S, Hk, Hv = shape.ssm_s, shape.ssm_hk, shape.ssm_hv
    C = 2 * Hk * S + Hv * S
    return out + [(p + "attn_qkv.weight", (C, D), True), (p + "attn_gate.weight", (Hv * S, D), True),
                  (p + "ssm_beta.weight", (Hv, D), True), (p + "ssm_alpha.weight", (Hv, D), True),
                  (p + "ssm_conv1d.weight", (C, 4), False), (p + "ssm_dt.bias", (Hv,), False),
                  (p + "ssm_a", (Hv,), False), (p + "ssm_norm.weight", (S,), False),
                  (p + "ssm_out.weight", (D, Hv * S), True)]


def add_vocab(w, n_vocab: int) -> None:
    """A SentencePiece-style vocabulary of n_vocab distinct pieces (byte fallback, BOS 1, EOS 2)."""
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word(i: int) -> str:
        s = ""
        while True:
            s += letters[i % 26]
            i //= 26
            if i == 0:
                return s

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    n_special = len(tokens)
    tokens += ["\u2581" + word(i) for i in range(n_vocab - n_special)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_special + [-float(j) for j in range(n_vocab - n_special)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - n_special))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def gemma4_tensors(shape) -> list[tuple[str, tuple[int, ...], bool]]:
    """A Gemma 4 text model's tensors (shape: bench_shapes.Shape with its gemma4 fields) after the
    token embedding and output norm, as llama.cpp's converter names them (src/models/gemma4.cpp loads them): rope_freqs, the per-layer embedding
    tables, and each layer's attention (K and V only on layers that keep K/V), FFN, output scale
    and per-layer embedding block."""
    D, F, H, Hkv, L, P = shape.n_embd, shape.n_ff, shape.n_head, shape.n_head_kv, shape.n_layer, shape.n_embd_per_layer
    out: list[tuple[str, tuple[int, ...], bool]] = [("rope_freqs.weight", (shape.head_dim_global // 2,), False)]
    if P:
        out += [("per_layer_token_embd.weight", (shape.n_vocab, L * P), True),
                ("per_layer_model_proj.weight", (L * P, D), True), ("per_layer_proj_norm.weight", (P,), False)]
    for i in range(L):
        p = f"blk.{i}."
        hd = shape.head_dim_global if (i + 1) % shape.swa_period == 0 else shape.head_dim
        own_kv = i < L - shape.n_shared_kv
        Fl = F * (1 if own_kv else 2)
        out += [(p + "attn_norm.weight", (D,), False), (p + "attn_q.weight", (H * hd, D), True),
                (p + "attn_q_norm.weight", (hd,), False)]
        if own_kv:
            out += [(p + "attn_k.weight", (Hkv * hd, D), True), (p + "attn_v.weight", (Hkv * hd, D), True),
                    (p + "attn_k_norm.weight", (hd,), False)]
        out += [(p + "attn_output.weight", (D, H * hd), True), (p + "post_attention_norm.weight", (D,), False),
                (p + "ffn_norm.weight", (D,), False), (p + "ffn_gate.weight", (Fl, D), True),
                (p + "ffn_up.weight", (Fl, D), True), (p + "ffn_down.weight", (D, Fl), True),
                (p + "post_ffw_norm.weight", (D,), False), (p + "layer_output_scale.weight", (1,), False)]
        if P:
            out += [(p + "inp_gate.weight", (P, D), True), (p + "proj.weight", (D, P), True),
                    (p + "post_norm.weight", (D,), False)]
    return out


def gemma4_kvs(w, shape) -> None:
    """Gemma 4's own keys, as llama.cpp's converter writes them (Gemma4Model.set_gguf_parameters)."""
    L, first_shared = shape.n_layer, shape.n_layer - shape.n_shared_kv
    swa = [(i + 1) % shape.swa_period != 0 for i in range(L)]
    w.add_feed_forward_length([shape.n_ff if i < first_shared else 2 * shape.n_ff for i in range(L)])
    w.add_key_length(shape.head_dim_global)
    w.add_value_length(shape.head_dim_global)
    w.add_key_length_swa(shape.head_dim)
    w.add_value_length_swa(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim_global)  # rope_freqs decides which pairs turn
    w.add_rope_dimension_count_swa(shape.head_dim)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(shape.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(shape.n_shared_kv)
    w.add_embedding_length_per_layer_input(shape.n_embd_per_layer)
    w.add_final_logit_softcapping(shape.logit_softcap)
