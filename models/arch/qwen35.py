"""Qwen3.5 dense (llama.cpp's LLM_ARCH_QWEN35): Gated DeltaNet linear-attention layers
interleaved with gated full-attention layers, each followed by the gated SiLU FFN; pre-norm, the
FFN's norm named `post_attention_norm` (llama.cpp's src/models/qwen35.cpp, delta-net-base.cpp).

Which layers are recurrent: `attention.recurrent_layers` (a flag per layer), else every layer but
each `full_attention_interval`-th (default 4). A recurrent layer (build_layer_attn_linear): from
the normed input, Q|K|V (`attn_qkv`, key heads * S twice, then value heads * S), the output gate z
(`attn_gate`), beta = sigmoid(`ssm_beta` h) and the decay g = softplus(`ssm_alpha` h + `ssm_dt`) *
`ssm_a` per value head; a depthwise causal convolution of width `ssm.conv_kernel` over Q|K|V (its
last width - 1 inputs the sequence's "conv" state), SiLU; Q and K L2-normalized per head; the
gated delta rule per value head (its key head: value head % key heads, ggml's tiling) over a
(S x S) state matrix, the sequence's "delta" state (backends/cpu/delta_net.py); RMSNorm of each
head's output times `ssm_norm`, times SiLU(z); `ssm_out`. A full-attention layer: Q and a gate per
head interleaved in one `attn_q` product (split apart at load: models/weights.py), Q/K RMSNorm per
head, RoPE over the first rope.dimension_count dims of each head, attention, times sigmoid(gate),
`attn_output`. llama.cpp rotates with its interleaved multi-section RoPE (IMROPE); a text token's
positions are equal in every section, which makes it NeoX RoPE wherever every rotated pair falls
in a time/height/width section (checked: the fourth, extra section would rotate by position 0).
Multi-token-prediction layers (`nextn_predict_layers`) are refused (a follow-up).
"""
from __future__ import annotations

from typing import Any, Callable

from ..limits import MAX_CONV_WIDTH, MAX_HEAD_DIM
from .decoder import Primitives, ffn_block
from .spec import Architecture


def _imrope_is_neox(sections: Any, n_rot: int) -> bool:
    """Whether ggml's IMROPE (ggml_mrope_cache_init) takes every rotated pair's angle from the
    time, height or width position (all equal to the token's position for text), never from the
    fourth (extra) one, which is 0 for text tokens."""
    s = [int(v) for v in sections] + [0] * (4 - len(sections))
    total = sum(s[:4])
    if total <= 0:
        return True  # no sections: one position for every pair
    for pair in range(n_rot // 2):
        sector = pair % total
        if not ((sector % 3 == 0 and sector < 3 * s[0]) or (sector % 3 == 1 and sector < 3 * s[1])
                or (sector % 3 == 2 and sector < 3 * s[2])):
            return False
    return True


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """The recurrent layers and the gated delta net's sizes; ValueError for metadata that does not
    describe a qwen35 infer runs (ModelConfig.from_metadata makes it a ModelConfigError)."""
    if int(get("nextn_predict_layers", 0) or 0):
        raise ValueError("multi-token-prediction layers (nextn_predict_layers) are not supported")
    sizes = {}
    for key, field in (("ssm.conv_kernel", "ssm_conv_kernel"), ("ssm.state_size", "ssm_state_size"),
                       ("ssm.group_count", "ssm_group_count"), ("ssm.time_step_rank", "ssm_dt_rank"),
                       ("ssm.inner_size", "ssm_inner_size")):
        v = get(key, None)
        if v is None or hasattr(v, "__len__"):
            raise ValueError(f"{key} is missing (one number)")
        sizes[field] = int(v)
    if not 2 <= sizes["ssm_conv_kernel"] <= MAX_CONV_WIDTH:
        raise ValueError(f"ssm.conv_kernel {sizes['ssm_conv_kernel']} is out of range (2..{MAX_CONV_WIDTH})")
    S, hk, hv = sizes["ssm_state_size"], sizes["ssm_group_count"], sizes["ssm_dt_rank"]
    if not (1 <= S <= MAX_HEAD_DIM and 1 <= hk <= 4096 and 1 <= hv <= 4096):
        raise ValueError(f"ssm.state_size {S}, group_count {hk}, time_step_rank {hv} are out of range")
    if hv % hk or sizes["ssm_inner_size"] != hv * S:
        raise ValueError(f"ssm.inner_size {sizes['ssm_inner_size']} must be time_step_rank {hv} * state_size {S}, "
                         f"and time_step_rank a multiple of group_count {hk}")
    flags = get("attention.recurrent_layers", None)
    if flags is not None:
        if not hasattr(flags, "__len__") or len(flags) != n_layer:
            raise ValueError(f"attention.recurrent_layers must give a flag for each of {n_layer} layers")
        layer_recurrent = tuple(bool(v) for v in flags)
    else:
        interval = int(get("full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"full_attention_interval {interval} must be positive")
        layer_recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    if all(layer_recurrent):
        raise ValueError("no full-attention layer (every layer recurrent) is not supported")
    head_dim = int(get("attention.key_length", 0) or 0)
    n_rot = int(get("rope.dimension_count", head_dim) or 0)
    sections = get("rope.dimension_sections", None)
    if sections is not None and not _imrope_is_neox(sections, n_rot):
        raise ValueError(f"rope.dimension_sections {list(sections)} rotate some pairs by the extra section's "
                         "position, which text tokens do not have")
    return {"layer_recurrent": layer_recurrent, **sizes}


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """A gated delta net layer (a layer with ssm_in products) or a gated full-attention layer,
    then the FFN."""
    if ly.ssm_in:
        proj = ops.linear(ly.ssm_in, h, "ssm_in", il)  # Q|K|V, z, beta, alpha side by side
        y = ops.delta_net(proj, ly, il)
        o = ops.linear(ly.ssm_out, y, "linear_attn_out", il)
    else:
        qkv = ops.linear(ly.qkv, h, "qkv", il)  # Q|K|V, then the gate
        a = ops.attention(qkv, ly, il)
        a = ops.attn_gate(a, qkv, il)
        o = ops.linear(ly.wo, a, "attn_wo", il)
    return ffn_block(ops, ly, il, x, o, nxt)


ARCHITECTURE = Architecture(
    name="qwen35",
    rope_neox=True,
    qk_norm="head",
    attn_output_gate=True,
    ffn_norm_tensor="post_attention_norm",
    extra_biases=("ssm_dt.bias",),
    recurrent=recurrent,
    recurrent_kind="gated delta nets",
    chat_template="chatml",
    layer=layer,
)
