"""Numba dequantization of GGML rows (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4).

`dequant_row(type_id, src, dst)` is a plain njit function: call it from njit code (a matmul's
prange loop) to expand one row of raw GGUF bytes into float32.  `dequantize(raw, type_id, shape)`
is the Python entry point for whole tensors.  Results are bit-identical to
`gguf.quants.dequantize` (float32, multiplying left to right, no fused multiply-add), and MXFP4's
to llama.cpp's dequantize_row_mxfp4.  Every row function says fastmath=False: numba compiles a
function that does not say with the flags of the caller that compiles it first (the fastmath
reference matmul, backends/cpu/matmul.py), and caches that variant for every later caller.

The row functions never raise and never allocate.  A row whose sizes disagree is expanded only
as far as both arrays hold whole blocks (the rest of dst is left as it was); an unknown type id
fills dst with NaN.  Validate shapes and types before the hot loop (`dequantize` does).  A raise
in a row function would also cost speed: numba then keeps reference-count updates on src and
dst (atomic operations on the meminfo that all rows of a tensor share) around every call.

How the loops are written so that LLVM vectorizes them (checked on the generated assembly):
- Inner loops run over a trip count LLVM cannot see (`opaque32`).  A literal `range(32)` gets fully
  unrolled and then left scalar: the SLP vectorizer cannot prove that the uint8 source and the
  float32 destination do not overlap.  A real loop goes to the loop vectorizer instead, which
  checks the overlap at run time and emits 512-bit code (vpmovzxbd, vcvtdq2ps, vmulps).
- Each loop does as much of a block as it can (K-quants: 8 outputs per iteration), because the
  set-up around each vectorized loop costs about as much as one 16-lane iteration.
- numba widens integer arithmetic to int64.  `int_to_f32` converts through int32 and `shr` shifts
  right in the value's own width, so that LLVM can keep the vector code in 32-bit lanes.
- No array views in the row functions (a view takes a reference); F32/BF16 bits are
  reinterpreted with a bitcast intrinsic (`_as_f32`).
- f16 scales go through `F16_TO_F32`, a 65536-entry float32 table frozen into the code as a constant.

numba's on-disk cache does not follow calls into other modules: after editing kquants.py,
halves.py or lanes.py, delete quant/__pycache__/*.nbi and *.nbc, or dequant_row keeps the old code.
"""
from __future__ import annotations

from types import MappingProxyType

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from infer.quant import types as qt
from infer.quant.halves import F16_TO_F32, f16_at
from infer.quant.kquants import (
    dequant_row_q2_k,
    dequant_row_q3_k,
    dequant_row_q4_k,
    dequant_row_q5_k,
    dequant_row_q6_k,
)
from infer.quant.lanes import int_to_f32, opaque32, shr, u32_at
from infer.quant.static_type import StaticTypeType

__all__ = [
    "dequant_row",
    "dequant_rows",
    "dequant_static",
    "dequantize",
    "dequant_row_f32",
    "dequant_row_f16",
    "dequant_row_bf16",
    "dequant_row_q4_0",
    "dequant_row_q4_1",
    "dequant_row_q5_0",
    "dequant_row_q5_1",
    "dequant_row_q8_0",
    "dequant_row_mxfp4",
    "mxfp4_value",
    "e8m0_half",
    "dequant_row_q2_k",
    "dequant_row_q3_k",
    "dequant_row_q4_k",
    "dequant_row_q5_k",
    "dequant_row_q6_k",
]


# --------------------------------------------------------------------------- float types


@intrinsic
def _as_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (a bitcast: no array view, no copy)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if bits.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif bits.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(bits), codegen


