"""Tiny random-weight GGUFs of embedding models (encoders: non-causal attention), written with
gguf's writer as tiny_models.py writes the decoders (its random_tensor, vocabularies and common
keys), for comparing embeddings with llama.cpp's."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT

from .tiny_models import add_common_kvs, add_spm_vocab, random_tensor

# storage types of each encoder's tensors, a mix no other tiny model's test covers alike
ENCODER_TYPES = {
    "gemma-embedding": {"attn_q": GT.Q8_0, "attn_k": GT.Q4_K, "attn_v": GT.Q5_1, "attn_output": GT.Q6_K,
                        "ffn_gate": GT.Q5_K, "ffn_up": GT.Q8_0, "ffn_down": GT.Q4_0, "token_embd": GT.Q8_0,
                        "dense_2": GT.F16, "dense_3": GT.Q8_0},
}
# EmbeddingGemma's layer plan at a tiny size: pattern 6 (five sliding-window layers, then a global
# one), a window of 6 (3 keys either side: smaller than the tests' prompts, so it is exercised);
# dense_2's width when a file has the dense projections (EmbeddingGemma's: 3072, 4x n_embd)
GEMMA_EMBEDDING_LAYERS, GEMMA_EMBEDDING_WINDOW, GEMMA_EMBEDDING_DENSE = 6, 6, 512
POOLING_MEAN = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN, what EmbeddingGemma's converter writes


def write_tiny_gemma_embedding(path: Path, seed: int = 0, n_vocab: int = 320, n_ctx: int = 256,
                               dense: bool = False, pooling: int = POOLING_MEAN) -> Path:
    """A tiny EmbeddingGemma (llama.cpp's gemma-embedding); dense: with the sentence-transformers
    dense projections dense_2 (n_embd -> GEMMA_EMBEDDING_DENSE) and dense_3 (back) and their keys,
    as llama.cpp's converter writes them with --sentence-transformers-dense-modules."""
    arch = "gemma-embedding"
    types = ENCODER_TYPES[arch]
    rng = np.random.default_rng(seed)
    D, H, Hkv, hd, F = 256, 4, 2, 64, 512
    n_layer = GEMMA_EMBEDDING_LAYERS
    w = gguf.GGUFWriter(str(path), arch)
    add_common_kvs(w, arch, D, F, n_layer, H, Hkv, hd, n_ctx)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_sliding_window(GEMMA_EMBEDDING_WINDOW)
    w.add_pooling_type(gguf.PoolingType(pooling))
    if dense:
        for key, value in (("dense_2_feat_in", D), ("dense_2_feat_out", GEMMA_EMBEDDING_DENSE),
                           ("dense_3_feat_in", GEMMA_EMBEDDING_DENSE), ("dense_3_feat_out", D)):
            w.add_uint32(f"{arch}.{key}", value)
    add_spm_vocab(w, n_vocab)
    w.add_unk_token_id(0)

    def add(name: str, shape: tuple[int, ...], qtype: GT | None = None) -> None:
        if len(shape) == 1:  # norms stay F32
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shape)).astype(np.float32))
            return
        data, qt = random_tensor(rng, shape, qtype)
        if qt in (GT.F32, GT.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    add("token_embd.weight", (n_vocab, D), types["token_embd"])
    add("output_norm.weight", (D,))
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (D,))
        add(p + "attn_q.weight", (H * hd, D), types["attn_q"])
        add(p + "attn_k.weight", (Hkv * hd, D), types["attn_k"])
        add(p + "attn_v.weight", (Hkv * hd, D), types["attn_v"])
        add(p + "attn_q_norm.weight", (hd,))
        add(p + "attn_k_norm.weight", (hd,))
        add(p + "attn_output.weight", (D, H * hd), types["attn_output"])
        add(p + "post_attention_norm.weight", (D,))
        add(p + "ffn_norm.weight", (D,))
        add(p + "ffn_gate.weight", (F, D), types["ffn_gate"])
        add(p + "ffn_up.weight", (F, D), types["ffn_up"])
        add(p + "ffn_down.weight", (D, F), types["ffn_down"])
        add(p + "post_ffw_norm.weight", (D,))
    if dense:  # drawn last, so the rest equal the file without them
        add("dense_2.weight", (GEMMA_EMBEDDING_DENSE, D), types["dense_2"])
        add("dense_3.weight", (D, GEMMA_EMBEDDING_DENSE), types["dense_3"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
