"""The BERT family's own tensors (bert, nomic-bert, jina-bert-v2, modern-bert; llama.cpp's
bert.cpp): a layer's LayerNorms and FFN biases, and the embeddings' token types, positions and
LayerNorm. Apart from weights.py, which collects what every architecture shares and calls these
where Architecture.bert_norms says so."""
from __future__ import annotations

from typing import Any

import numpy as np

from .config import ModelConfig
from .matrix import ModelLoadError


def bert_layer(tensors, vec, p: str, cfg: ModelConfig, F: int, moe: bool) -> dict[str, Any]:
    """A BERT-family layer's LayerNorms, Q/K LayerNorms and FFN biases (llama.cpp's bert.cpp: the
    norms' biases required, the others optional; nomic-bert's gated FFN runs without biases, and a
    file with them is refused as having biases its architecture has no place for)."""
    D = cfg.n_embd
    out = {"attn_out_norm": vec(p + "attn_output_norm.weight", D),
           "attn_norm_2": vec(p + "attn_norm_2.weight", D, required=False),
           "attn_norm_2_b": vec(p + "attn_norm_2.bias", D, required=False), "attn_out_norm_b": vec(p + "attn_output_norm.bias", D),
            "layer_out_norm": vec(p + "layer_output_norm.weight", D),
            "layer_out_norm_b": vec(p + "layer_output_norm.bias", D),
            **({} if moe else _ffn_biases(tensors, vec, p, cfg, F)),
            **{f"{n}_layer_norm{b}": vec(f"{p}attn_{n}_norm.{w}", dim, required=False)
               for n, dim in (("q", cfg.n_head * cfg.head_dim), ("k", cfg.n_head_kv * cfg.head_dim))
               for b, w in (("", "weight"), ("_b", "bias"))}}
    for n in ("q_layer_norm", "k_layer_norm", "attn_norm_2"):  # a norm without its bias: a bias of zeros
        if out[n] is not None and out[n + "_b"] is None:
            out[n + "_b"] = np.zeros_like(out[n])
    return out


def _ffn_biases(tensors, vec, p: str, cfg: ModelConfig, F: int) -> dict[str, Any]:
    """A BERT-family FFN's biases, where its architecture has them (extra_biases) and the file too:
    up's (F,) of act(up); a gated FFN's (2F,), gate's then up's (jina-bert-v2: of its fused ffn_up,
    gate then up, or of ffn_up beside ffn_gate, then gate's zeros); down's (D,)."""
    if "ffn_up.bias" not in cfg.architecture.extra_biases:
        return {}
    D, name = cfg.n_embd, p + "ffn_up.bias"
    if not cfg.architecture.ffn_gated:
        up_b = vec(name, F, required=False)
    elif p + "ffn_gate.weight" in tensors:
        b = vec(name, F, required=False)
        up_b = None if b is None else np.concatenate([np.zeros(F, np.float32), b])
    else:
        up_b = vec(name, 2 * F, required=False)
    return {"up_b": up_b, "down_b": vec(p + "ffn_down.bias", D, required=False)}


def bert_embd(get, vec, cfg: ModelConfig) -> dict[str, Any]:
    """The BERT family's embedding tensors (token type 0's row, positions, their LayerNorm) and a
    reranker's classification head, where the file has one (llama.cpp's bert.cpp)."""
    D = cfg.n_embd
    if cfg.n_token_types <= 0:  # as llama.cpp, which refuses such a file
        raise ModelLoadError(f"{cfg.arch} model needs a positive tokenizer.ggml.token_type_count")
    types = vec("token_types.weight", (cfg.n_token_types, D), required=False)
    out: dict[str, Any] = {"token_embd_norm": vec("token_embd_norm.weight", D),
                           "token_embd_norm_b": vec("token_embd_norm.bias", D),
                           "token_type": None if types is None else np.ascontiguousarray(types[0])}
    if cfg.architecture.pos_embd:
        out["pos_embd"] = get("position_embd.weight", (cfg.n_ctx_train, D))
    return out
