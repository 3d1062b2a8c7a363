"""LiquidAI LFM2-MoE (LFM2-8B-A1B; llama.cpp's LLM_ARCH_LFM2MOE): lfm2's layers (lfm2.py: gated
short convolutions beside GQA attention, which is which read from attention.head_count_kv per
layer) with a mixture of experts for the FFN after the first `leading_dense_block_count` layers, which keep
lfm2's dense SiLU FFN. The router (llama.cpp's build_moe_ffn with the file's
expert_gating_func, sigmoid for every converted file): each expert's sigmoid of its logit; the top
expert_used_count experts chosen by that plus the layer's selection bias (`exp_probs_b`, which
only the choice sees); their sigmoids renormalized to sum 1 weight their SwiGLU FFNs of
expert_feed_forward_length.

From a Hugging Face folder (Lfm2MoeForCausalLM), as llama.cpp's converter (LFM2MoeModel): head_count_kv
per layer (0 where layer_types is not "full_attention"), num_dense_layers as the leading dense
count, sigmoid gating; each layer's experts (feed_forward.experts.E.w1/w2/w3) stacked, and
expert_bias renamed to exp_probs_b.bias. norm_topk_prob and routed_scaling_factor are not read
there (llama.cpp always renormalizes and never scales LFM2-MoE's weights), nor here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..hf_files import Kvs
from . import lfm2
from .hf_keys import generic_kvs, need
from .spec import Architecture

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, as its converter writes for every LFM2-MoE
_SIGMOID = 2


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """lfm2's layer kinds (lfm2.recurrent), and the router's gating checked here, where the raw
    metadata is read: ValueError unless it is sigmoid (llama.cpp requires the key; its converter
    writes sigmoid), the gating this architecture's moe_gating runs."""
    gating = get("expert_gating_func", None)
    if gating is None:
        raise ValueError("expert_gating_func is missing")
    if int(gating) != _SIGMOID:
        raise ValueError(f"expert_gating_func {gating} is not supported (2: sigmoid)")
    return lfm2.recurrent(get, n_layer)


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """The keys llama.cpp's converter writes for LFM2MoeModel: the common ones (norm_eps as the RMS
    epsilon), head_count_kv per layer, then the experts' width, the leading dense count, the
    sigmoid gating, vocab_size and shortconv.l_cache."""
    types = lfm2.layer_types(hp, path)
    width = int(need(hp, "conv_L_cache", path))
    extra = generic_kvs(kv, {**hp, "rms_norm_eps": need(hp, "norm_eps", path)}, path)
    lfm2.kv_heads_per_layer(kv, [t == "full_attention" for t in types])
    kv.u32("{arch}.expert_feed_forward_length", need(hp, "moe_intermediate_size", path))
    kv.u32("{arch}.leading_dense_block_count", need(hp, "num_dense_layers", path))
    kv.u32("{arch}.expert_gating_func", _SIGMOID)
    kv.u32("{arch}.vocab_size", need(hp, "vocab_size", path))
    kv.u32("{arch}.shortconv.l_cache", width)
    return extra


def hf_text_name(name: str) -> str:
    """A checkpoint tensor's name as the converter maps it: expert_bias with a .bias suffix (gguf's
    exp_probs_b.bias), and each expert's matrix without the model. prefix, so that the stacked
    name is the one its table has (layers.N.feed_forward.experts.w1.weight)."""
    if name.endswith(".feed_forward.expert_bias"):
        return name + ".bias"
    if ".feed_forward.experts." in name:
        return name.removeprefix("model.")
    return name


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
    hf_model_types=("lfm2_moe",),
    hf_class="Lfm2MoeForCausalLM",
    hf_kvs=hf_kvs,
    hf_text_name=hf_text_name,
    hf_conv_kernels=("conv.conv.weight",),
    hf_tied_default=True,
    chat_template="chatml",
    layer=lfm2.layer,
)
