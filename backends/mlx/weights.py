"""Weights on the MLX device: GGML blocks mapped onto MLX's affine format, AffineTensors as they are.

MLX computes w = scale * q + bias per group of 32 (or 64, 128) weights, q unsigned.  Most GGML
types are that format with other field layouts, and map onto it exactly (scales and biases
kept as float32, so every product below is exact and mx.dequantize reproduces
infer.quant.dequant bit for bit, up to the sign of zeros):

    Q4_0  4-bit  scale d        bias -8d          (d*(q-8))
    Q4_1  4-bit  scale d        bias m
    Q5_0  5-bit  scale d        bias -16d
    Q5_1  5-bit  scale d        bias m
    Q8_0  8-bit  scale d        bias -128d        (q + 128 stored unsigned)
    Q4_K  4-bit  scale d*sc_j   bias -dmin*m_j    (one MLX group per 32-weight sub-block)
    Q5_K  5-bit  scale d*sc_j   bias -dmin*m_j

Q2_K, Q3_K and Q6_K scale sub-blocks of 16 weights, and MLX has no group of 16: they are
dequantized exactly and re-quantized (round to nearest, per group of 32 between its minimum and
maximum) with the bits of REQUANT_BITS.  Measured relative RMS error against the GGML weights,
on random blocks (every sub-block scale independent: the worst case):

    Q6_K -> 8-bit: 0.41%    Q3_K -> 6-bit: 1.2%    Q2_K -> 4-bit: 2.0%

and 0.47% on the embedded Gemma's Q6_K ffn_down weights, about a quarter of Q6_K's own rounding
(its step is ~7% of the weights' RMS).  Effect on the logits, against the same model with these
weights kept dense: 0.6-1.8% of max |logit| on the embedded Gemma (9 Q6_K layers; most of MLX's
distance from exact arithmetic), 0.3% on the tiny llama, 0.001% on the tiny qwen2 (tests/helpers/tiny_models).
Exactness would need each 16-weight sub-block in a group of its own (twice the products).
F32, F16 and BF16 matrices become dense float arrays.

MXFP4 is MLX's own "mxfp4" mode, bit for bit: MLX's 4-bit codes are OCP e2m1 (sign bit 3,
magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) and its uint8 scales E8M0 (2**(s - 127)) per group of 32;
ggml's kvalues_mxfp4 are those magnitudes doubled and its scale 2**(e - 128) is half of E8M0's,
so weight = e2m1(code) * 2**(e - 127) in both, for the same code and the same byte.  Only the
nibble order moves (ggml: element j in byte j's low nibble and j + 16 in its high one; MLX: a
little-endian stream, element j at bits 4j).  4.25 bits per weight on the device, as in the file,
and exact for every exponent (dequantized: equal as numbers, a zero's sign aside; e = 255, which
ggml's row validation refuses, is NaN to MLX and 2**127 to ggml).  Affine 5-bit (Q5_0's mapping)
would cost 5 bits plus a float scale and bias per 32, and lose the exponents f16 cannot hold on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from infer.quant import types as qt
from infer.quant.affine import AffineTensor, pack
from infer.quant.dequant import dequantize
from infer.quant.tensor import QTensor, StackedRows

GROUP = 32  # MLX group size every GGML mapping uses
REQUANT_BITS = {qt.Q6_K: 8, qt.Q3_K: 6, qt.Q2_K: 4}
EXACT_TYPES = (qt.Q4_0, qt.Q4_1, qt.Q5_0, qt.Q5_1, qt.Q8_0, qt.Q4_K, qt.Q5_K)
DENSE_TYPES = (qt.F32, qt.F16, qt.BF16)
_REQUANT_CHUNK = 1 << 22  # weights dequantized at once while re-quantizing (16 MiB of float32)


# ------------------------------------------------------------------------------ numpy: GGML -> affine


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """The f16 field at byte `off` of every block (rows, nb, size) -> (rows, nb) float32."""
    return np.ascontiguousarray(blocks[..., off:off + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles16(qs: np.ndarray) -> np.ndarray:
    """Legacy 4-bit layout: qs (..., 16) -> (..., 32), element j the low nibble of byte j, j+16 its high."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit (scale, min) pairs of Q4_K/Q5_K's 12 scale bytes (..., 12) -> two (..., 8) arrays."""
    lo, hi = s[..., 0:4], s[..., 4:8]
    sc = np.concatenate([lo & 63, (s[..., 8:12] & 15) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([hi & 63, (s[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), m.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """K-quant 4-bit layout: qs (..., 128) -> (..., 256): chunk c of 32 bytes holds elements
    64c .. 64c+31 in its low nibbles and 64c+32 .. 64c+63 in its high ones."""
    c = qs.reshape(*qs.shape[:-1], 4, 32)
    return np.stack([c & 15, c >> 4], axis=-2).reshape(*qs.shape[:-1], 256)


def _high_bits(qh: np.ndarray, n: int) -> np.ndarray:
    """Bit j of the little-endian u32 qh (..., 4 bytes) for j < n -> (..., n) uint8."""
    u = np.ascontiguousarray(qh).view(np.uint32)[..., 0]
    return ((u[..., None] >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def _exact(t: QTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(q (rows, n) uint8, scales, biases (rows, n // 32) float32, bits) of an exactly mapped type."""
    rows, n = t.rows, t.n
    info = qt.qtype(t.type_id)
    b = t.raw.reshape(rows, n // info.block_size, info.type_size)
    tid = t.type_id
    if tid == qt.Q8_0:
        d = _f16(b, 0)
        q = b[..., 2:34] ^ np.uint8(0x80)  # int8 q -> q + 128 as uint8 (two's complement)
        return q.reshape(rows, n), d, d * np.float32(-128), 8
    if tid in (qt.Q4_0, qt.Q4_1):
        d = _f16(b, 0)
        off = 2 if tid == qt.Q4_0 else 4
        q = _nibbles16(b[..., off:off + 16])
        bias = d * np.float32(-8) if tid == qt.Q4_0 else _f16(b, 2)
        return q.reshape(rows, n), d, bias, 4
    if tid in (qt.Q5_0, qt.Q5_1):
        d = _f16(b, 0)
        off = 2 if tid == qt.Q5_0 else 4
        q = _nibbles16(b[..., off + 4:off + 20]) | (_high_bits(b[..., off:off + 4], 32) << 4)
        bias = d * np.float32(-16) if tid == qt.Q5_0 else _f16(b, 2)
        return q.reshape(rows, n), d, bias, 5
    if tid in (qt.Q4_K, qt.Q5_K):
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, m = _k4_scales(b[..., 4:16])
        if tid == qt.Q4_K:
            q, bits = _k_nibbles(b[..., 16:144]), 4
        else:
            # bit 4 of element 32j + l is bit j of qh[l]
            qh = b[..., 16:48]
            hb = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (..., 8, 32)
            q, bits = _k_nibbles(b[..., 48:176]) | (hb.reshape(*qh.shape[:-1], 256) << 4), 5
        scales = (d[..., None] * sc).reshape(rows, n // GROUP)
        biases = -(dmin[..., None] * m).reshape(rows, n // GROUP)
        return q.reshape(rows, n), scales, biases, bits
    raise ValueError(f"{qt.qtype(tid).name} has no exact MLX mapping")


def requantize(x: np.ndarray, bits: int, group_size: int = GROUP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest affine quantization of float rows x (rows, n): per group, the range between
    its minimum and maximum in 2**bits - 1 steps.  Returns (q uint8, scales, biases float32).
    Not mx.quantize's scheme (quant.affine.quantize_affine, which makes the larger end exact and so
    gives up part of the range): on Q3_K blocks that one errs 1.44% against 1.24% here."""
    rows, n = x.shape
    g = x.reshape(rows, n // group_size, group_size)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = (hi - lo) / np.float32(2**bits - 1)
    safe = np.where(scale > 0, scale, np.float32(1))  # a constant group: every q is 0, the bias is the value
    q = np.clip(np.rint((g - lo[..., None]) / safe[..., None]), 0, 2**bits - 1).astype(np.uint8)
    return q.reshape(rows, n), scale.astype(np.float32), lo.astype(np.float32)


def mxfp4_codes(t: QTensor) -> tuple[np.ndarray, np.ndarray]:
    """An MXFP4 matrix as MLX's mxfp4 arrays: (codes packed as MLX packs 4 bits: (rows, n // 8)
    uint32, E8M0 scales: (rows, n // 32) uint8), the very bytes of the file reordered (module doc)."""
    b = t.raw.reshape(t.rows, t.n // 32, 17)
    q = np.concatenate([b[..., 1:] & 15, b[..., 1:] >> 4], axis=-1)  # (rows, nb, 32) in element order
    return pack(q.reshape(t.rows, t.n), 4), np.ascontiguousarray(b[..., 0])


def to_affine(t: QTensor) -> AffineTensor:
    """A GGML block-quantized matrix in MLX's affine format (exact, or re-quantized: see the module doc)."""
    if len(t.shape) != 2:
        raise ValueError(f"expected a matrix, got a tensor of shape {t.shape}")
    if t.type_id in EXACT_TYPES:
        q, scales, biases, bits = _exact(t)
        return AffineTensor(pack(q, bits), scales, biases, bits, GROUP)
    if t.type_id in REQUANT_BITS:
        bits = REQUANT_BITS[t.type_id]
        rows, n = t.rows, t.n
        packed = np.empty((rows, n * bits // 32), np.uint32)
        scales = np.empty((rows, n // GROUP), np.float32)
        biases = np.empty((rows, n // GROUP), np.float32)
        step = max(1, _REQUANT_CHUNK // n)
        for r in range(0, rows, step):  # in row chunks, so the float copy stays small
            x = dequantize(t.raw[r:r + step], t.type_id, (min(step, rows - r), n))
            q, scales[r:r + step], biases[r:r + step] = requantize(x, bits)
            packed[r:r + step] = pack(q, bits)
        return AffineTensor(packed, scales, biases, bits, GROUP)
    raise ValueError(f"the MLX backend cannot run tensors of GGML type {t.type_id}")


# ------------------------------------------------------------------------------ on the device


@dataclass(frozen=True, eq=False)
class Matrix:
    """A weight matrix (rows, cols) on the device: quantized (bits > 0: packed words, scales and,
    in mode "affine", biases; mode "mxfp4": uint8 E8M0 scales, no biases) or dense (bits == 0: w
    is the float matrix)."""

    w: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    group_size: int = 0
    mode: str = "affine"

    @property
    def rows(self) -> int:
        return self.w.shape[0]

    def matmul(self, x: mx.array) -> mx.array:
        """x (T, cols) -> x @ W.T (T, rows)."""
        if self.bits:
            return mx.quantized_matmul(x, self.w, self.scales, self.biases, transpose=True,
                                       group_size=self.group_size, bits=self.bits, mode=self.mode)
        return x @ self.w.T

    def take(self, ids: mx.array) -> mx.array:
        """Rows ids (T,) as floats (T, cols): the embedding lookup, dequantizing only those rows."""
        if self.bits:
            biases = None if self.biases is None else self.biases[ids]
            # mxfp4: no float scales to take the type from; float32, what the embedding is made
            dtype = mx.float32 if self.biases is None else None
            return mx.dequantize(self.w[ids], self.scales[ids], biases, group_size=self.group_size,
                                 bits=self.bits, mode=self.mode, dtype=dtype)
        return self.w[ids]

    def dense(self) -> mx.array:
        return self.take(mx.arange(self.rows))

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.w, self.scales, self.biases) if a is not None]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


def upload(t: QTensor | StackedRows | AffineTensor, dtype=mx.float32) -> Matrix:
    """A weight as a device Matrix; scales, biases and dense weights in dtype (the compute type)."""
    if isinstance(t, StackedRows):  # its rows copied whole for the upload (a transient copy)
        t = t.whole()
    if isinstance(t, AffineTensor):
        a = t
    elif t.type_id == qt.MXFP4:
        if len(t.shape) != 2:
            raise ValueError(f"expected a matrix, got a tensor of shape {t.shape}")
        codes, scales = mxfp4_codes(t)
        return Matrix(mx.array(codes), mx.array(scales), None, 4, 32, "mxfp4")
    elif t.type_id in DENSE_TYPES:
        x = t.raw.view(np.float32).reshape(t.shape) if t.type_id == qt.F32 else t.dequantize()
        return Matrix(mx.array(x, dtype=dtype))
    else:
        a = to_affine(t)
    return Matrix(mx.array(a.packed), mx.array(a.scales, dtype=dtype), mx.array(a.biases, dtype=dtype),
                  a.bits, a.group_size)


def stack(mats: list[Matrix]) -> Matrix | None:
    """One matrix with the rows of all (so Q, K and V, or gate and up, take one product), or None
    when they differ in format."""
    first = mats[0]
    if any(m.bits != first.bits or m.group_size != first.group_size or m.mode != first.mode
           or m.w.dtype != first.w.dtype or m.w.shape[1] != first.w.shape[1] for m in mats):
        return None
    if not first.bits:
        return Matrix(mx.concatenate([m.w for m in mats]))
    biases = None if first.biases is None else mx.concatenate([m.biases for m in mats])
    return Matrix(mx.concatenate([m.w for m in mats]), mx.concatenate([m.scales for m in mats]),
                  biases, first.bits, first.group_size, first.mode)
