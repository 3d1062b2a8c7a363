"""The GGUF metadata keys ModelConfig.from_metadata reads through more than a lookup: RoPE
scaling and YaRN's magnitude, the sliding-window pattern, the poolings, the shared experts' count,
and the bounds on the sizes it reads; with ModelConfigError, the error of metadata infer cannot
run. Apart from config.py, which holds ModelConfig itself and reads the plain keys."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from infer.quant.errors import InferError

from .limits import MAX_HEAD_DIM, MAX_LAYERS, MAX_WIDTH


class ModelConfigError(InferError, ValueError):
    """Metadata that does not describe a model infer can run."""


def read_rope_scale(get) -> float:
    """The RoPE position multiplier: 1 / the scaling factor of linear or YaRN scaling (others are
    refused). As llama.cpp: an absent rope.scaling.type is linear, and "none" never scales."""
    scaling = str(get("rope.scaling.type", "linear"))
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    if scaling not in ("none", "linear", "yarn") and factor not in (0.0, 1.0):
        raise ModelConfigError(f"RoPE scaling {scaling!r} is not supported (linear, yarn)")
    if not (math.isfinite(factor) and factor >= 0):
        raise ModelConfigError(f"rope.scaling.factor must be a positive number, got {factor}")
    return 1.0 / factor if factor > 0 and scaling != "none" else 1.0


def yarn_attn_factor(scale: float, attn_factor: float, log_mul: float = 0.0) -> float:
    """The magnitude llama.cpp hands its YaRN RoPE (llama_context's yarn_attn_factor, float32 as
    there): YaRN's 0.1 ln(factor) + 1 (over 0.1 log_mul ln(factor) + 1 where the architecture
    reads rope.scaling.yarn_log_multiplier: mistral3), divided by the same term that ggml's rope
    multiplies in again, times rope.scaling.attn_factor."""
    f32 = np.float32
    factor = f32(1.0) / f32(scale)

    def mscale_of(m: float) -> np.float32:
        return f32(f32(0.1) * f32(m)) * np.log(factor) + f32(1.0) if factor > 1 else f32(1.0)

    mscale = mscale_of(1.0) / mscale_of(log_mul) if log_mul else mscale_of(1.0)
    return float(f32(mscale * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor)))) * f32(attn_factor))


def swa_layers(pattern: Any, default: int, n_layer: int) -> tuple[bool, ...]:
    """Which layers are sliding-window, as llama.cpp reads attention.sliding_window_pattern: a flag per
    layer, or every n-th layer global (the last of each group of n; 0: none global); absent, the
    architecture's n."""
    if hasattr(pattern, "__len__") and not isinstance(pattern, str):
        if len(pattern) != n_layer:
            raise ModelConfigError(f"sliding_window_pattern has {len(pattern)} flags for {n_layer} layers")
        return tuple(bool(v) for v in pattern)
    n = int(pattern) if pattern is not None else default
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


# llama.cpp's enum llama_pooling_type as <arch>.pooling_type writes it: the poolings infer runs
# (none and -1 unspecified are not an embedding's; 4 rank is a reranker's: its classification
# head, models/pooling_head.py, on the pooled row)
POOLING_TYPES = {1: "mean", 2: "cls", 3: "last", 4: "rank"}


def pooling_cls(value: int, spec: Any) -> str:
    """Rank pooling's row from <arch>.classifier.pooling_type (llama.cpp's pooling_type_cls): "mean"
    where it says mean (1), the architecture's default where absent, else "" (the CLS row)."""
    return "mean" if value == 1 else spec.classifier_pooling if value == -1 else ""


def shared_count(arch: str, get) -> int:
    """expert_shared_count: how many shared experts (Architecture.shared_expert "counted") run as one."""
    n = int(get("expert_shared_count", 0))
    if not 0 <= n <= 64:
        raise ModelConfigError(f"{arch}: expert_shared_count {n} is out of range (0..64)")
    return n


def check_sizes(arch: str, n_layer: int, head_dim: int, head_dim_v: int, n_rot: int, n_ctx_train: int) -> None:
    """Bounds a hostile file could otherwise push into huge or empty buffers before any tensor is checked."""
    if not 1 <= n_layer <= MAX_LAYERS:
        raise ModelConfigError(f"{arch}: block_count {n_layer} is out of range (1..{MAX_LAYERS})")
    if not (1 <= head_dim <= MAX_HEAD_DIM and 1 <= head_dim_v <= MAX_HEAD_DIM):
        raise ModelConfigError(f"{arch}: head sizes {head_dim}/{head_dim_v} are out of range (1..{MAX_HEAD_DIM})")
    if not 2 <= n_rot <= head_dim or n_rot % 2:
        raise ModelConfigError(f"{arch}: rope.dimension_count {n_rot} must be even and in 2..{head_dim} (the head size)")
    if n_ctx_train < 1:
        raise ModelConfigError(f"{arch}: context_length {n_ctx_train} must be positive")


def check_widths(arch: str, n_embd: int, n_ff: int, n_ff_exp: int, n_ff_shexp: int) -> None:
    """Widths the runner sizes buffers by, some of them (a mixture of experts' dense n_ff) checked
    against no tensor."""
    for name, v in (("embedding_length", n_embd), ("feed_forward_length", n_ff),
                    ("expert_feed_forward_length", n_ff_exp), ("expert_shared_feed_forward_length", n_ff_shexp)):
        if not 0 <= v <= MAX_WIDTH:
            raise ModelConfigError(f"{arch}: {name} {v} is out of range (0..{MAX_WIDTH})")
