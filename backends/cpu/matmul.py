"""Products of activations with weights kept in their GGML block types.

Block-quantized weights (Q4_0 .. Q8_0, Q2_K .. Q6_K) are repacked once into int8 tiles
(repack.py) and multiplied as llama.cpp does, with 8-bit activations and exact integer block
dots (qdot.py; on CPUs with AVX-512 VNNI, integer dot instructions with bit-identical results).
Weights kept as they are (F32, F16, BF16, or any type not repacked) take the reference path: the
activations are rounded as llama.cpp rounds them for that type, then small batches dequantize
one weight row at a time into a per-thread buffer and dot it with every activation row; large batches dequantize the whole matrix once and hand the product to BLAS.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from infer.quant.dequant import dequant_row, dequant_rows

from .ops import f16_round
from .qdot import TT_MAX, matmul_packed
from .repack import ACT_BF16, ACT_F16, ACT_NONE, ACT_Q8_0, ACT_ROUNDING, NC, PackedWeight

# Reference path: above this many activation rows, dequantize-then-BLAS beats the fused row kernel.
BLAS_MIN_ROWS = 16
ROW_TILE = 4  # weight rows dequantized together so each activation row is reused from L1


@njit(cache=True, fastmath=True, parallel=True)
def qmatmul_rows(type_id, w, x, out, scratch):
    # w: (N, row_bytes) uint8 raw weight rows; x: (T, K) f32; out: (T, N) f32 = x @ W.T
    # scratch: (n_chunks, ROW_TILE, K) f32, one tile per parallel chunk
    N = w.shape[0]
    T, K = x.shape
    n_chunks = scratch.shape[0]
    tile = scratch.shape[1]
    n_tiles = (N + tile - 1) // tile
    per = (n_tiles + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        buf = scratch[c]
        for ti in range(c * per, min(n_tiles, (c + 1) * per)):
            r0 = ti * tile
            nr = min(tile, N - r0)
            for j in range(nr):
                dequant_row(type_id, w[r0 + j], buf[j])
            for t in range(T):
                for j in range(nr):
                    acc = np.float32(0.0)
                    for k in range(K):
                        acc += buf[j, k] * x[t, k]
                    out[t, r0 + j] = acc


@njit(cache=True)
def round_activations(mode, x, out):
    # x, out: (T, K) f32; out = x as llama.cpp quantizes it for the dot product, dequantized again
    T, K = x.shape
    if mode == ACT_F16:
        for t in range(T):
            for k in range(K):
                out[t, k] = f16_round(x[t, k])
        return
    if mode == ACT_BF16:
        u = out.view(np.uint32)
        xi = x.view(np.uint32)
        for t in range(T):
            for k in range(K):
                b = xi[t, k]
                # round to nearest even on the upper 16 bits (NaN is not expected in activations)
                u[t, k] = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)) << np.uint32(16)
        return
    bs = 32 if mode == ACT_Q8_0 else 256
    for t in range(T):
        for b0 in range(0, K, bs):
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for k in range(b0, b0 + bs):
                a = abs(x[t, k])
                if a > amax:
                    amax = a
                    vmax = x[t, k]
            if amax == 0:
                for k in range(b0, b0 + bs):
                    out[t, k] = 0.0
                continue
            if mode == ACT_Q8_0:
                # Q8_0: scale stored as f16, quants from the unrounded inverse
                d = f16_round(amax / np.float32(127.0))
                iscale = np.float32(127.0) / amax
                for k in range(b0, b0 + bs):
                    out[t, k] = np.float32(np.rint(x[t, k] * iscale)) * d
            else:
                # Q8_K: signed max maps to -127, float32 scale
                iscale = np.float32(-127.0) / vmax
                d = np.float32(1.0) / iscale
                for k in range(b0, b0 + bs):
                    q = min(np.float32(127.0), np.float32(np.rint(iscale * x[t, k])))
                    out[t, k] = q * d


class MatmulWorkspace:
    """Scratch buffers for qmatmul, sized once for the largest weight."""

    def __init__(self, max_tokens: int, max_k: int, max_weight_elems: int, n_chunks: int):
        self.n_chunks = n_chunks
        self.max_tokens, self.max_k = max_tokens, max_k
        # float weights
        self.xr = np.zeros((max_tokens, max_k), np.float32)
        self.tiles = np.zeros((n_chunks, ROW_TILE, max_k), np.float32)
        self.dense = np.zeros(max_weight_elems, np.float32)
        # quantized activations for the packed kernels; flat, so that (T, K) views are C-contiguous
        # (numba compiles strided 'A' arrays into slower, unvectorized code)
        self.xq = np.zeros(max_tokens * max_k, np.float32)
        self.dxb = np.zeros(max_tokens * max_k // 16, np.float32)
        self.bsum = np.zeros(max_tokens * max_k // 16, np.float32)
        self.xi = np.zeros(max_tokens * max_k, np.int8)  # the same quants as int8, for the VNNI kernel
        self.acc = np.zeros((n_chunks, TT_MAX, NC), np.float32)


def qmatmul(w, x: np.ndarray, out: np.ndarray, ws: MatmulWorkspace, col0: int = 0) -> None:
    """out[:, col0:col0+N] = x (T, K) @ W.T for W of shape (N, K): a PackedWeight, or a QTensor
    of any type (the reference path). out may be wider than N (several products side by side).
    """
    if isinstance(w, PackedWeight):
        x = np.ascontiguousarray(x, np.float32)
        xq = ws.xi if w.vnni else ws.xq  # the VNNI kernel takes the activation quants as int8
        matmul_packed(w.act, x, w.q, w.s, w.m, w.has_min, w.n, xq, ws.dxb, ws.bsum, out, col0, ws.acc)
        return
    _reference_matmul(w, x, out[:, col0:col0 + w.raw.shape[0]], ws)


def _reference_matmul(w, x: np.ndarray, out: np.ndarray, ws: MatmulWorkspace) -> None:
    T = x.shape[0]
    N, K = w.raw.shape[0], w.shape[-1]
    mode = ACT_ROUNDING[w.type_id]
    if mode != ACT_NONE:
        xr = ws.xr[:T, :K]
        round_activations(mode, x, xr)
        x = xr
    if T >= BLAS_MIN_ROWS and N * K <= ws.dense.size:
        dense = ws.dense[: N * K].reshape(N, K)
        dequant_rows(w.type_id, w.raw, dense)
        np.matmul(x, dense.T, out=out)
        return
    qmatmul_rows(w.type_id, w.raw, x, out, ws.tiles)
