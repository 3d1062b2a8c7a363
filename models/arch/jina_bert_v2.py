"""Jina BERT v2 (jina-embeddings-v2 small / base; llama.cpp's src/models/jina-bert-v2.cpp, run by
bert.cpp's graph): an encoder for embeddings. bert's post-norm layer with ALiBi instead of
positions (each head's scores minus slope * |p_q - p_k|, llama.cpp's slopes for a maximum bias of
8), Q and K LayerNorm'd where the file has their norms, and a GEGLU FFN: ffn_up holding gate then
up (2 n_ff rows, with its bias), or GELU(ffn_gate) * ffn_up beside it; biases as bert's."""
from __future__ import annotations

from .bert import BERT_BIASES, encoder_layer
from .spec import Architecture

ARCHITECTURE = Architecture(
    name="jina-bert-v2",
    rope_neox=False,
    pre_norms=False,
    activation="gelu",
    bert_norms=True,
    causal=False,
    alibi=True,
    output_norm_tensor="",
    extra_biases=BERT_BIASES,
    optional_biases=BERT_BIASES,
    attention_kind="bidirectional (an encoder) with ALiBi",
    layer=encoder_layer(gated=True),
)
