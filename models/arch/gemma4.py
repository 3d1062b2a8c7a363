"""Gemma 4 (text; llama.cpp's LLM_ARCH_GEMMA4, src/models/gemma4.cpp): the Gemma 3 layer (embeddings
times sqrt(n_embd), GELU, Q/K norms per head, norms after attention and the FFN as well as before)
with its own quirks:
- sliding-window and global layers by a per-layer flag (attention.sliding_window_pattern), each
  kind with its own head size (attention.key_length_swa / key_length), KV heads (a per-layer
  head_count_kv) and rotated dims (rope.dimension_count_swa); the global layers rotate with
  rope_freqs (proportional RoPE: factors of 1e30 leave the unrotated pairs as they are), the
  sliding-window ones without;
- V RMS-normed per head without a weight; no attention scale (Q·K as it is); a layer without
  attn_v takes K's product as V;
- each layer's output times its layer_output_scale;
- E2B / E4B: per-layer embeddings (embedding_length_per_layer_input P): every layer gets a P-wide
  input of the token's own per_layer_token_embd row mixed with a projection of its embedding, which
  gates a small FFN-like block (inp_gate, proj, post_norm) after the FFN;
- the last attention.shared_kv_layers layers keep no K/V: each attends over the last earlier
  layer of its kind's (llama.cpp's layer_reuse_cb);
- 26B-A4B: experts (expert_count) in every layer beside its dense FFN, each branch on its own
  norms: the dense FFN of ffn_norm(x), normed by post_ffw_norm_1; the experts of
  pre_ffw_norm_2(x), chosen by a router whose input is RMSNorm(x) without a weight, times
  1 / sqrt(n_embd), times ffn_gate_inp.scale (softmax over all experts, the top
  expert_used_count renormalized), each expert's output times its ffn_down_exps.scale, their sum
  normed by post_ffw_norm_2; the two added, then post_ffw_norm as in a dense layer.
The final logits are soft-capped where final_logit_softcapping is set."""
from __future__ import annotations

import math
from typing import Any

from ..hf_vocab import gemma4_vocab
from . import gemma3, gemma4_hf
from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    # llama.cpp: f_attention_scale = 1 (Gemma4's self.scaling = 1.0: Q and K are RMS-normed instead)
    return {"embed_scale": math.sqrt(n_embd), "attn_scale": 1.0}


def layer_shapes(get, n_layer: int) -> dict[str, Any]:
    """The shapes that differ by kind of layer: the KV heads of a per-layer head_count_kv (one
    value for each kind), the sliding-window layers' head size and rotated dims, and the layers
    that keep K/V (all but the last shared_kv_layers)."""
    pattern = get("attention.sliding_window_pattern")
    if not hasattr(pattern, "__len__") or len(pattern) != n_layer:
        raise ValueError(f"attention.sliding_window_pattern needs a flag for each of the {n_layer} layers")
    swa = [bool(v) for v in pattern]
    out: dict[str, Any] = {}
    kv = get("attention.head_count_kv")
    if hasattr(kv, "__len__"):
        if len(kv) != n_layer:
            raise ValueError(f"attention.head_count_kv has {len(kv)} values for {n_layer} layers")
        by_kind = [{int(v) for v, s in zip(kv, swa) if s == kind} for kind in (False, True)]
        if any(len(k) > 1 for k in by_kind):
            raise ValueError("attention.head_count_kv must be one value for the global layers and one for "
                             "the sliding-window layers")
        full, local = (min(k) if k else 0 for k in by_kind)
        if not full and not local or min(v for v in (full, local) if v) <= 0:
            raise ValueError("attention.head_count_kv must be positive")
        out["n_head_kv"] = full or local
        out["n_head_kv_swa"] = local
    head_k, head_v = int(get("attention.key_length_swa", 0)), int(get("attention.value_length_swa", 0))
    if head_k != head_v:
        raise ValueError(f"key_length_swa {head_k} and value_length_swa {head_v} must be equal (as llama.cpp)")
    if not 0 <= head_k <= 4096:  # models/limits.py's MAX_HEAD_DIM bounds the global one alike
        raise ValueError(f"key_length_swa {head_k} is out of range")
    out["head_dim_swa"] = head_k
    n_rot = int(get("rope.dimension_count_swa", 0))
    if n_rot % 2 or n_rot < 0 or n_rot > (head_k or 4096):
        raise ValueError(f"rope.dimension_count_swa {n_rot} must be even and at most the head size")
    out["n_rot_swa"] = n_rot
    n_ff = get("feed_forward_length")
    if hasattr(n_ff, "__len__"):  # use_double_wide_mlp: the shared-KV layers' FFNs twice as wide
        if len(n_ff) != n_layer or min(int(v) for v in n_ff) <= 0:
            raise ValueError(f"feed_forward_length needs a positive width for each of the {n_layer} layers")
        out["n_ff"], out["n_ff_layers"] = max(int(v) for v in n_ff), tuple(int(v) for v in n_ff)
    per_layer = int(get("embedding_length_per_layer_input", 0))
    if not 0 <= per_layer <= 65536:
        raise ValueError(f"embedding_length_per_layer_input {per_layer} is out of range")
    out["n_embd_per_layer"] = per_layer
    shared = int(get("attention.shared_kv_layers", 0))
    if shared:
        first = n_layer - shared
        # as llama.cpp's reuse callback: layer first - 2 a sliding-window one, first - 1 a global one
        if first < 2 or not swa[first - 2] or swa[first - 1]:
            raise ValueError(f"attention.shared_kv_layers {shared}: the last layers with K/V must be a "
                             f"sliding-window layer, then a global one")
        out["n_layer_kv"] = first
    return out


