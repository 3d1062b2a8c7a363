"""DeepSeek-V2 (V2-Lite, V2, V2.5; llama.cpp's LLM_ARCH_DEEPSEEK2, src/models/deepseek2.cpp). Its
multi-head latent attention (MLA) and the models built on it, in the form llama.cpp's converter
writes now: attn_kv_b split into attn_k_b and attn_v_b (attention.key_length_mla /
value_length_mla present), run as llama.cpp runs it, with the projections absorbed.

A layer: Q from `attn_q` (q_lora_rank 0: V2-Lite) or `attn_q_a`, RMSNorm `attn_q_a_norm`,
`attn_q_b`; per head the "nope" part (key_length_mla - rope.dimension_count) and the RoPE part
(rope.dimension_count, adjacent pairs, YaRN where scaled). `attn_kv_a_mqa` gives the compressed
latent (kv_lora_rank, RMSNorm `attn_kv_a_norm`) and one RoPE'd key part shared by every head. The
cache keeps per token only that: latent | RoPE'd key (attention.key_length = kv_lora_rank +
rope dims, one KV head), and V is the latent, the leading attention.value_length columns of the
same row (ModelConfig.kv_v_in_k). Each head's Q is absorbed into the latent space through
`attn_k_b` (its nope part times that head's (kv_lora_rank, nope) matrix), so attention is MQA over
the latent with Q = absorbed | RoPE'd part; each head's output (a mix of latents) goes back
through `attn_v_b` to value_length_mla, then `attn_output`. The attention scale: mscale² /
sqrt(key_length_mla), mscale YaRN's 1 + 0.1 rope_yarn_log_mul ln(factor) (1 unscaled).

The FFN: a dense SiLU FFN in the first `leading_dense_block_count` layers, then experts: the
router's softmax (V2) or sigmoid (V3-style files: expert_gating_func 2) over expert_count, the top
expert_used_count chosen by that plus `exp_probs_b` where present, their weights renormalized
where expert_weights_norm, times expert_weights_scale; plus expert_shared_count shared experts
(one SiLU FFN of expert_feed_forward_length times that count) over every token, added ungated.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .decoder import Primitives, ffn_block
from .spec import Architecture

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*: 0 (none: files before the key, softmax), 1 softmax, 2 sigmoid
_GATING = {0: "softmax", 1: "softmax", 2: "sigmoid"}


def _yarn(get: Any, head_dim_k_mla: int) -> dict[str, float]:
    """The RoPE magnitude and attention scale llama.cpp runs deepseek2 with (float32 as there): its
    context's yarn_attn_factor (llama-context.cpp: with a rope_yarn_log_mul, deepseek2's mscale
    equals mscale_all_dim, so only the 1 / (1 + 0.1 ln factor) that ggml's rope multiplies back in
    remains), and deepseek2.cpp's kq_scale = mscale² / sqrt(key_length_mla)."""
    f32 = np.float32
    kind = str(get("rope.scaling.type", "linear"))
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    freq_scale = f32(1.0) / f32(factor) if factor > 0 and kind != "none" else f32(1.0)
    attn_factor = f32(get("rope.scaling.attn_factor", 1.0))
    # the converter writes 0.1 * mscale_all_dim; llama.cpp's loader divides the 0.1 back out
    log_mul = f32(f32(get("rope.scaling.yarn_log_multiplier", 0.0)) / f32(0.1))
    ln = f32(np.log(f32(1.0) / freq_scale))
    out: dict[str, float] = {}
    if kind == "yarn":
        fac = f32(1.0) / freq_scale
        ratio = f32(1.0) if log_mul != 0 or fac <= 1 else f32(f32(0.1) * f32(np.log(fac)) + f32(1.0))
        yaf = f32(ratio * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * f32(np.log(fac)))))
        yaf = f32(yaf * attn_factor)
        out["rope_attn_factor"] = float(yaf)
    else:
        yaf = attn_factor
    org = f32(yaf * f32(f32(1.0) + f32(0.1) * ln))
    mscale = f32(org * f32(f32(1.0) + f32(f32(0.1) * log_mul) * ln))
    out["attn_scale"] = float(f32(f32(mscale * mscale) / f32(math.sqrt(f32(head_dim_k_mla)))))
    return out