@njit(cache=True, fastmath=False)
def dequant_row_f32(src, dst):
    # src: (4*n,) uint8, little-endian float32 bits; dst: (n,) float32
    n = min(dst.shape[0], src.shape[0] // 4)
    for i in range(n):
        dst[i] = _as_f32(
            np.uint32(src[4 * i])
            | (np.uint32(src[4 * i + 1]) << np.uint32(8))
            | (np.uint32(src[4 * i + 2]) << np.uint32(16))
            | (np.uint32(src[4 * i + 3]) << np.uint32(24))
        )


@njit(cache=True, fastmath=False)
def dequant_row_f16(src, dst):
    # src: (2*n,) uint8, little-endian f16 bits; dst: (n,) float32
    n = min(dst.shape[0], src.shape[0] // 2)
    for i in range(n):
        dst[i] = F16_TO_F32[np.int64(src[2 * i]) | (np.int64(src[2 * i + 1]) << 8)]


@njit(cache=True, fastmath=False)
def dequant_row_bf16(src, dst):
    # src: (2*n,) uint8, little-endian bf16 bits; dst: (n,) float32
    n = min(dst.shape[0], src.shape[0] // 2)
    for i in range(n):
        dst[i] = _as_f32((np.uint32(src[2 * i]) << np.uint32(16)) | (np.uint32(src[2 * i + 1]) << np.uint32(24)))


# --------------------------------------------------------------------------- legacy 32-element blocks


@njit(cache=True, fastmath=False)
def dequant_row_q4_0(src, dst):
    # src: (nb*18,) uint8, blocks of [d f16, qs[16]]; dst: (nb*32,) float32
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 18)
    if nb == 0:
        return
    h = opaque32(n, nb, 0) >> 1  # 16
    for b in range(nb):
        o = b * 18
        t = b * 32
        d = f16_at(src, o)
        for j in range(h):
            x = src[o + 2 + j]
            dst[t + j] = d * int_to_f32((x & 15) - 8)
            dst[t + 16 + j] = d * int_to_f32(shr(x, 4) - 8)


@njit(cache=True, fastmath=False)
def dequant_row_q4_1(src, dst):
    # src: (nb*20,) uint8, blocks of [d f16, m f16, qs[16]]; dst: (nb*32,) float32
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 20)
    if nb == 0:
        return
    h = opaque32(n, nb, 0) >> 1  # 16
    for b in range(nb):
        o = b * 20
        t = b * 32
        d = f16_at(src, o)
        m = f16_at(src, o + 2)
        for j in range(h):
            x = src[o + 4 + j]
            dst[t + j] = d * int_to_f32(x & 15) + m
            dst[t + 16 + j] = d * int_to_f32(shr(x, 4)) + m


@njit(cache=True, fastmath=False)
def dequant_row_q5_0(src, dst):
    # src: (nb*22,) uint8, blocks of [d f16, qh u32, qs[16]]; dst: (nb*32,) float32
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 22)
    if nb == 0:
        return
    h = opaque32(n, nb, 0) >> 1  # 16
    for b in range(nb):
        o = b * 22
        t = b * 32
        d = f16_at(src, o)
        qh = u32_at(src, o + 2)  # bit j: bit 4 of element j
        for j in range(h):
            x = src[o + 6 + j]
            lo = (x & 15) | ((shr(qh, j) & 1) << 4)
            hi = shr(x, 4) | ((shr(qh, j + 16) & 1) << 4)
            dst[t + j] = d * int_to_f32(lo - 16)
            dst[t + 16 + j] = d * int_to_f32(hi - 16)


@njit(cache=True, fastmath=False)
def dequant_row_q5_1(src, dst):
    # src: (nb*24,) uint8, blocks of [d f16, m f16, qh u32, qs[16]]; dst: (nb*32,) float32
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 24)
    if nb == 0:
        return
    h = opaque32(n, nb, 0) >> 1  # 16
    for b in range(nb):
        o = b * 24
        t = b * 32
        d = f16_at(src, o)
        m = f16_at(src, o + 2)
        qh = u32_at(src, o + 4)  # bit j: bit 4 of element j
        for j in range(h):
            x = src[o + 8 + j]
            lo = (x & 15) | ((shr(qh, j) & 1) << 4)
            hi = shr(x, 4) | ((shr(qh, j + 16) & 1) << 4)
            dst[t + j] = d * int_to_f32(lo) + m
            dst[t + 16 + j] = d * int_to_f32(hi) + m


@njit(cache=True, fastmath=False)
def dequant_row_q8_0(src, dst):
    # src: (nb*34,) uint8, blocks of [d f16, qs int8[32]]; dst: (nb*32,) float32
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 34)
    if nb == 0:
        return
    k = opaque32(n, nb, 0)  # 32
    for b in range(nb):
        o = b * 34
        t = b * 32
        d = f16_at(src, o)
        for j in range(k):
            dst[t + j] = d * int_to_f32(np.int8(src[o + 2 + j]))


# --------------------------------------------------------------------------- MXFP4


@njit(cache=True, inline="always")
def mxfp4_value(c):
    # c: a 4-bit e2m1 code -> ggml's kvalues_mxfp4[c] (the e2m1 value doubled, an integer):
    # 0, 1, 2, 3, 4, 6, 8, 12 for magnitudes 0..7, negated when bit 3 is set (code 8 is 0).
    # Arithmetic rather than a table, so that the loop vectorizes (selects, no gathers).
    m = c & 7
    mag = m if m < 4 else (2 | (m & 1)) << (((m >> 1) - 1) & 3)  # & 3: no negative shift in the unused arm
    return -mag if c & 8 else mag


@njit(cache=True, inline="always")
def e8m0_half(e):
    # e: an E8M0 exponent byte -> ggml's GGML_E8M0_TO_FP32_HALF(e) = 2**(e - 128) as float32 bits
    # (e < 2: the subnormals 2**-128, 2**-127; 255 gives 2**127, not the NaN of the OCP spec, as ggml)
    return _as_f32(np.uint32(0x00200000) << np.uint32(e) if e < 2 else np.uint32(e - 1) << np.uint32(23))


