"""Products of activations with weights kept in their GGML block types.

Block-quantized weights (Q4_0 .. Q8_0, Q2_K .. Q6_K) are repacked once into row tiles at the
file's bits per weight (repack.py) and multiplied as llama.cpp does, with 8-bit activations and
exact integer block dots (qdot.py; with AVX-512 VNNI or AVX2, integer dot instructions with
bit-identical results).
Weights kept as they are (F32, F16, BF16, or any type not repacked) take the reference path: the
activations are rounded as llama.cpp rounds them for that type, then a tile of weight rows is
dequantized into a per-thread buffer and dotted with every activation row.  It is not BLAS on
purpose: a BLAS product's summation order depends on the batch's row count, and a sequence's
results must not change with what it is batched with (BLAS was ~1.8x faster on 512-token prefills).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from infer.quant import types as qt
from infer.quant.dequant import dequant_static
from infer.quant.static_type import static_type

from .activations import ACT_NONE, ACT_ROUNDING, round_activations
from .qdot import NC, TT_MAX, matmul_packed
from .repack import PackedWeight

ROW_TILE = 16  # weight rows dequantized together (64 KB at K = 1024), each activation row reused from L1 across them


@njit(cache=True, fastmath=True)
def _dot4(b, j, x, t, out, n):
    # out[t, n + i] = b[j + i] · x[t] for i < 4: four weight rows share each activation load
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for k in range(x.shape[1]):
        xv = x[t, k]
        a0 += b[j, k] * xv
        a1 += b[j + 1, k] * xv
        a2 += b[j + 2, k] * xv
        a3 += b[j + 3, k] * xv
    out[t, n] = a0
    out[t, n + 1] = a1
    out[t, n + 2] = a2
    out[t, n + 3] = a3


@njit(cache=True, fastmath=True, parallel=True)
def qmatmul_rows(key, w, x, out, scratch):
    # key: W's StaticType
    # w: (N, row_bytes) uint8 raw weight rows; x: (T, K) f32; out: (T, N) f32 = x @ W.T
    # scratch: (n_chunks, ROW_TILE, K) f32, one tile per parallel chunk
    # Each output is one dot product whose order depends on its row's place in a tile, never on T,
    # so batching changes no result.
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
                dequant_static(key, w[r0 + j], buf[j])
            quads = nr - nr % 4
            for t in range(T):
                for j in range(0, quads, 4):
                    _dot4(buf, j, x, t, out, r0 + j)
                for j in range(quads, nr):
                    acc = np.float32(0.0)
                    for k in range(K):
                        acc += buf[j, k] * x[t, k]
                    out[t, r0 + j] = acc


@njit(cache=True, fastmath=True, parallel=True)
def f32_matmul(w, x, out, n_chunks):
    # w: (N, K) f32 weight rows; x: (T, K) f32; out: (T, N) f32 = x @ w.T
    # The same dot products, in the same order, as qmatmul_rows on these rows' bytes (_dot4 over
    # row quads, then the rest one by one), without copying each tile out first.
    N = w.shape[0]
    T, K = x.shape
    n_quads = N // 4
    per = (n_quads + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for qi in range(c * per, min(n_quads, (c + 1) * per)):
            for t in range(T):
                _dot4(w, 4 * qi, x, t, out, 4 * qi)
    for j in range(4 * n_quads, N):
        for t in range(T):
            acc = np.float32(0.0)
            for k in range(K):
                acc += w[j, k] * x[t, k]
            out[t, j] = acc


class WidenedF16:
    """An F16 weight widened to float32 once, for a small matrix every step reads whole (Gemma 4's
    per_layer_model_proj, which llama.cpp's quantizer keeps F16): the reference path's products
    exactly (f16 -> f32 is exact and the activations are still rounded to f16, as llama.cpp's F16
    path rounds them), without a table lookup per weight per step, at twice the bytes."""

    def __init__(self, w: np.ndarray):
        self.w = w  # (N, K) float32

    @classmethod
    def of(cls, raw: np.ndarray, shape: tuple[int, ...]) -> "WidenedF16":
        """From an F16 tensor's raw bytes, shape (N, K)."""
        return cls(np.ascontiguousarray(raw).view(np.float16).reshape(shape).astype(np.float32))


class MatmulWorkspace:
    """Scratch buffers for qmatmul, sized once for the largest weight."""

    def __init__(self, max_tokens: int, max_k: int, n_chunks: int):
        self.n_chunks = n_chunks
        self.max_tokens, self.max_k = max_tokens, max_k
        # float weights
        # flat, so that every (T, K) view is C-contiguous: a strided view of one row would be typed
        # C and one of several rows A, two compilations whose sums differ (batching would change results)
        self.xr = np.zeros(max_tokens * max_k, np.float32)
        self.tiles = np.zeros((n_chunks, ROW_TILE, max_k), np.float32)
        # quantized activations for the packed kernels; flat, so that (T, K) views are C-contiguous
        # (numba compiles strided 'A' arrays into slower, unvectorized code)
        self.xq = np.zeros(max_tokens * max_k, np.float32)
        self.dxb = np.zeros(max_tokens * max_k // 16, np.float32)
        # the quant sums per 16, then per sub-block in pairs (qdot.matmul_packed)
        self.bsum = np.zeros(max_tokens * max_k // 16 + max_tokens * max_k // 32, np.float32)
        self.xi = np.zeros(max_tokens * max_k, np.int8)  # the same quants as int8, for the integer kernel
        self.acc = np.zeros((n_chunks, TT_MAX, NC), np.float32)
        # one tile expanded to bytes per parallel chunk, for batches (qdot.expand_tile)
        self.expanded = np.zeros((n_chunks, 1, 1, max_k * NC), np.uint8)


def qmatmul(w, x: np.ndarray, out: np.ndarray, ws: MatmulWorkspace, col0: int = 0) -> None:
    """out[:, col0:col0+N] = x (T, K) @ W.T for W of shape (N, K): a PackedWeight, or a QTensor
    of any type (the reference path). out may be wider than N (several products side by side).
    """
    if isinstance(w, PackedWeight):
        x = np.ascontiguousarray(x, np.float32)
        xq = ws.xi if w.int_kernel else ws.xq  # the integer kernel takes the activation quants as int8
        L = w.layout
        matmul_packed(static_type(w.type_id), w.act, x, w.lo, w.hi, w.s, w.m, w.sc, w.n, xq, ws.dxb, ws.bsum, out, col0, ws.acc,
                      L.lo_bits, L.hi_bits, L.group, ws.expanded)
        return
    if isinstance(w, WidenedF16):
        T, K = x.shape
        xr = ws.xr[:T * K].reshape(T, K)
        round_activations(ACT_ROUNDING[qt.F16], x, xr)
        f32_matmul(w.w, xr, out[:, col0:col0 + w.w.shape[0]], ws.n_chunks)
        return
    _reference_matmul(w, x, out[:, col0:col0 + w.raw.shape[0]], ws)


def _reference_matmul(w, x: np.ndarray, out: np.ndarray, ws: MatmulWorkspace) -> None:
    T = x.shape[0]
    K = w.shape[-1]
    mode = ACT_ROUNDING[w.type_id]
    if mode != ACT_NONE:
        xr = ws.xr[:T * K].reshape(T, K)
        round_activations(mode, x, xr)
        x = xr
    qmatmul_rows(static_type(w.type_id), w.raw, x, out, ws.tiles)
