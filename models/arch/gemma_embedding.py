"""EmbeddingGemma (llama.cpp's gemma-embedding): Gemma 3's layer (gemma3.py: embeddings scaled by
sqrt(n_embd), GELU, per-head Q/K norms, norms before and after attention and the FFN, Q scaled
before Q·K) as an encoder: non-causal attention (each token sees its whole input), the sliding
windows of five layers in six symmetric (a token sees the keys within sliding_window // 2 either
side), Q scaled by 1/sqrt(head_dim) whatever the size. It embeds (the file's pooling_type, mean for
EmbeddingGemma) and does not generate. A file converted with sentence-transformers' dense modules
also has dense_2 / dense_3, projections of the pooled vector (models/weights.py's dense_2, dense_3)."""
from __future__ import annotations

import math

from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    return {"embed_scale": math.sqrt(n_embd), "attn_scale": 1.0 / math.sqrt(head_dim)}


ARCHITECTURE = Architecture(
    name="gemma-embedding",
    rope_neox=True,
    qk_norm="head",
    post_norms=True,
    activation="gelu",
    swa_pattern=6,
    prescale_q=True,
    scalars=scalars,
    causal=False,
)
