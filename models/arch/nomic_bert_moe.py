"""Nomic BERT MoE (nomic-embed-text v2 moe, with XLM-R's Unigram vocabulary; llama.cpp's
src/models/nomic-bert-moe.cpp, run by bert.cpp's graph): nomic-bert's encoder layer (RoPE, fused
attn_qkv) with bert's GELU FFN and its biases, and every other layer a mixture of GELU experts
without a gate (ffn_up_exps, ffn_down_exps; a softmax router, the chosen experts' weights as they
are)."""
from __future__ import annotations

from typing import Any

from .bert import BERT_BIASES, encoder_layer
from .spec import Architecture


def layer_plan(get, n_layer: int, n_expert: int, n_ff_exp: int) -> dict[str, Any]:
    """Experts in the layers il % moe_every_n_layers == 1 (llama.cpp's): every other layer, the one
    step infer's plan takes ((il + 1) % 2 == 0 is the same layers); none without experts."""
    n = int(get("moe_every_n_layers", 0) or 0)
    if n_expert and n != 2:
        raise ValueError(f"moe_every_n_layers {n} is not supported (infer runs experts in every 2nd layer)")
    return {"n_moe_layer_step": 2} if n_expert else {}


ARCHITECTURE = Architecture(
    name="nomic-bert-moe",
    rope_neox=True,
    pre_norms=False,
    bert_norms=True,
    causal=False,
    ffn_gated=False,
    activation="gelu",
    experts="optional",
    moe_weights_from_file=True,
    output_norm_tensor="",
    extra_biases=BERT_BIASES,
    optional_biases=BERT_BIASES,
    layer_plan=layer_plan,
    layer_plan_kind="experts in every 2nd layer",
    attention_kind="bidirectional (an encoder)",
    layer=encoder_layer(gated=False),
)
