"""LiquidAI LFM2-MoE (LFM2-8B-A1B; llama.cpp's LLM_ARCH_LFM2MOE): lfm2's layers (lfm2.py: gated
short convolutions beside GQA attention, which from attention.head_count_kv per layer) with a
mixture of experts for the FFN after the first `leading_dense_block_count` layers, which keep
lfm2's dense SiLU FFN. The router (llama.cpp's build_moe_ffn with the file's
expert_gating_func, sigmoid for every converted file): each expert's sigmoid of its logit; the top
expert_used_count experts chosen by that plus the layer's selection bias (`exp_probs_b`, which
only the choice sees); their sigmoids renormalized to sum 1 weight their SwiGLU FFNs of
expert_feed_forward_length.
"""
from __future__ import annotations

from typing import Any, Callable

from . import lfm2
from .spec import Architecture

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, as its converter writes for every LFM2-MoE
_SIGMOID = 2


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """lfm2's layer kinds (lfm2.recurrent); ValueError for a router gating other than sigmoid
    (llama.cpp takes the key as required; the converter writes sigmoid)."""
    gating = get("expert_gating_func", None)
    if gating is None:
        raise ValueError("expert_gating_func is missing")
    if int(gating) != _SIGMOID:
        raise ValueError(f"expert_gating_func {gating} is not supported (2: sigmoid)")
    return lfm2.recurrent(get, n_layer)


ARCHITECTURE = Architecture(
    name="lfm2moe",
    rope_neox=True,
    qk_norm="head",
    experts="always",
    moe_gating="sigmoid",
    extra_biases=("exp_probs_b.bias",),
    output_norm_tensor="token_embd_norm",
    recurrent=recurrent,
    recurrent_kind="gated short convolutions",
    chat_template="chatml",
    layer=lfm2.layer,
)