@njit(cache=True, fastmath=False)
def dequant_row_mxfp4(src, dst):
    # src: (nb*17,) uint8, blocks of [e u8, qs[16]]; dst: (nb*32,) float32
    # weight = kvalues_mxfp4[code] * 2**(e - 128): element j in qs[j]'s low nibble, j+16 in its high
    n = dst.shape[0]
    nb = min(n // 32, src.shape[0] // 17)
    if nb == 0:
        return
    h = opaque32(n, nb, 0) >> 1  # 16
    for b in range(nb):
        o = b * 17
        t = b * 32
        d = e8m0_half(np.int32(src[o]))
        for j in range(h):
            x = np.int32(src[o + 1 + j])
            dst[t + j] = int_to_f32(mxfp4_value(x & 15)) * d
            dst[t + 16 + j] = int_to_f32(mxfp4_value(x >> 4)) * d


# --------------------------------------------------------------------------- dispatch


@njit(cache=True, fastmath=False)
def dequant_row(type_id, src, dst):
    # type_id: GGML type id; src: (row_bytes,) uint8 C-contiguous, raw bytes of one row;
    # dst: (n,) float32, written in place
    if type_id == 8:
        dequant_row_q8_0(src, dst)
    elif type_id == 12:
        dequant_row_q4_k(src, dst)
    elif type_id == 14:
        dequant_row_q6_k(src, dst)
    elif type_id == 13:
        dequant_row_q5_k(src, dst)
    elif type_id == 2:
        dequant_row_q4_0(src, dst)
    elif type_id == 6:
        dequant_row_q5_0(src, dst)
    elif type_id == 3:
        dequant_row_q4_1(src, dst)
    elif type_id == 7:
        dequant_row_q5_1(src, dst)
    elif type_id == 10:
        dequant_row_q2_k(src, dst)
    elif type_id == 11:
        dequant_row_q3_k(src, dst)
    elif type_id == 39:
        dequant_row_mxfp4(src, dst)
    elif type_id == 0:
        dequant_row_f32(src, dst)
    elif type_id == 1:
        dequant_row_f16(src, dst)
    elif type_id == 30:
        dequant_row_bf16(src, dst)
    else:  # unknown type: NaN rather than a raise (see the module docstring)
        for i in range(dst.shape[0]):
            dst[i] = np.float32(np.nan)


ROW_FUNCTIONS = MappingProxyType({
    qt.Q8_0: dequant_row_q8_0, qt.Q4_K: dequant_row_q4_k, qt.Q6_K: dequant_row_q6_k, qt.Q5_K: dequant_row_q5_k,
    qt.Q4_0: dequant_row_q4_0, qt.Q5_0: dequant_row_q5_0, qt.Q4_1: dequant_row_q4_1, qt.Q5_1: dequant_row_q5_1,
    qt.Q2_K: dequant_row_q2_k, qt.Q3_K: dequant_row_q3_k, qt.MXFP4: dequant_row_mxfp4, qt.F32: dequant_row_f32,
    qt.F16: dequant_row_f16, qt.BF16: dequant_row_bf16,
})  # dequant_row's branches, by type id


def dequant_static(key, src, dst):
    """dequant_row for njit code, the type a StaticType: a caller compiles its own type's row
    function only, not dequant_row's every branch (quant/static_type.py)."""
    raise NotImplementedError("dequant_static is called from njit code")


@overload(dequant_static)
def _dequant_static(key, src, dst):
    if not isinstance(key, StaticTypeType):
        return None
    row = ROW_FUNCTIONS.get(key.id)
    if row is None:  # as dequant_row: NaN for an unknown type
        return lambda key, src, dst: dst.fill(np.float32(np.nan))
    return lambda key, src, dst: row(src, dst)


@njit(cache=True, parallel=True)
def dequant_rows(type_id, src, dst):
    # type_id: GGML type id; src: (rows, row_bytes) uint8; dst: (rows, n) float32, written in place
    for r in prange(src.shape[0]):
        dequant_row(type_id, src[r], dst[r])


def dequantize(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize a whole tensor: raw GGUF bytes (any shape) -> float32 array of `shape`.

    `shape` is the numpy shape of the result; its last dimension is the row length.
    """
    t = qt.qtype(type_id)  # raises UnsupportedQuantType for unknown ids
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        raise ValueError("dequantize: shape must have at least one dimension")
    if any(s < 0 for s in shape):
        raise ValueError(f"dequantize: negative dimension in shape {shape}")
    n = shape[-1]
    if n % t.block_size:
        raise ValueError(
            f"dequantize: row length {n} (last dimension of {shape}) is not a multiple of "
            f"{t.name}'s block size {t.block_size}"
        )
    rows = 1
    for s in shape[:-1]:
        rows *= s
    row_bytes = n // t.block_size * t.type_size
    raw = np.asarray(raw)
    if raw.nbytes != rows * row_bytes:
        raise ValueError(
            f"dequantize: {t.name} tensor of shape {shape} needs {rows * row_bytes} bytes "
            f"({rows} rows x {row_bytes} bytes), got {raw.nbytes}"
        )
    out = np.empty((rows, n), dtype=np.float32)
    if rows * n == 0:
        return out.reshape(shape)
    src = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(rows, row_bytes)
    dequant_rows(t.id, src, out)
    return out.reshape(shape)
