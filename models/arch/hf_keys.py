"""config.json hyperparameters -> the GGUF keys llama.cpp's converter (convert_hf_to_gguf.py) writes.

`generic_kvs` is its TextModel path, which most architectures take as is; an architecture module
adds its own keys after it, or (gemma3) writes its own set.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs


def need(hp: dict[str, Any], key: str, path: Path) -> Any:
    if hp.get(key) is None:
        raise ConvertError(f"{path}: missing hyperparameter {key!r}")
    return hp[key]


def rope_scaling(hp: dict[str, Any]) -> dict[str, Any] | None:
    # transformers >= 4.56 renamed rope_scaling to rope_parameters (which also carries rope_theta)
    rs = hp.get("rope_scaling") or hp.get("rope_parameters")
    if not isinstance(rs, dict):
        return None
    kind = rs.get("rope_type", rs.get("type"))
    return None if kind in (None, "default") else {**rs, "rope_type": kind}


def rope_theta(hp: dict[str, Any], default: float | None) -> float | None:
    if hp.get("rope_theta") is not None:
        return float(hp["rope_theta"])
    rp = hp.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return default


def llama3_rope_factors(rs: dict[str, Any], base: float, n_rot: int) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's RoPE scaling (Meta's published rule): low frequencies
    are stretched by `factor`, high ones kept, the band between interpolated. llama.cpp takes them
    as the rope_freqs tensor."""
    factor = float(rs.get("factor", 8.0))
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    out = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, out)
    out = np.where(wavelen > old_ctx / low, factor, out)
    return out.astype(np.float32)


def head_counts(hp: dict[str, Any], path: Path) -> tuple[int, int]:
    n_head = int(need(hp, "num_attention_heads", path))
    n_head_kv = int(hp.get("num_key_value_heads") or n_head)
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ConvertError(f"{path}: head counts {n_head}/{n_head_kv} are not a valid grouped-query layout")
    return n_head, n_head_kv


def generic_kvs(kv: Kvs, hp: dict[str, Any], path: Path, llama: bool = False) -> dict[str, np.ndarray]:
    """The converter's common keys; llama: also what its LlamaModel adds (vocab_size, the RoPE
    dimension count, Llama 3.1's rope_freqs). Returns the tensors made from the config, by name."""
    n_embd = int(need(hp, "hidden_size", path))
    n_head, n_head_kv = head_counts(hp, path)
    head_dim = hp.get("head_dim")
    n_ctx = next((hp[k] for k in ("max_position_embeddings", "n_ctx", "n_positions", "max_length")
                  if hp.get(k) is not None), None)
    if n_ctx is not None:
        kv.u32("{arch}.context_length", n_ctx)
    kv.u32("{arch}.embedding_length", n_embd)
    kv.u32("{arch}.block_count", need(hp, "num_hidden_layers", path))
    kv.u32("{arch}.feed_forward_length", need(hp, "intermediate_size", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    theta = rope_theta(hp, None)
    if theta is not None:
        kv.f32("{arch}.rope.freq_base", theta)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", need(hp, "rms_norm_eps", path))
    if head_dim is not None:
        kv.u32("{arch}.attention.key_length", head_dim)
        kv.u32("{arch}.attention.value_length", head_dim)
    n_rot = int(head_dim) if head_dim is not None else n_embd // n_head
    n_expert = hp.get("num_local_experts", hp.get("num_experts"))
    if n_expert:  # a mixture of experts (the converter's TextModel writes these for any architecture)
        kv.u32("{arch}.expert_count", n_expert)
        kv.u32("{arch}.expert_used_count", need(hp, "num_experts_per_tok", path))
    if llama:
        kv.u32("{arch}.vocab_size", need(hp, "vocab_size", path))
        kv.u32("{arch}.rope.dimension_count", n_rot)
    rope_factors = None
    rs = rope_scaling(hp)
    if rs is not None:
        kind = rs["rope_type"]
        if kind == "llama3" and llama:
            rope_factors = llama3_rope_factors(rs, theta if theta is not None else 10000.0, n_rot)
        elif kind in ("linear", "yarn"):
            kv.add("{arch}.rope.scaling.type", VT.STRING, kind)
            kv.f32("{arch}.rope.scaling.factor", rs["factor"])
            if kind == "yarn" and rs.get("original_max_position_embeddings") is not None:
                kv.u32("{arch}.rope.scaling.original_context_length", rs["original_max_position_embeddings"])
        else:
            raise ConvertError(f"{path}: {kv.arch} RoPE scaling {kind!r} is not supported (linear, yarn, llama3)")
    return {} if rope_factors is None else {"rope_freqs.weight": rope_factors}