def layer(ops: Any, ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """One Gemma 4 layer: dense_layer's, its output times the layer's output scale before the norm
    that follows."""
    if il == 0 and ly.ple_gate:  # x: the scaled token embeddings
        ops.per_layer_inputs(x)
    qkv = ops.linear(ly.qkv, h, "qkv", il)
    a = ops.attention(qkv, ly, il)
    o = ops.linear(ly.wo, a, "attn_wo", il)
    # llama.cpp names the residual after attention "attn_out" here (gemma4.cpp)
    moe = bool(ly.experts)
    x, h = ops.add_norm(x, o, ly.post_attn_norm, ly.ffn_norm, il, "attn_out", "ffn_norm_1" if moe else "ffn_norm", il)
    gu = ops.linear(ly.gate_up, h, "ffn_gate_up", il)
    if moe:  # x: attn_out, the input of both branches and of the router
        o = ops.rms_norm(ops.linear(ly.down, ops.glu(gu, il), "ffn_mlp_down", il), ly.post_ffn_norm_1, "ffn_mlp", il)
        e = ops.moe(ops.norm(x, ly.pre_ffn_norm_2, "ffn_norm_2", il), ly, il, x)
        o, _ = ops.add_norm(o, e, ly.post_ffn_norm_2, None, il, "ffn_moe_combined", "ffn_moe_combined", il)
    else:
        o = ops.linear(ly.down, ops.glu(gu, il), "ffn_out", il)
    if not ly.ple_gate:
        return ops.add_scale_norm(x, o, ly.post_ffn_norm, ly.out_scale, nxt[0], il, nxt[1], nxt[2])
    # the per-layer embedding (E2B, E4B): proj(GELU(inp_gate · x) * the layer's input), normed, added
    x, _ = ops.add_norm(x, o, ly.post_ffn_norm, None, il, "pe_in", "pe_in", il)
    o = ops.linear(ly.ple_proj, ops.per_layer_gate(x, ly, il), "per_layer_proj", il)
    return ops.add_scale_norm(x, o, ly.ple_norm, ly.out_scale, nxt[0], il, nxt[1], nxt[2])


ARCHITECTURE = Architecture(
    name="gemma4",
    rope_neox=True,
    qk_norm="head",
    post_norms=True,
    activation="gelu",
    swa_pattern=1,  # the per-layer flags decide (layer_shapes requires them)
    swa_rope_base=10000.0,
    v_norm=True,
    v_from_k=True,
    rope_freqs_global_only=True,
    out_scale=True,
    experts="optional",
    shared_expert="dense",
    scalars=scalars,
    layer_shapes=layer_shapes,
    layer=layer,
    chat_template="gemma4",
    hf_model_types=("gemma4", "gemma4_text"),
    # no hf_class: an MLX (Hugging Face) export of gemma4 is refused until its config keys are written back
    hf_tied_default=True,
    hf_text_hparams=gemma3.hf_text_hparams,  # text_config of a multimodal checkpoint, as Gemma 3
    hf_text_name=gemma4_hf.hf_text_name,
    hf_trim_embeddings=True,
    hf_kvs=gemma4_hf.hf_kvs,
    hf_vocab=gemma4_vocab,
    hf_bfloat16=True,
)
