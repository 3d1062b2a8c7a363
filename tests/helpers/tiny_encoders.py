"""Tiny random-weight GGUFs of the BERT encoder family (llama.cpp's bert.cpp, nomic-bert.cpp), with
a real vocabulary taken from one of llama.cpp's vocabulary files (the WPM of bge, or XLM-R's
Unigram of nomic-bert-moe), so that llama.cpp embeds texts with them."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT

from infer.models.gguf_file import read_gguf

from .embeddings import POOLING_IDS
from .tiny_models import WEIGHT_STD, random_tensor

# "bert-xlmr": bert with XLM-R's Unigram vocabulary, as bge-m3 and bge-reranker-v2-m3 are
ENCODER_ARCHS = ("bert", "bert-xlmr", "nomic-bert", "nomic-bert-moe", "jina-bert-v2")
# each architecture's vocabulary: its file among llama.cpp's ggml-vocab-*.gguf
VOCAB_FILE = {"bert": "ggml-vocab-bert-bge.gguf", "bert-xlmr": "ggml-vocab-nomic-bert-moe.gguf",
              "nomic-bert": "ggml-vocab-bert-bge.gguf",
              "nomic-bert-moe": "ggml-vocab-nomic-bert-moe.gguf", "jina-bert-v2": "ggml-vocab-bert-bge.gguf"}
_TOKEN_IDS = ("bos", "eos", "unknown", "seperator", "padding", "cls", "mask")


def copy_vocabulary(w: gguf.GGUFWriter, vocab_path: Path, type_count: bool = True) -> tuple[int, int]:
    """The tokenizer keys of a vocabulary GGUF written into w; returns the token count and the
    token type count (the file's, else 2: BERT's), written unless not type_count."""
    meta = read_gguf(vocab_path).metadata
    tokens = list(meta["tokenizer.ggml.tokens"])
    w.add_tokenizer_model(str(meta["tokenizer.ggml.model"]))
    if "tokenizer.ggml.pre" in meta:
        w.add_tokenizer_pre(str(meta["tokenizer.ggml.pre"]))
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.scores" in meta:
        w.add_token_scores([float(s) for s in meta["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.precompiled_charsmap" in meta:
        w.add_precompiled_charsmap(bytes(np.asarray(meta["tokenizer.ggml.precompiled_charsmap"], np.uint8)))
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix", "remove_extra_whitespaces"):
        if f"tokenizer.ggml.{key}" in meta:
            w.add_bool(f"tokenizer.ggml.{key}", bool(meta[f"tokenizer.ggml.{key}"]))
    for key in _TOKEN_IDS:
        if f"tokenizer.ggml.{key}_token_id" in meta:
            w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(meta[f"tokenizer.ggml.{key}_token_id"]))
    n_types = int(meta.get("tokenizer.ggml.token_type_count", 2))
    if type_count:
        w.add_uint32("tokenizer.ggml.token_type_count", n_types)
    return len(tokens), n_types


def write_tiny_encoder(path: Path, arch: str, vocab_dir: Path, seed: int = 0, pooling: str = "mean",
                       n_ctx: int = 128, cls_head: bool = False, type_count: bool = True, moe_every: int = 2) -> Path:
    """A tiny `arch` encoder (2 layers of width 64, 4 heads) with the vocabulary of VOCAB_FILE[arch]
    from vocab_dir; pooling: its pooling_type; cls_head: a reranker's cls / cls.output tensors too;
    type_count: tokenizer.ggml.token_type_count written; moe_every: nomic-bert-moe's moe_every_n_layers.
    bert: separate Q/K/V in layer 0, a fused attn_qkv in layer 1 (llama.cpp takes either)."""
    rng = np.random.default_rng(seed)
    D, F, H, L = 64, 128, 4, 2
    vocab, arch = VOCAB_FILE[arch], arch.removesuffix("-xlmr")  # the GGUF architecture
    w = gguf.GGUFWriter(str(path), arch)
    n_vocab, n_types = copy_vocabulary(w, vocab_dir / vocab, type_count)
    rope = arch.startswith("nomic-bert")
    moe = arch == "nomic-bert-moe"
    w.add_name(f"tiny-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(POOLING_IDS[pooling]))
    if rope:
        w.add_rope_freq_base(1000.0)
    if moe:
        w.add_uint32(f"{arch}.moe_every_n_layers", moe_every)
        w.add_expert_count(4)
        w.add_expert_used_count(2)

    def matrix(name: str, rows: int, cols: int, qtype: GT = GT.F16) -> None:
        data, t = random_tensor(rng, (rows, cols), qtype)
        w.add_tensor(name, data, raw_dtype=t if t not in (GT.F32, GT.F16) else None)

    def vector(name: str, n: int, around: float = 0.0, std: float = 0.1) -> None:
        w.add_tensor(name, (around + rng.normal(0, std, n)).astype(np.float32))

    # the embeddings: larger than WEIGHT_STD so that the norm's input is not all bias
    w.add_tensor("token_embd.weight", rng.normal(0, 1.0, (n_vocab, D)).astype(np.float16))
    w.add_tensor("token_types.weight", rng.normal(0, 1.0, (n_types, D)).astype(np.float32))
    if arch == "bert":  # nomic's RoPE and jina's ALiBi need no positions
        w.add_tensor("position_embd.weight", rng.normal(0, 1.0, (n_ctx, D)).astype(np.float32))
    vector("token_embd_norm.weight", D, 1.0)
    vector("token_embd_norm.bias", D)
    biases = arch != "nomic-bert"
    for il in range(L):
        p = f"blk.{il}."
        # Q and K wider than the rest so that the attention is far from uniform
        if rope or il == 1:
            data = rng.normal(0, WEIGHT_STD, (3 * D, D)).astype(np.float32)
            data[:2 * D] *= 15
            data[2 * D:] *= 10
            w.add_tensor(p + "attn_qkv.weight", data.astype(np.float16))
            if biases:
                vector(p + "attn_qkv.bias", 3 * D)
        else:
            for name, scale in (("attn_q", 15), ("attn_k", 15), ("attn_v", 10)):
                w.add_tensor(p + name + ".weight", (rng.normal(0, WEIGHT_STD * scale, (D, D))).astype(np.float16))
                vector(p + name + ".bias", D)
            if arch == "jina-bert-v2":  # Q and K LayerNorm'd (the norms' weights about 2: scores far from uniform)
                for name in ("attn_q_norm", "attn_k_norm"):
                    vector(p + name + ".weight", D, 2.0, 0.3)
                    vector(p + name + ".bias", D)
        # the attention's output as large as the residual it joins: the tokens' mixing matters
        w.add_tensor(p + "attn_output.weight", gguf.quants.quantize(rng.normal(0, 0.15, (D, D)).astype(np.float32),
                                                                  GT.Q8_0), raw_dtype=GT.Q8_0)
        if biases:
            vector(p + "attn_output.bias", D)
        vector(p + "attn_output_norm.weight", D, 1.0)
        vector(p + "attn_output_norm.bias", D)
        if moe and il % 2 == 1:  # GELU experts without a gate, no biases
            w.add_tensor(p + "ffn_gate_inp.weight", rng.normal(0, 0.5, (4, D)).astype(np.float32))
            w.add_tensor(p + "ffn_up_exps.weight", rng.normal(0, 0.15, (4, F, D)).astype(np.float16))
            w.add_tensor(p + "ffn_down_exps.weight", rng.normal(0, 0.1, (4, D, F)).astype(np.float16))
        else:
            fused = arch == "jina-bert-v2" and il == 0  # GEGLU of one ffn_up, gate then up, and its bias
            w.add_tensor(p + "ffn_up.weight", rng.normal(0, 0.15, (2 * F if fused else F, D)).astype(np.float16))
            if arch == "nomic-bert" or arch == "jina-bert-v2" and il == 1:  # jina: GELU(gate) * up
                w.add_tensor(p + "ffn_gate.weight", rng.normal(0, 0.15, (F, D)).astype(np.float16))
            if arch != "nomic-bert":
                vector(p + "ffn_up.bias", 2 * F if fused else F)
            w.add_tensor(p + "ffn_down.weight", rng.normal(0, 0.1, (D, F)).astype(np.float32))
            if biases:
                vector(p + "ffn_down.bias", D)
        vector(p + "layer_output_norm.weight", D, 1.0)
        vector(p + "layer_output_norm.bias", D)
    if cls_head:
        matrix("cls.weight", D, D, GT.F32)
        vector("cls.bias", D)
        matrix("cls.output.weight", 1, D, GT.F32)
        vector("cls.output.bias", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
