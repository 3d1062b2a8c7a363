"""LiquidAI LFM2 (llama.cpp's LLM_ARCH_LFM2): a hybrid of gated short-convolution layers and GQA
attention layers, each followed by the gated SiLU FFN, pre-norm throughout.

Which layer is which comes from `lfm2.attention.head_count_kv`, an array with a value per layer:
0 marks a short-convolution layer (llama.cpp's is_recr), the others are attention layers with Q/K
RMSNorm over each head and NeoX RoPE. A short-convolution layer (llama.cpp's
build_shortconv_block): in_proj to three n_embd-wide parts B, C, x; B * x; a depthwise causal
convolution of width L (`lfm2.shortconv.l_cache`) over time, the previous L - 1 inputs of the
sequence being its recurrent state; C times that; out_proj. The final norm's tensor is named
`token_embd_norm` (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2). llama.cpp's sliding-window variant
(`attention.sliding_window` > 0) and its bidirectional models (`attention.causal` false) are
refused here; the mixture of experts (lfm2moe) is an architecture of its own.
"""
from __future__ import annotations

from typing import Any, Callable

from ..limits import MAX_CONV_WIDTH
from .decoder import Primitives, dense_layer, ffn_block
from .spec import Architecture


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """The layers' kinds from the per-layer head_count_kv (a scalar: the same for every layer),
    the convolution's width, and the attention layers' one KV head count. ValueError for metadata
    that does not describe an lfm2 infer runs (ModelConfig.from_metadata makes it a ModelConfigError)."""
    if get("attention.sliding_window", 0):
        raise ValueError("a sliding window (attention.sliding_window) is not supported")
    if not get("attention.causal", True):  # LFM2's bidirectional embedding models: a centred convolution
        raise ValueError("non-causal attention (attention.causal false) is not supported")
    kv = get("attention.head_count_kv", None)
    if kv is None:
        raise ValueError("attention.head_count_kv is missing (a value per layer, 0 for a short convolution)")
    per_layer = [int(v) for v in kv] if hasattr(kv, "__len__") and not isinstance(kv, str) else [int(kv)] * n_layer
    if len(per_layer) != n_layer:
        raise ValueError(f"attention.head_count_kv has {len(per_layer)} values for {n_layer} layers")
    heads = {v for v in per_layer if v}
    if len(heads) != 1 or min(per_layer) < 0:
        raise ValueError(f"attention.head_count_kv {per_layer} must give the attention layers "
                               "one positive KV head count (and 0 to the short-convolution layers)")
    width = int(get("shortconv.l_cache", 0) or 0)
    if not 2 <= width <= MAX_CONV_WIDTH:
        raise ValueError(f"shortconv.l_cache {width} is out of range (2..{MAX_CONV_WIDTH})")
    return {"layer_recurrent": tuple(v == 0 for v in per_layer), "shortconv_l_cache": width,
            "n_head_kv": heads.pop()}


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """An attention layer as every dense decoder's; a short-convolution layer (a layer with
    shortconv_in products) in place of the attention."""
    if not ly.shortconv_in:
        return dense_layer(ops, ly, il, x, h, nxt)
    bcx = ops.linear(ly.shortconv_in, h, "shortconv_in_proj", il)
    y = ops.shortconv(bcx, ly, il)
    o = ops.linear(ly.shortconv_out, y, "shortconv_out_proj", il)
    return ffn_block(ops, ly, il, x, o, nxt)


ARCHITECTURE = Architecture(
    name="lfm2",
    rope_neox=True,
    qk_norm="head",
    output_norm_tensor="token_embd_norm",
    recurrent=recurrent,
    chat_template="chatml",
    layer=layer,
)
