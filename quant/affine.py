"""MLX's affine quantization format: per group of `group_size` weights, w = scale * q + bias,
q an unsigned `bits`-bit integer packed little-endian into uint32 words along each row.

This module is numpy only (no mlx import): models load and write the format, backends upload it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class AffineTensor:
    """A (rows, cols) matrix in MLX's affine format; scales and biases kept as float32 (exact for
    MLX files' float16/bfloat16 and for GGML block scales products)."""

    packed: np.ndarray  # (rows, cols * bits // 32) uint32
    scales: np.ndarray  # (rows, cols // group_size) float32
    biases: np.ndarray  # (rows, cols // group_size) float32
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 32 // self.bits
