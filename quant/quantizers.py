"""Numba quantization of float32 rows into GGML types, byte-identical to llama.cpp.

`quantize(type_id, x, imatrix)` produces what llama.cpp's `ggml_quantize_chunk` produces for the
same rows: without an importance matrix the `quantize_row_*_ref` reference quantizers, with one
the importance-weighted row quantizers (Q8_0 and MXFP4 ignore the matrix, as llama.cpp does).  The legacy
32-element types live here, the K-quants and the shared numerics in `kquantize.py`; the formats
and algorithms are llama.cpp's (ggml/src/ggml-quants.c).

F32, F16 and BF16 are conversions (round to nearest even; NaN/Inf are converted as ggml does).
The block types refuse non-finite input, and non-finite f16 scales (values too large for f16):
llama-quantize aborts on those, so quantize() raises ValueError and the caller names the tensor.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from infer.quant import types as qt
from infer.quant.dequant import e8m0_half, mxfp4_value
from infer.quant.halves import f32_to_bf16, f32_to_f16
from infer.quant.kquantize import (
    importance,
    make_qkx_quants,
    make_qx_quants,
    put_f16,
    quantize_row_q6_k,
    quantize_row_qk45,
)

__all__ = ["QUANTIZE_TYPES", "quantize", "quantize_rows"]

QUANTIZE_TYPES: frozenset[int] = frozenset(
    {qt.F32, qt.F16, qt.BF16, qt.Q4_0, qt.Q4_1, qt.Q5_0, qt.Q5_1, qt.Q8_0, qt.Q4_K, qt.Q5_K, qt.Q6_K, qt.MXFP4}
)

# Byte offsets of the f16 scale fields inside each block type's block (for the overflow check).
_F16_FIELDS = {qt.Q4_0: (0,), qt.Q4_1: (0, 2), qt.Q5_0: (0,), qt.Q5_1: (0, 2), qt.Q8_0: (0,),
               qt.Q4_K: (0, 2), qt.Q5_K: (0, 2), qt.Q6_K: (208,), qt.MXFP4: ()}


# --------------------------------------------------------------------------- F32 / F16 / BF16


@njit(cache=True)
def quantize_row_float(type_id, x, y):
    # x: (K,) float32; y: (4K,) for F32, (2K,) uint8 for F16/BF16, little-endian bits out
    n = x.shape[0]
    if type_id == 0:
        bits = x.view(np.uint32)
        for i in range(n):
            b = bits[i]
            for k in range(4):
                y[4 * i + k] = np.uint8((b >> np.uint32(8 * k)) & np.uint32(0xFF))
        return
    for i in range(n):
        h = f32_to_f16(x[i]) if type_id == 1 else f32_to_bf16(x[i])
        y[2 * i] = np.uint8(h & 0xFF)
        y[2 * i + 1] = np.uint8(h >> 8)


# --------------------------------------------------------------------------- legacy 32-element blocks


@njit(cache=True, inline="always")
def _sigma2(x):
    # x: (K,) float32; the row's mean square, the importance path's regulariser
    s = np.float32(0.0)
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s / np.float32(x.shape[0])


@njit(cache=True, inline="always")
def _store_qh(y, o, q5):
    # y: (n,) uint8; q5: (32,) int32 levels 0..31 -> qh (bit 4 of element j is bit j) at o, low
    # nibbles (element j low, j+16 high) at o+4
    qh = 0
    for j in range(16):
        qh |= ((q5[j] >> 4) & 1) << j
        qh |= ((q5[j + 16] >> 4) & 1) << (j + 16)
        y[o + 4 + j] = np.uint8((q5[j] & 0xF) | ((q5[j + 16] & 0xF) << 4))
    for k in range(4):
        y[o + k] = np.uint8((qh >> (8 * k)) & 0xFF)


@njit(cache=True)
def quantize_row_q8_0(x, y):
    # x: (K,) float32; y: (K/32*34,) uint8 out
    for b in range(x.shape[0] // 32):
        xo = 32 * b
        o = 34 * b
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, np.abs(x[xo + j]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        put_f16(y, o, d)
        for j in range(32):
            v = x[xo + j] * inv
            t = np.trunc(v)  # roundf: halves away from zero (v - t is exact)
            if np.abs(v - t) >= np.float32(0.5):
                t += np.float32(1.0) if v > 0 else np.float32(-1.0)
            y[o + 2 + j] = np.uint8(np.int64(t) & 0xFF)


@njit(cache=True)
def quantize_row_q40_q50(x, qw, y, nmax):
    # x: (K,) float32; qw: (K,) float32 or (0,); y: out, nmax 8 -> Q4_0 (18 B blocks), 16 -> Q5_0 (22 B)
    five = nmax == 16
    bs = 22 if five else 18
    q = np.empty(32, dtype=np.int32)
    w = np.empty(32, dtype=np.float32)
    has_w = qw.shape[0] > 0
    sigma2 = _sigma2(x) if has_w else np.float32(0.0)
    for b in range(x.shape[0] // 32):
        xo = 32 * b
        o = bs * b
        if has_w:
            importance(x, xo, qw, sigma2, w)
            put_f16(y, o, make_qx_quants(32, nmax, x, xo, q, w, 0))
        else:
            amax = np.float32(0.0)
            fmax = np.float32(0.0)
            for j in range(32):
                if amax < np.abs(x[xo + j]):  # strict: the first of equal magnitudes wins
                    amax = np.abs(x[xo + j])
                    fmax = x[xo + j]
            d = fmax / np.float32(-nmax)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            put_f16(y, o, d)
            half = np.float32(nmax) + np.float32(0.5)
            for j in range(32):
                # C truncates to int8 and clamps the top level only
                q[j] = min(2 * nmax - 1, np.int64(np.int8(np.int32(x[xo + j] * inv + half))))
        if five:
            _store_qh(y, o + 2, q)
        else:
            for j in range(16):
                y[o + 2 + j] = np.uint8((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4))


@njit(cache=True)
def quantize_row_q41_q51(x, qw, y, nmax):
    # x: (K,) float32; qw: (K,) float32 or (0,); y: out, nmax 15 -> Q4_1 (20 B blocks), 31 -> Q5_1 (24 B)
    five = nmax == 31
    bs = 24 if five else 20
    q = np.empty(32, dtype=np.int32)
    aux = np.empty(32, dtype=np.int32)
    w = np.empty(32, dtype=np.float32)
    has_w = qw.shape[0] > 0
    sigma2 = _sigma2(x) if has_w else np.float32(0.0)
    for b in range(x.shape[0] // 32):
        xo = 32 * b
        o = bs * b
        if has_w:
            importance(x, xo, qw, sigma2, w)
            d, neg_min = make_qkx_quants(32, nmax, x, xo, w, q, aux, np.float32(-0.9), np.float32(0.05), 36, True)
            put_f16(y, o, d)
            put_f16(y, o + 2, -neg_min)
        else:
            fmin = np.float32(3.4028234663852886e38)
            fmax = -fmin
            for j in range(32):
                v = x[xo + j]
                if v < fmin:
                    fmin = v
                if v > fmax:
                    fmax = v
            d = (fmax - fmin) / np.float32(nmax)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            put_f16(y, o, d)
            put_f16(y, o + 2, fmin)
            for j in range(32):
                l = np.int64(np.int32((x[xo + j] - fmin) * inv + np.float32(0.5)))
                # Q4_1 goes through int8 and clamps to 15; Q5_1 through uint8, unclamped
                q[j] = (l & 0xFF) if five else min(15, np.int64(np.int8(l)))
        if five:
            _store_qh(y, o + 4, q)
        else:
            for j in range(16):
                y[o + 4 + j] = np.uint8((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4))


# --------------------------------------------------------------------------- MXFP4


@njit(cache=True, inline="always")
def _mxfp4_code(x, d):
    # ggml's best_index_mxfp4: the first of the 16 codes c minimizing |kvalues_mxfp4[c] * d - x|,
    # errors in float32.  Only 8 can win: for x >= 0 an opposite-signed value's error
    # |v| + x rounds to >= x, code 0's, and so never beats code 0 (which comes first), and
    # likewise for x < 0; code 8 (also 0) comes after code 0.  So x's own sign's 7 codes and 0.
    base = 0 if x >= 0 else 8
    best = 0
    best_err = np.abs(np.float32(0.0) * d - x)
    for m in range(1, 8):
        c = base + m
        err = np.abs(np.float32(mxfp4_value(c)) * d - x)
        if err < best_err:
            best = c
            best_err = err
    return best


@njit(cache=True)
def quantize_row_mxfp4(x, y):
    # x: (K,) float32; y: (K/32*17,) uint8 out, blocks of [e, qs[16]] (ggml's quantize_row_mxfp4_ref)
    for b in range(x.shape[0] // 32):
        xo = 32 * b
        o = 17 * b
        amax = np.float32(0.0)
        for j in range(32):
            if amax < np.abs(x[xo + j]):
                amax = np.abs(x[xo + j])
        e = 0
        if amax > 0:
            # floorf(log2f(amax)): log2 in double rounded to float32 is what glibc's log2f returns
            # wherever it matters (a float just below a power of two, whose log2f rounds up to the
            # integer, ties being >= 0.004 ulp away); then C's (uint8_t) of the float, which x86
            # truncates through int32 (a subnormal amax wraps around, as there)
            lg = np.floor(np.float32(np.log2(np.float64(amax))))
            e = np.int64(np.int32(lg - np.float32(2.0) + np.float32(127.0))) & 0xFF
        d = e8m0_half(np.int32(e))
        y[o] = np.uint8(e)
        for j in range(16):
            lo = _mxfp4_code(x[xo + j], d)
            hi = _mxfp4_code(x[xo + 16 + j], d)
            y[o + 1 + j] = np.uint8(lo | (hi << 4))


# --------------------------------------------------------------------------- dispatch


@njit(cache=True)
def quantize_row(type_id, x, qw, y):
    # type_id: GGML type id; x: (K,) float32; qw: (K,) float32 or (0,) for none; y: (row_bytes,) uint8 out
    if type_id == 12:
        quantize_row_qk45(x, qw, y, 15)
    elif type_id == 14:
        quantize_row_q6_k(x, qw, y)
    elif type_id == 8:
        quantize_row_q8_0(x, y)
    elif type_id == 13:
        quantize_row_qk45(x, qw, y, 31)
    elif type_id == 2:
        quantize_row_q40_q50(x, qw, y, 8)
    elif type_id == 6:
        quantize_row_q40_q50(x, qw, y, 16)
    elif type_id == 3:
        quantize_row_q41_q51(x, qw, y, 15)
    elif type_id == 7:
        quantize_row_q41_q51(x, qw, y, 31)
    elif type_id == 39:
        quantize_row_mxfp4(x, y)
    else:
        quantize_row_float(type_id, x, y)


@njit(cache=True, parallel=True)
def quantize_rows(type_id, x, qw, y):
    # type_id: GGML type id; x: (rows, K) float32; qw: (K,) float32 or (0,); y: (rows, row_bytes) uint8 out
    for r in prange(x.shape[0]):
        quantize_row(type_id, x[r], qw, y[r])


@njit(cache=True, parallel=True)
def _all_finite(x):
    # x: (rows, K) float32; parallel so that the check costs little next to the quantization
    bad = 0
    for r in prange(x.shape[0]):
        for i in range(x.shape[1]):
            if not np.isfinite(x[r, i]):
                bad += 1
                break
    return bad == 0


def quantize(type_id: int, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """x: (rows, K) float32 (C-contiguous; any float array is converted); returns (rows, row_bytes(type_id, K))
    uint8, byte-identical to llama.cpp's ggml_quantize_chunk for the same input (with the importance
    matrix `imatrix`: (K,) float32 per-column weights, or None). Multi-threaded over rows (numba prange).
    Raises UnsupportedQuantType for types it cannot produce and ValueError when K is not a multiple of the block size."""
    t = qt.qtype(type_id)
    if t.id not in QUANTIZE_TYPES:
        names = ", ".join(qt.QTYPES[i].name for i in sorted(QUANTIZE_TYPES))
        raise qt.UnsupportedQuantType(f"cannot quantize to {t.name} (supported: {names})")
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"quantize: expected a (rows, K) array, got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, k = x.shape
    if k % t.block_size:
        raise ValueError(f"quantize: row length {k} is not a multiple of {t.name}'s block size {t.block_size}")
    if imatrix is None:
        qw = np.empty(0, dtype=np.float32)
    else:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.shape[0] != k:
            raise ValueError(f"quantize: importance matrix has {qw.shape[0]} values for rows of {k}")
    out = np.empty((rows, k // t.block_size * t.type_size), dtype=np.uint8)
    if rows * k == 0:
        return out
    block = t.block_size > 1
    if block and not _all_finite(x):
        raise ValueError(f"non-finite values (NaN or Inf) found: cannot quantize to {t.name}")
    quantize_rows(t.id, x, qw, out)
    if block:
        blocks = out.reshape(rows, k // t.block_size, t.type_size)
        for off in _F16_FIELDS[t.id]:
            h = blocks[:, :, off].astype(np.uint16) | (blocks[:, :, off + 1].astype(np.uint16) << 8)
            if ((h & 0x7C00) == 0x7C00).any():
                raise ValueError(
                    f"non-finite values found after quantizing to {t.name}: a block scale overflows f16 "
                    "(values too large)"
                )
    return out
