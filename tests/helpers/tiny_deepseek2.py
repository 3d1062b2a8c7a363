"""Tiny random-weight deepseek2 (MLA) models, in the layout llama.cpp's converter writes now
(attn_k_b / attn_v_b): "deepseek2" with a compressed Q (q_lora_rank > 0), sigmoid gating with a
selection bias, renormalized and scaled expert weights and YaRN; "deepseek2-lite" as
DeepSeek-V2-Lite (a plain attn_q, softmax gating, weights neither renormalized nor scaled); either
with "-kvb" (TYPES_KV_B): the same weights in the older layout many files on the Hub still have,
attn_k_b and attn_v_b recombined into one attn_kv_b (per head its nope rows, then its V rows) and
the older keys (key_length nope + RoPE, value_length V, a KV head per head, no *_mla keys)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT

# the latent (kv_lora_rank), the RoPE part, each head's nope part and V, Q's compression
MLA_RANK, MLA_ROT, MLA_NOPE, MLA_V, MLA_Q_RANK = 128, 32, 64, 64, 64
MLA_HEADS, MLA_DENSE_LEAD, MLA_LAYERS = 4, 1, 3
MLA_EXPERTS, MLA_USED, MLA_FF_EXP = 8, 3, 256

TYPES = {
    "deepseek2": {"attn_q_a": GT.Q8_0, "attn_q_b": GT.Q5_0, "attn_kv_a_mqa": GT.Q8_0, "attn_k_b": GT.Q8_0,
                  "attn_v_b": GT.F16, "attn_output": GT.Q8_0, "ffn_gate": GT.Q8_0, "ffn_up": GT.Q5_0,
                  "ffn_down": GT.Q8_0, "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q8_0, "ffn_up_exps": GT.Q8_0,
                  "ffn_down_exps": GT.Q8_0, "ffn_gate_shexp": GT.Q5_0, "ffn_up_shexp": GT.Q8_0,
                  "ffn_down_shexp": GT.Q4_0, "token_embd": GT.Q8_0},
    "deepseek2-lite": {"attn_q": GT.Q8_0, "attn_kv_a_mqa": GT.F16, "attn_k_b": GT.F16, "attn_v_b": GT.Q8_0,
                       "attn_output": GT.Q5_0, "ffn_gate": GT.F16, "ffn_up": GT.BF16, "ffn_down": GT.F16,
                       "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q8_0, "ffn_up_exps": GT.Q5_0,
                       "ffn_down_exps": GT.Q8_0, "ffn_gate_shexp": GT.F16, "ffn_up_shexp": GT.Q8_0,
                       "ffn_down_shexp": GT.F16, "token_embd": GT.Q8_0, "output": GT.Q8_0},
}

# the older layout's attn_kv_b, in a float type as the converters of the time wrote it, or requantized
TYPES_KV_B = {"deepseek2": GT.F16, "deepseek2-lite": GT.Q8_0}


def write_tiny_deepseek2(path: Path, variant: str, seed: int, n_vocab: int, n_ctx: int,
                         chat_template: str | None, dtype: GT | None = None) -> Path:
    """The tiny model; dtype (F32, F16, BF16): every matrix in that float type, a few outliers in
    each (what llama-quantize takes as input: tests/test_quantize_file.py), else TYPES' mix."""
    from .tiny_models import add_spm_vocab, random_tensor

    rng = np.random.default_rng(seed)
    kv_b = variant.endswith("-kvb")
    variant = variant.removesuffix("-kvb")
    types = TYPES[variant]
    lite = variant == "deepseek2-lite"
    D, H, F = 256, MLA_HEADS, 512
    R, n_rot, dk, dv = MLA_RANK, MLA_ROT, MLA_NOPE + MLA_ROT, MLA_V
    w = gguf.GGUFWriter(str(path), "deepseek2")
    # the cache's layout, as llama.cpp's converter writes an MLA model: one KV head of latent | RoPE part
    w.add_name("tiny-deepseek2")
    w.add_context_length(n_ctx)
    w.add_embedding_length(D)
    w.add_block_count(MLA_LAYERS)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    if kv_b:  # the older layout's keys: llama.cpp's cache of K and V per head
        w.add_head_count_kv(H)
        w.add_key_length(dk)
        w.add_value_length(dv)
    else:
        w.add_head_count_kv(1)
        w.add_key_length(R + n_rot)
        w.add_value_length(R)
        w.add_key_length_mla(dk)
        w.add_value_length_mla(dv)
    w.add_kv_lora_rank(R)
    w.add_q_lora_rank(0 if lite else MLA_Q_RANK)
    w.add_rope_dimension_count(n_rot)
    w.add_leading_dense_block_count(MLA_DENSE_LEAD)
    w.add_expert_count(MLA_EXPERTS)
    w.add_expert_used_count(MLA_USED)
    w.add_expert_feed_forward_length(MLA_FF_EXP)
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(1.0 if lite else 2.5)
    w.add_expert_weights_norm(not lite)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX if lite else gguf.ExpertGatingFuncType.SIGMOID)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if not lite:  # YaRN as DeepSeek-V2's files: the converter's 0.1 * mscale_all_dim
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(16)
        w.add_rope_scaling_yarn_log_mul(0.1 * 0.707)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if dtype is not None:
        w.add_file_type(0)  # an input's own file type: the output must move it to the end with the new value
    add_spm_vocab(w, n_vocab)
    w.add_unk_token_id(0)

    held: dict[str, np.ndarray] = {}  # "-kvb": a layer's attn_k_b and attn_v_b, as floats, until both are drawn

    def add(name: str, shape: tuple[int, ...], qtype: GT | None = None) -> None:
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shape)).astype(np.float32))
            return
        if dtype is not None:
            data, qt = _float_data(rng, shape, dtype)
        else:
            data, qt = random_tensor(rng, (int(np.prod(shape[:-1])), shape[-1]), qtype)
            data = data.reshape(*shape[:-1], -1)
            if name.endswith("ffn_gate_inp.weight"):
                data = data * np.float32(20)
        if kv_b and name.endswith(("attn_k_b.weight", "attn_v_b.weight")):
            held[name[-15:-7]] = gguf.quants.dequantize(data, qt).reshape(shape)
            if len(held) == 2:  # per head its nope rows (attn_k_b's matrix transposed), then its V rows
                k_b, v_b = held.pop("attn_k_b"), held.pop("attn_v_b")
                whole = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(-1, R)
                qt = dtype if dtype is not None else TYPES_KV_B[variant]
                _add_typed(w, name.replace("attn_v_b", "attn_kv_b"), whole, qt)
            return
        if qt in (GT.F32, GT.F16):
            w.add_tensor(name, data)
        elif dtype == GT.BF16:  # _float_data's, its shape in bytes
            w.add_tensor(name, data, raw_dtype=qt)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    add("token_embd.weight", (n_vocab, D), types["token_embd"])
    add("output_norm.weight", (D,))
    if "output" in types:
        add("output.weight", (n_vocab, D), types["output"])
    for i in range(MLA_LAYERS):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (D,))
        if lite:
            add(p + "attn_q.weight", (H * dk, D), types["attn_q"])
        else:
            add(p + "attn_q_a.weight", (MLA_Q_RANK, D), types["attn_q_a"])
            add(p + "attn_q_a_norm.weight", (MLA_Q_RANK,))
            add(p + "attn_q_b.weight", (H * dk, MLA_Q_RANK), types["attn_q_b"])
        add(p + "attn_kv_a_mqa.weight", (R + n_rot, D), types["attn_kv_a_mqa"])
        add(p + "attn_kv_a_norm.weight", (R,))
        add(p + "attn_k_b.weight", (H, R, MLA_NOPE), types["attn_k_b"])
        add(p + "attn_v_b.weight", (H, dv, R), types["attn_v_b"])
        add(p + "attn_output.weight", (D, H * dv), types["attn_output"])
        add(p + "ffn_norm.weight", (D,))
        if i < MLA_DENSE_LEAD:
            add(p + "ffn_gate.weight", (F, D), types["ffn_gate"])
            add(p + "ffn_up.weight", (F, D), types["ffn_up"])
            add(p + "ffn_down.weight", (D, F), types["ffn_down"])
            continue
        Fe = MLA_FF_EXP
        add(p + "ffn_gate_inp.weight", (MLA_EXPERTS, D), types["ffn_gate_inp"])
        for name, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
            add(p + f"ffn_{name}_exps.weight", (MLA_EXPERTS, *shape), types[f"ffn_{name}_exps"])
            add(p + f"ffn_{name}_shexp.weight", shape, types[f"ffn_{name}_shexp"])
        if not lite:  # the selection bias, spread as widely as the sigmoids so it moves the choice
            w.add_tensor(p + "exp_probs_b.bias", rng.normal(0, 0.3, size=MLA_EXPERTS).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _float_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: GT) -> tuple[np.ndarray, GT]:
    x = rng.normal(0, 0.02, size=shape).astype(np.float32)
    x.reshape(-1, shape[-1])[0, :8] *= 40  # a few outliers, so scale searches have something to do
    if dtype == GT.F32:
        return x, dtype
    if dtype == GT.F16:
        return x.astype(np.float16), dtype
    # BF16 by truncation (fine for a test input), its shape in bytes
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shape[:-1], -1), dtype


def _add_typed(w, name: str, x: np.ndarray, qtype: GT) -> None:
    """Float weights x written as qtype (BF16 by truncation; a GGML block type quantized)."""
    if qtype == GT.F32:
        w.add_tensor(name, x.astype(np.float32))
    elif qtype == GT.F16:
        w.add_tensor(name, x.astype(np.float16))
    elif qtype == GT.BF16:
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        w.add_tensor(name, bits.view(np.uint8).reshape(*x.shape[:-1], -1), raw_dtype=GT.BF16)
    else:
        data = gguf.quants.quantize(x.astype(np.float32), qtype)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
