"""Microsoft Phi-3 / Phi-4 (dense): the llama layer with Q, K, V in one fused matrix (attn_qkv) and
gate and up in one (ffn_up, gate first), RoPE on (x[i], x[i + d/2]) pairs. The 128k models use
LongRoPE: per-frequency factors, short ones within the context they were trained at, long ones
beyond (models/weights.py Model.for_context), and cos/sin scaled by rope.scaling.attn_factor.
Their sliding window is ignored, as llama.cpp (this version) does: it disables Phi's SWA."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import ConvertError, Kvs, read_json
from .hf_keys import head_counts, need, rope_scaling, rope_theta
from .spec import Architecture


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """llama.cpp's Phi3MiniModel keys and LongRoPE tensors, for the folders infer converts: a
    GPT2Tokenizer vocabulary (Phi-4, Phi-4-mini; Phi-3's SentencePiece one has its own rules there)."""
    tok_cfg = path.parent / "tokenizer_config.json"
    tok_class = read_json(tok_cfg, "tokenizer config").get("tokenizer_class") if tok_cfg.is_file() else None
    if tok_class != "GPT2Tokenizer":
        raise ConvertError(f"{path}: phi3 folders with a SentencePiece tokenizer (Phi-3) are not converted yet; "
                           "Phi-4's (GPT2Tokenizer) are")
    n_embd = int(need(hp, "hidden_size", path))
    n_head, n_head_kv = head_counts(hp, path)
    n_ctx = need(hp, "max_position_embeddings", path)
    kv.u32("{arch}.context_length", n_ctx)
    kv.u32("{arch}.rope.scaling.original_context_length", hp.get("original_max_position_embeddings") or n_ctx)
    kv.u32("{arch}.embedding_length", n_embd)
    kv.u32("{arch}.feed_forward_length", need(hp, "intermediate_size", path))
    kv.u32("{arch}.block_count", need(hp, "num_hidden_layers", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", need(hp, "rms_norm_eps", path))
    n_rot = int(float(hp.get("partial_rotary_factor", 1.0)) * n_embd) // n_head
    kv.u32("{arch}.rope.dimension_count", n_rot)
    kv.f32("{arch}.rope.freq_base", rope_theta(hp, 10000.0))
    kv.u32("{arch}.attention.sliding_window", hp.get("sliding_window") or 0)
    return _longrope(kv, hp, path, n_rot)


def _longrope(kv: Kvs, hp: dict[str, Any], path: Path, n_rot: int) -> dict[str, np.ndarray]:
    """LongRoPE's two factor tensors and its cos/sin magnitude, as llama.cpp's converter writes them
    (sqrt(1 + ln(scale) / ln(original context)) for scale = context / original context > 1)."""
    rs = rope_scaling(hp) or {}
    if rs.get("long_factor") is None:
        return {}
    if rs["rope_type"] not in ("su", "longrope"):
        raise ConvertError(f"{path}: phi3 RoPE scaling {rs['rope_type']!r} is not supported (longrope)")
    long, short = (np.asarray(rs.get(k) or [], np.float32) for k in ("long_factor", "short_factor"))
    if not len(long) == len(short) == n_rot // 2:
        raise ConvertError(f"{path}: LongRoPE needs {n_rot // 2} long and short factors, got {len(long)} and {len(short)}")
    orig = float(hp.get("original_max_position_embeddings") or rs.get("original_max_position_embeddings") or 0)
    scale = float(need(hp, "max_position_embeddings", path)) / orig if orig else 1.0
    kv.f32("{arch}.rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
    return {"rope_factors_long.weight": long, "rope_factors_short.weight": short}


ARCHITECTURE = Architecture(
    name="phi3",
    rope_neox=True,
    prescale_q=True,  # Q times 1/sqrt(head_dim) before Q·K, as llama.cpp's phi3 graph
    hf_model_types=("phi3",),
    hf_class="Phi3ForCausalLM",
    hf_kvs=hf_kvs,
    chat_template="phi3",
)
