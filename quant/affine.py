"""MLX's affine quantization format: per group of `group_size` weights, w = scale * q + bias,
q an unsigned `bits`-bit integer packed little-endian into uint32 words along each row.

This module is numpy only (no mlx import): models load and write the format, backends upload it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InferError


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


BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


class AffineError(InferError, ValueError):
    """Bits, group size or shapes that MLX's affine format does not allow."""


def _check(bits: int, group_size: int, cols: int) -> None:
    if bits not in BITS:
        raise AffineError(f"affine quantization supports {', '.join(map(str, BITS))} bits, not {bits}")
    if group_size not in GROUP_SIZES:
        sizes = ", ".join(map(str, GROUP_SIZES))
        raise AffineError(f"affine quantization group size must be {sizes}, not {group_size}")
    if cols % group_size:
        raise AffineError(f"rows of {cols} values do not split into groups of {group_size}")


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) codes < 2**bits -> (rows, cols * bits // 32) uint32.

    MLX's layout for every width is one little-endian bit stream per row: code j occupies bits
    [j*bits, (j+1)*bits) of the row's bytes (for 3/5/6 bits, codes straddle byte and word edges).
    """
    q = np.asarray(q)
    rows, cols = q.shape
    if (cols * bits) % 32:
        raise AffineError(f"{cols} codes of {bits} bits do not fill whole 32-bit words")
    if bits == 8:
        return np.ascontiguousarray(q, dtype=np.uint8).view("<u4").astype(np.uint32, copy=False)
    if bits in (2, 4):
        per = 8 // bits
        g = np.asarray(q, dtype=np.uint8).reshape(rows, cols // per, per)
        packed = g[..., 0].copy()
        for i in range(1, per):  # an explicit loop: far faster than a ufunc reduce over 2-4 items
            packed |= g[..., i] << np.uint8(i * bits)
        return np.ascontiguousarray(packed).view("<u4").astype(np.uint32, copy=False)
    # 3, 5, 6 bits: 8 codes (3/5 bits) or 4 codes (6 bits) fill whole bytes; build those in a uint64.
    per = 4 if bits == 6 else 8
    nbytes = per * bits // 8
    g = np.asarray(q, dtype=np.uint64).reshape(rows, cols // per, per)
    word = g[..., 0].copy()
    for i in range(1, per):
        word |= g[..., i] << np.uint64(i * bits)
    out = np.empty((rows, cols // per, nbytes), dtype=np.uint8)
    for i in range(nbytes):
        out[..., i] = (word >> np.uint64(8 * i)) & np.uint64(0xFF)
    return np.ascontiguousarray(out.reshape(rows, -1)).view("<u4").astype(np.uint32, copy=False)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """(rows, words) uint32 -> (rows, words * 32 // bits) uint8 codes (the inverse of `pack`)."""
    packed = np.ascontiguousarray(packed, dtype="<u4")
    rows = packed.shape[0]
    raw = packed.view(np.uint8).reshape(rows, -1)
    if bits == 8:
        return raw.copy()
    if bits in (2, 4):
        per = 8 // bits
        shifts = (np.arange(per, dtype=np.uint8) * bits)
        return ((raw[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(rows, -1)
    per = 4 if bits == 6 else 8
    nbytes = per * bits // 8
    b = raw.reshape(rows, -1, nbytes).astype(np.uint64)
    word = np.zeros(b.shape[:2], dtype=np.uint64)
    for i in range(nbytes):
        word |= b[..., i] << np.uint64(8 * i)
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
    return ((word[..., None] >> shifts) & np.uint64((1 << bits) - 1)).astype(np.uint8).reshape(rows, -1)


def _round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded (nearest even) to float16 / bfloat16 and back: what a model stored in
    that dtype keeps of its scales and biases."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32)
    raise AffineError(f"scale dtype must be float32, float16 or bfloat16, not {dtype!r}")


def quantize_affine(x: np.ndarray, bits: int = 4, group_size: int = 64, scale_dtype: str = "float32") -> AffineTensor:
    """MLX's affine quantization (mx.quantize, mode 'affine') of a (rows, cols) float matrix.

    Per group: the scale spans [min, max] in 2**bits - 1 steps, signed so that the end with the
    larger magnitude is exactly representable (q = 0 there, bias = that end); the codes use the
    float32 scale and bias, which are then stored in `scale_dtype` (MLX keeps them in the weights'
    dtype, so quantizing float16 weights gives float16 scales). Identical to mx.quantize's codes,
    scales and biases for float32 input, and for float16/bfloat16 input with that scale_dtype.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise AffineError(f"affine quantization takes a matrix, got shape {x.shape}")
    rows, cols = x.shape
    _check(bits, group_size, cols)
    if not np.isfinite(x).all():
        raise AffineError("cannot quantize NaN or infinite weights")
    g = x.reshape(rows, cols // group_size, group_size)
    n_bins = np.float32((1 << bits) - 1)
    w_max, w_min = g.max(axis=2), g.min(axis=2)
    neg = np.abs(w_min) > np.abs(w_max)  # the larger-magnitude end is the minimum: positive scale
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7))
    scale = np.where(neg, scale, -scale)
    edge = np.where(neg, w_min, w_max)
    q0 = np.rint(edge / scale)
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(nz, edge / np.where(nz, q0, 1), scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.rint((g - bias[..., None]) / scale[..., None])
    q = np.clip(q, 0, n_bins).astype(np.uint8).reshape(rows, cols)
    return AffineTensor(pack(q, bits), _round_to(scale, scale_dtype), _round_to(bias, scale_dtype), bits, group_size)


def dequantize_affine(t: AffineTensor, rows: slice | None = None) -> np.ndarray:
    """float32 (rows, cols) = scale * q + bias per group (optionally only a slice of the rows)."""
    sel = rows if rows is not None else slice(None)
    packed, scales, biases = t.packed[sel], t.scales[sel], t.biases[sel]
    q = unpack(packed, t.bits).astype(np.float32)
    n, cols = q.shape
    q = q.reshape(n, cols // t.group_size, t.group_size)
    return (q * scales[..., None] + biases[..., None]).reshape(n, cols)
