"""How llama.cpp rounds the activations before a product with each weight type, and the integer
quants the packed kernels (qdot.py) take.

llama.cpp quantizes the activations for its dot products to the weight type's "vec_dot_type":
Q8_0 (a scale per 32) for the legacy types and MXFP4, Q8_1 for the legacy types with a min (Q4_1,
Q5_1: Q8_0's quants, and each block's sum d * sum(q) rounded to f16, which the min multiplies),
Q8_K (per 256) for the K-quants, f16 or bf16 for those float types.  Applying the same rounding
keeps our logits within llama.cpp's own rounding of the same file.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from infer.quant import types as qt
from infer.quant.halves import bits_f32

from .elementwise import f16_round

ACT_NONE, ACT_Q8_0, ACT_Q8_K, ACT_F16, ACT_BF16, ACT_Q8_1 = 0, 1, 2, 3, 4, 5
ACT_ROUNDING = {
    qt.F32: ACT_NONE, qt.F16: ACT_F16, qt.BF16: ACT_BF16,
    qt.Q4_0: ACT_Q8_0, qt.Q4_1: ACT_Q8_1, qt.Q5_0: ACT_Q8_0, qt.Q5_1: ACT_Q8_1, qt.Q8_0: ACT_Q8_0,
    qt.Q2_K: ACT_Q8_K, qt.Q3_K: ACT_Q8_K, qt.Q4_K: ACT_Q8_K, qt.Q5_K: ACT_Q8_K, qt.Q6_K: ACT_Q8_K,
    qt.MXFP4: ACT_Q8_0,
}

PAR_QUANT_MIN = 8  # from this many tokens on, quantize the activations in parallel


@njit(cache=True)
def round_activations(mode, x, out):
    # x, out: (T, K) f32; out = x as llama.cpp quantizes it for the dot product, dequantized again
    # (Q8_1's quants are Q8_0's; its rounded block sums are no rounding of x)
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
    bs = 256 if mode == ACT_Q8_K else 32
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
            if mode != ACT_Q8_K:
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


@njit(cache=True)
def quantize_row(mode, x, xq, dxb, bsum):
    # x: (K,) f32 C-contiguous; mode: ACT_Q8_0, ACT_Q8_1 or ACT_Q8_K
    # xq: (K,) f32 or int8 (for the integer kernel), the integer quants llama.cpp forms for its dot
    #   products (all in [-127, 127])
    # dxb: (K//16,) f32, the scale of each 16-element sub-block; bsum: (K//16,) f32, its sum of quants;
    #   Q8_1: each block's first holds the block's s = f16(d * sum of its quants), with d the scale
    #   before its f16 rounding (llama.cpp's quantize_row_q8_1), the second 0
    # round_activations(mode, x) == xq * dxb (repeated over each sub-block), exactly.
    # No fastmath: the scale's division and the rounding must be exactly llama.cpp's.
    # The loops run over slices indexed from 0 (no negative-index checks) for a block size the
    # compiler does not know (a known 32 makes it unroll the max into a scalar chain), so they vectorize.
    K = x.shape[0]
    bs = 256 if mode == ACT_Q8_K else 32
    for b0 in range(0, K, bs):
        xs, qs = x[b0:b0 + bs], xq[b0:b0 + bs]
        bits = xs.view(np.uint32)
        # max |x| as the max of the magnitude bits: an integer reduction, which vectorizes
        m = np.uint32(0)
        for k in range(bs):
            m = max(m, bits[k] & np.uint32(0x7FFFFFFF))
        d = np.float32(0.0)
        d_raw = np.float32(0.0)
        if m == 0:
            for k in range(bs):
                qs[k] = 0.0
        elif mode != ACT_Q8_K:
            amax = bits_f32(np.uint32(m))  # the largest |x|: the float with those bits
            # scale stored as f16, quants from the unrounded inverse
            d_raw = amax / np.float32(127.0)
            d = f16_round(d_raw)
            iscale = np.float32(127.0) / amax
            for k in range(bs):
                qs[k] = np.float32(np.rint(xs[k] * iscale))
        else:
            vmax = xs[0]
            for k in range(bs):  # the first element of largest magnitude, with its sign
                if bits[k] & np.uint32(0x7FFFFFFF) == m:
                    vmax = xs[k]
                    break
            # Q8_K: the signed maximum maps to -127, float32 scale
            iscale = np.float32(-127.0) / vmax
            d = np.float32(1.0) / iscale
            for k in range(bs):
                qs[k] = min(np.float32(127.0), np.float32(np.rint(iscale * xs[k])))
        for j in range(bs // 16):
            dxb[b0 // 16 + j] = d
            acc = np.int32(0)  # an integer sum (exact, so in any order: it vectorizes), as a float
            for k in range(16 * j, 16 * j + 16):
                acc += np.int32(qs[k])
            bsum[b0 // 16 + j] = np.float32(acc)
        if mode == ACT_Q8_1:
            j = b0 // 16
            bsum[j] = f16_round(d_raw * (bsum[j] + bsum[j + 1]))
            bsum[j + 1] = np.float32(0.0)


@njit(cache=True)
def pair_sums(bsum, per, out):
    # bsum: (T, K//16) f32 quant sums per 16 (quantize_row); per: 16-element sums per sub-block of
    # the weight type (1 or 2); out: (T, K // (32 * per)) int32: the sums per sub-block two at a time,
    # sub-block 2p's in the low 16 bits and 2p + 1's in the high 16 (as int16s: |sum| <= 32 * 127),
    # the operand vpdpwssd multiplies two K-quant mins by (qdot's mins term).  Once per product:
    # the kernel would otherwise form them again for every tile of rows.
    for t in range(out.shape[0]):
        for p in range(out.shape[1]):
            lo, hi = np.float32(0.0), np.float32(0.0)  # integers below 2**24: exact
            for k in range(per):
                lo += bsum[t, 2 * per * p + k]
                hi += bsum[t, 2 * per * p + per + k]
            out[t, p] = (np.int32(lo) & np.int32(0xFFFF)) | (np.int32(hi) << np.int32(16))


@njit(cache=True, parallel=True)
def quantize_rows(mode, x, xq, dxb, bsum):
    # quantize_row for every row: x (T, K) f32; xq (T, K) f32 or int8; dxb, bsum (T, K//16) f32
    T = x.shape[0]
    if T >= PAR_QUANT_MIN:
        for t in prange(T):
            quantize_row(mode, x[t], xq[t], dxb[t], bsum[t])
    else:  # a parallel region costs more than quantizing a few rows
        for t in range(T):
            quantize_row(mode, x[t], xq[t], dxb[t], bsum[t])