def scalars(get: Any, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, Any]:
    """MLA's sizes, the router's settings and YaRN's factors, as llama_model_deepseek2's
    load_arch_hparams reads them. ValueError for a file infer does not run: one without the MLA
    keys (the older attn_kv_b layout, which llama.cpp runs unabsorbed: reconvert it), or whose
    cache layout (key_length, value_length, head_count_kv) is not MLA's."""
    kv_rank = int(get("attention.kv_lora_rank", 0) or 0)
    k_mla = int(get("attention.key_length_mla", 0) or 0)
    v_mla = int(get("attention.value_length_mla", 0) or 0)
    if not (kv_rank and k_mla and v_mla):
        raise ValueError("attention.kv_lora_rank, key_length_mla and value_length_mla are needed (a file "
                         "with the older unsplit attn_kv_b: convert it again with llama.cpp's converter)")
    n_rot = int(get("rope.dimension_count", 0) or 0)
    value_len = int(get("attention.value_length", 0) or 0)
    head_kv = int(get("attention.head_count_kv", 0) or 0)
    if head_dim != kv_rank + n_rot or value_len != kv_rank or head_kv != 1 or not 0 < n_rot < k_mla:
        raise ValueError(f"MLA's cache needs key_length = kv_lora_rank + rope.dimension_count, value_length = "
                         f"kv_lora_rank and one KV head; got {head_dim}, {value_len}, {head_kv} for kv_lora_rank "
                         f"{kv_rank}, rope.dimension_count {n_rot} (key_length_mla {k_mla})")
    # the "lite" models (V2-Lite: 27 layers, 26) have no Q compression; llama.cpp reads no q_lora_rank there
    q_rank = 0 if n_layer in (26, 27) else int(get("attention.q_lora_rank", 0) or 0)
    gating = int(get("expert_gating_func", 0) or 0)
    if gating not in _GATING:
        raise ValueError(f"expert_gating_func {gating} is not supported (1: softmax, 2: sigmoid)")
    scale = float(get("expert_weights_scale", 0.0) or 0.0)
    shared = int(get("expert_shared_count", 0) or 0)
    return {
        "n_lora_kv": kv_rank, "n_lora_q": q_rank, "head_dim_k_mla": k_mla, "head_dim_v_mla": v_mla,
        "moe_gating": _GATING[gating], "moe_norm_weights": bool(get("expert_weights_norm", False)),
        "expert_weights_scale": scale if scale else 1.0,  # 0 (absent): unscaled, as build_moe_ffn
        "n_ff_shexp": shared * int(get("expert_feed_forward_length", 0) or 0),
        **_yarn(get, k_mla),
    }


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """One deepseek2 layer: MLA (the Q and latent products, then the absorbed attention over the
    latent cache: the backend's mla_attention), attn_output, then decoder.py's FFN block (dense
    or experts with the shared expert)."""
    if ly.q_a:
        q = ops.linear(ly.q_a, h, "q_a", il)
        q = ops.linear(ly.q, ops.rms_norm(q, ly.q_a_norm, "q_a_norm", il), "q", il)
    else:
        q = ops.linear(ly.q, h, "q", il)
    kv = ops.linear(ly.kv_a, h, "kv_cmpr_pe", il)
    a = ops.mla_attention(q, kv, ly, il)
    o = ops.linear(ly.wo, a, "attn_wo", il)
    return ffn_block(ops, ly, il, x, o, nxt)


ARCHITECTURE = Architecture(
    name="deepseek2",
    rope_neox=False,
    experts="always",
    shared_expert="plain",
    extra_biases=("exp_probs_b.bias",),
    optional_biases=("exp_probs_b.bias",),
    attention_kind="multi-head latent attention over a latent KV cache",
    scalars=scalars,
    layer=layer,
)
