"""Nomic BERT (nomic-embed-text v1 / v1.5; llama.cpp's src/models/nomic-bert.cpp, run by bert.cpp's
graph): an encoder for embeddings. bert's
post-norm encoder layer with RoPE (NeoX pairs) instead of position embeddings, a fused attn_qkv
without biases, and a SwiGLU FFN (ffn_gate, ffn_up, ffn_down) without biases."""
from __future__ import annotations

from .bert import encoder_layer
from .spec import Architecture

ARCHITECTURE = Architecture(
    name="nomic-bert",
    rope_neox=True,
    pre_norms=False,
    bert_norms=True,
    causal=False,
    output_norm_tensor="",
    extra_biases=("attn_output.bias", "attn_output_norm.bias", "layer_output_norm.bias"),
    optional_biases=("attn_output.bias",),
    attention_kind="bidirectional (an encoder)",
    layer=encoder_layer(gated=True),
)
