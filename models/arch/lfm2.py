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
refused here; the mixture of experts (lfm2moe) is an architecture of its own (lfm2moe.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from ..limits import MAX_CONV_WIDTH
from .decoder import Primitives, dense_layer, ffn_block
from .hf_keys import generic_kvs, need
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


def _ff_width(hp: dict[str, Any], path: Path) -> int:
    """The FFN width as llama.cpp's converter computes it (LFM2Model._add_feed_forward_length):
    block_ff_dim (else intermediate_size), with block_auto_adjust_ff_dim two thirds of it, times
    block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of."""
    key = "block_ff_dim" if hp.get("block_ff_dim") is not None else "intermediate_size"
    ff = int(need(hp, key, path))  # the numbers checked already (hf_keys.check_hparams)
    if hp.get("block_auto_adjust_ff_dim"):
        ff = int(2 * ff / 3)
        mult = hp.get("block_ffn_dim_multiplier")
        if mult is not None:
            if not 0 < mult < 2**16:
                raise ConvertError(f"{path}: block_ffn_dim_multiplier {mult!r} is not a positive number")
            ff = int(mult * ff)
        multiple = int(need(hp, "block_multiple_of", path))
        if multiple < 1:
            raise ConvertError(f"{path}: block_multiple_of must be positive")
        ff = multiple * ((ff + multiple - 1) // multiple)
    return ff


def layer_types(hp: dict[str, Any], path: Path) -> list[str]:
    """config.json's layer_types (a name per layer: "conv", "full_attention"), checked; a
    bidirectional model refused."""
    n_layer = int(need(hp, "num_hidden_layers", path))
    types = need(hp, "layer_types", path)
    if not isinstance(types, list) or len(types) != n_layer or not all(isinstance(t, str) for t in types):
        raise ConvertError(f"{path}: layer_types must be a list of {n_layer} layer type names")
    if hp.get("is_causal") is False:
        raise ConvertError(f"{path}: a bidirectional lfm2 (is_causal false) is not supported")
    return types


def kv_heads_per_layer(kv: Kvs, attention: list[bool]) -> None:
    """generic_kvs's head_count_kv made an array with a value per layer, 0 for a short
    convolution, as the converter's LFM2 models write it."""
    key = f"{kv.arch}.attention.head_count_kv"
    at = next(i for i, item in enumerate(kv.items) if item[0] == key)
    n_kv = kv.items[at][2]
    kv.items[at] = (key, int(VT.ARRAY), np.array([n_kv if a else 0 for a in attention], np.int32))


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """What llama.cpp's converter writes for LFM2Model: the common keys with norm_eps as the RMS
    epsilon and its FFN width, head_count_kv per layer (0 for a "conv" layer of layer_types),
    vocab_size and shortconv.l_cache."""
    types = layer_types(hp, path)
    width = int(need(hp, "conv_L_cache", path))
    extra = generic_kvs(kv, {**hp, "rms_norm_eps": need(hp, "norm_eps", path), "intermediate_size": _ff_width(hp, path)},
                        path)
    kv_heads_per_layer(kv, [t != "conv" for t in types])
    kv.u32("{arch}.vocab_size", need(hp, "vocab_size", path))
    kv.u32("{arch}.shortconv.l_cache", width)
    return extra


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
    hf_model_types=("lfm2",),
    hf_class="Lfm2ForCausalLM",
    hf_kvs=hf_kvs,
    hf_conv_kernels=("conv.conv.weight",),
    hf_tied_default=True,
    qk_norm="head",
    output_norm_tensor="token_embd_norm",
    recurrent=recurrent,
    recurrent_kind="gated short convolutions",
    chat_template="chatml",
    layer=layer,
)
