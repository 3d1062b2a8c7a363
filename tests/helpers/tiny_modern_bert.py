"""A tiny random ModernBERT (llama.cpp's modern-bert) GGUF, as llama.cpp's converter writes one,
with gguf's writer: the reference tests compare its embeddings with llama.cpp's."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT

from .tiny_models import WEIGHT_STD, add_spm_vocab, random_tensor

# The layers: every 3rd global, the first of each three (llama.cpp's load_swa_pattern(ml, 3, true):
# global, local, local, global, local, local); the local layers' symmetric window of 8 positions
# (a token sees those within 4 of it), smaller than the tests' prompts
N_LAYER, SWA_PATTERN, WINDOW = 6, 3, 8
D, H, F = 256, 4, 512
# RoPE bases as ModernBERT-base's config: global_rope_theta, local_rope_theta
ROPE_BASE, ROPE_BASE_SWA = 160000.0, 10000.0
TYPES = {"token_embd": GT.F16, "attn_qkv": GT.Q8_0, "attn_output": GT.Q5_K, "ffn_up": GT.Q4_K,
         "ffn_down": GT.Q6_K, "cls": GT.F16, "cls.output": GT.F16}
POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS}


def write_tiny_modern_bert(path: Path, seed: int = 0, n_vocab: int = 320, pooling: str | None = "mean",
                           window: int = WINDOW, pattern: int | None = SWA_PATTERN, activation: str | None = "gelu",
                           head: int = 0, qkv_std: float = 0.1) -> Path:
    """A tiny random ModernBERT: pooling: its pooling_type ("mean", "cls"; None: none written);
    window: attention.sliding_window (0: none written, every layer global); pattern:
    attention.sliding_window_pattern (None: not written, llama.cpp's 3); activation:
    hidden_activation ("gelu": GeGLU, "silu": SwiGLU as Granite Embedding R2; None: not written,
    GeGLU); head: a reranker's classifier head with that many labels (cls, cls.norm, cls.output);
    qkv_std: the spread of attn_qkv's weights, wider than WEIGHT_STD so that the attention's
    softmax is far from uniform and the window moves the embeddings."""
    rng = np.random.default_rng(seed)
    hd = D // H
    w = gguf.GGUFWriter(str(path), "modern-bert")
    w.add_name("tiny-modern-bert")
    w.add_context_length(512)
    w.add_embedding_length(D)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_layer_norm_eps(1e-5)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(POOLING[pooling])
    w.add_rope_freq_base(ROPE_BASE)
    w.add_rope_freq_base_swa(ROPE_BASE_SWA)
    if window:
        w.add_sliding_window(window)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_vocab_size(n_vocab)
    if activation is not None:
        w.add_string("modern-bert.hidden_activation", activation)
    if head:
        w.add_array("modern-bert.classifier.output_labels", [f"label{i}" for i in range(head)])
    add_spm_vocab(w, n_vocab)
    w.add_unk_token_id(0)

    def add(name: str, shape: tuple[int, ...], qtype: GT | None = None, std: float = WEIGHT_STD) -> None:
        if len(shape) == 1:  # norms and biases stay F32
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shape)).astype(np.float32))
            return
        if qtype in _KQUANTS:
            data, qt = random_tensor(rng, shape, qtype)
        else:
            x = rng.normal(0, std, size=shape).astype(np.float32)
            data, qt = (x.astype(np.float16), GT.F16) if qtype == GT.F16 else (gguf.quants.quantize(x, qtype), qtype)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    add("token_embd.weight", (n_vocab, D), TYPES["token_embd"], std=1.0)  # LayerNorm'd next: any scale
    add("token_embd_norm.weight", (D,))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        if i:  # layer 0's attention norm is the identity (HF's nn.Identity): the converter writes none
            add(p + "attn_norm.weight", (D,))
        add(p + "attn_qkv.weight", (3 * H * hd, D), TYPES["attn_qkv"], std=qkv_std)
        add(p + "attn_output.weight", (D, H * hd), TYPES["attn_output"])
        add(p + "ffn_norm.weight", (D,))
        add(p + "ffn_up.weight", (2 * F, D), TYPES["ffn_up"])  # gate rows, then up rows
        add(p + "ffn_down.weight", (D, F), TYPES["ffn_down"])
    add("output_norm.weight", (D,))
    if head:
        add("cls.weight", (D, D), TYPES["cls"])
        add("cls.norm.weight", (D,))
        add("cls.output.weight", (head, D), TYPES["cls.output"])
        w.add_tensor("cls.output.bias", rng.normal(0, 0.1, size=head).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_KQUANTS = (GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K)
