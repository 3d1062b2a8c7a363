"""Numba dequantization of the K-quant super-blocks (256 elements): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Also the K-quant scale unpacking shared with the quantizers and the CPU backend (`scale_min_k4`,
`k4_scales`, `q3_scale`).  The f16 conversions come from `halves.py`, the lane helpers from
`lanes.py`.  Layouts follow ggml's block_q*_K structs (llama.cpp's ggml/src/ggml-common.h), and
gguf.quants for the reference results (ours are bit-identical).  See `dequant.py`'s docstring
for the rules these loops follow to vectorize.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from infer.quant.halves import f16_at
from infer.quant.lanes import int_to_f32, opaque32, shr

QK_K = 256


@njit(cache=True, inline="always")
def scale_min_k4(src, s, j):
    # src: (k,) uint8 with the 12 packed scale bytes at s; (scale, min) of sub-block j (ggml's get_scale_min_k4)
    if j < 4:
        sc = np.int32(src[s + j]) & 63
        m = np.int32(src[s + j + 4]) & 63
    else:
        sc = (np.int32(src[s + j + 4]) & 15) | ((np.int32(src[s + j - 4]) >> 6) << 4)
        m = (np.int32(src[s + j + 4]) >> 4) | ((np.int32(src[s + j]) >> 6) << 4)
    return sc, m


@njit(cache=True, inline="always")
def k4_scales(src, o):
    # src: (k,) uint8 with a Q4_K/Q5_K super-block at byte o -> its 8 (scale, min) pairs as float32,
    # d * sc_j and dmin * m_j, as scalars: the row loops keep them in registers
    d = f16_at(src, o)
    dmin = f16_at(src, o + 2)
    sc0, m0 = scale_min_k4(src, o + 4, 0)
    sc1, m1 = scale_min_k4(src, o + 4, 1)
    sc2, m2 = scale_min_k4(src, o + 4, 2)
    sc3, m3 = scale_min_k4(src, o + 4, 3)
    sc4, m4 = scale_min_k4(src, o + 4, 4)
    sc5, m5 = scale_min_k4(src, o + 4, 5)
    sc6, m6 = scale_min_k4(src, o + 4, 6)
    sc7, m7 = scale_min_k4(src, o + 4, 7)
    f = np.float32
    return (d * f(sc0), dmin * f(m0), d * f(sc1), dmin * f(m1), d * f(sc2), dmin * f(m2), d * f(sc3), dmin * f(m3),
            d * f(sc4), dmin * f(m4), d * f(sc5), dmin * f(m5), d * f(sc6), dmin * f(m6), d * f(sc7), dmin * f(m7))


@njit(cache=True, fastmath=False)
def dequant_row_q2_k(src, dst):
    # src: (nb*84,) uint8, blocks of [scales[16], qs[64], d f16, dmin f16]; dst: (nb*256,) float32
    # Element e = 128*hh + 32*k + 16*p + l (l < 16): q = (qs[32hh + 16p + l] >> 2k) & 3,
    # scale byte scales[e // 16] = scales[8hh + 2k + p]: x = d*(sc & 15)*q - dmin*(sc >> 4).
    n = dst.shape[0]
    nb = min(n // QK_K, src.shape[0] // 84)
    if nb == 0:
        return
    h = opaque32(n, nb, 3) >> 1  # 16
    for b in range(nb):
        o = b * 84
        t = b * QK_K
        d = f16_at(src, o + 80)
        dmin = f16_at(src, o + 82)
        for hh in range(2):
            s = o + 8 * hh  # scales[8hh + 2k + p]
            d00, m00 = d * np.float32(src[s] & 15), dmin * np.float32(src[s] >> 4)
            d01, m01 = d * np.float32(src[s + 1] & 15), dmin * np.float32(src[s + 1] >> 4)
            d10, m10 = d * np.float32(src[s + 2] & 15), dmin * np.float32(src[s + 2] >> 4)
            d11, m11 = d * np.float32(src[s + 3] & 15), dmin * np.float32(src[s + 3] >> 4)
            d20, m20 = d * np.float32(src[s + 4] & 15), dmin * np.float32(src[s + 4] >> 4)
            d21, m21 = d * np.float32(src[s + 5] & 15), dmin * np.float32(src[s + 5] >> 4)
            d30, m30 = d * np.float32(src[s + 6] & 15), dmin * np.float32(src[s + 6] >> 4)
            d31, m31 = d * np.float32(src[s + 7] & 15), dmin * np.float32(src[s + 7] >> 4)
            q = o + 16 + 32 * hh
            e = t + 128 * hh
            for l in range(h):
                x = src[q + l]  # p = 0
                y = src[q + 16 + l]  # p = 1
                dst[e + l] = d00 * int_to_f32(x & 3) - m00
                dst[e + 16 + l] = d01 * int_to_f32(y & 3) - m01
                dst[e + 32 + l] = d10 * int_to_f32(shr(x, 2) & 3) - m10
                dst[e + 48 + l] = d11 * int_to_f32(shr(y, 2) & 3) - m11
                dst[e + 64 + l] = d20 * int_to_f32(shr(x, 4) & 3) - m20
                dst[e + 80 + l] = d21 * int_to_f32(shr(y, 4) & 3) - m21
                dst[e + 96 + l] = d30 * int_to_f32(shr(x, 6)) - m30
                dst[e + 112 + l] = d31 * int_to_f32(shr(y, 6)) - m31


@njit(cache=True, inline="always")
def q3_scale(src, s, j):
    # src: (k,) uint8 with Q3_K's 12 packed scale bytes at s; the 6-bit scale j, minus 32
    if j < 8:
        lo = np.int32(src[s + j]) & 15
    else:
        lo = np.int32(src[s + j - 8]) >> 4
    hi = (np.int32(src[s + 8 + (j & 3)]) >> (2 * (j >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(cache=True, fastmath=False)
def dequant_row_q3_k(src, dst):
    # src: (nb*110,) uint8, blocks of [hmask[32], qs[64], scales[12], d f16]; dst: (nb*256,) float32
    # Element e = 128*hh + 32*k + 16*p + l (l < 16): low2 = (qs[32hh + 16p + l] >> 2k) & 3,
    # hbit = (hmask[16p + l] >> (4hh + k)) & 1, q = low2 - 4 + 4*hbit; x = (d * s_{8hh+2k+p}) * q.
    n = dst.shape[0]
    nb = min(n // QK_K, src.shape[0] // 110)
    if nb == 0:
        return
    h = opaque32(n, nb, 3) >> 1  # 16
    for b in range(nb):
        o = b * 110
        t = b * QK_K
        d = f16_at(src, o + 108)
        for hh in range(2):
            j = 8 * hh
            d00 = d * np.float32(q3_scale(src, o + 96, j))
            d01 = d * np.float32(q3_scale(src, o + 96, j + 1))
            d10 = d * np.float32(q3_scale(src, o + 96, j + 2))
            d11 = d * np.float32(q3_scale(src, o + 96, j + 3))
            d20 = d * np.float32(q3_scale(src, o + 96, j + 4))
            d21 = d * np.float32(q3_scale(src, o + 96, j + 5))
            d30 = d * np.float32(q3_scale(src, o + 96, j + 6))
            d31 = d * np.float32(q3_scale(src, o + 96, j + 7))
            q = o + 32 + 32 * hh
            e = t + 128 * hh
            hs = 4 * hh
            for l in range(h):
                x = src[q + l]  # p = 0
                y = src[q + 16 + l]  # p = 1
                u = shr(src[o + l], hs)  # hmask bits 4hh.. of p = 0
                v = shr(src[o + 16 + l], hs)  # and of p = 1
                dst[e + l] = d00 * int_to_f32((x & 3) + 4 * (u & 1) - 4)
                dst[e + 16 + l] = d01 * int_to_f32((y & 3) + 4 * (v & 1) - 4)
                dst[e + 32 + l] = d10 * int_to_f32((shr(x, 2) & 3) + 2 * (u & 2) - 4)
                dst[e + 48 + l] = d11 * int_to_f32((shr(y, 2) & 3) + 2 * (v & 2) - 4)
                dst[e + 64 + l] = d20 * int_to_f32((shr(x, 4) & 3) + (u & 4) - 4)
                dst[e + 80 + l] = d21 * int_to_f32((shr(y, 4) & 3) + (v & 4) - 4)
                dst[e + 96 + l] = d30 * int_to_f32(shr(x, 6) + (shr(u, 1) & 4) - 4)
                dst[e + 112 + l] = d31 * int_to_f32(shr(y, 6) + (shr(v, 1) & 4) - 4)


@njit(cache=True, fastmath=False)
def dequant_row_q4_k(src, dst):
    # src: (nb*144,) uint8, blocks of [d f16, dmin f16, scales[12], qs[128]]; dst: (nb*256,) float32
    # Element 64c + l (l < 32) is the low nibble of qs[32c + l], element 64c + 32 + l its high
    # nibble; sub-block j = e // 32 has (sc, m) = get_scale_min_k4(j): x = (d*sc)*q - dmin*m.
    n = dst.shape[0]
    nb = min(n // QK_K, src.shape[0] // 144)
    if nb == 0:
        return
    w = opaque32(n, nb, 3)  # 32
    for b in range(nb):
        o = b * 144
        t = b * QK_K
        d0, n0, d1, n1, d2, n2, d3, n3, d4, n4, d5, n5, d6, n6, d7, n7 = k4_scales(src, o)
        q = o + 16
        for l in range(w):
            x0 = src[q + l]
            x1 = src[q + 32 + l]
            x2 = src[q + 64 + l]
            x3 = src[q + 96 + l]
            dst[t + l] = d0 * int_to_f32(x0 & 15) - n0
            dst[t + 32 + l] = d1 * int_to_f32(shr(x0, 4)) - n1
            dst[t + 64 + l] = d2 * int_to_f32(x1 & 15) - n2
            dst[t + 96 + l] = d3 * int_to_f32(shr(x1, 4)) - n3
            dst[t + 128 + l] = d4 * int_to_f32(x2 & 15) - n4
            dst[t + 160 + l] = d5 * int_to_f32(shr(x2, 4)) - n5
            dst[t + 192 + l] = d6 * int_to_f32(x3 & 15) - n6
            dst[t + 224 + l] = d7 * int_to_f32(shr(x3, 4)) - n7


@njit(cache=True, fastmath=False)
def dequant_row_q5_k(src, dst):
    # src: (nb*176,) uint8, blocks of [d f16, dmin f16, scales[12], qh[32], qs[128]];
    # dst: (nb*256,) float32.  As Q4_K, plus bit 4 of element 32j + l = bit j of qh[l].
    n = dst.shape[0]
    nb = min(n // QK_K, src.shape[0] // 176)
    if nb == 0:
        return
    w = opaque32(n, nb, 3)  # 32
    for b in range(nb):
        o = b * 176
        t = b * QK_K
        d0, n0, d1, n1, d2, n2, d3, n3, d4, n4, d5, n5, d6, n6, d7, n7 = k4_scales(src, o)
        qh = o + 16
        q = o + 48
        for l in range(w):
            y = src[qh + l]
            x0 = src[q + l]
            x1 = src[q + 32 + l]
            x2 = src[q + 64 + l]
            x3 = src[q + 96 + l]
            dst[t + l] = d0 * int_to_f32((x0 & 15) | ((y & 1) << 4)) - n0
            dst[t + 32 + l] = d1 * int_to_f32(shr(x0, 4) | ((y & 2) << 3)) - n1
            dst[t + 64 + l] = d2 * int_to_f32((x1 & 15) | ((y & 4) << 2)) - n2
            dst[t + 96 + l] = d3 * int_to_f32(shr(x1, 4) | ((y & 8) << 1)) - n3
            dst[t + 128 + l] = d4 * int_to_f32((x2 & 15) | (y & 16)) - n4
            dst[t + 160 + l] = d5 * int_to_f32(shr(x2, 4) | (shr(y, 1) & 16)) - n5
            dst[t + 192 + l] = d6 * int_to_f32((x3 & 15) | (shr(y, 2) & 16)) - n6
            dst[t + 224 + l] = d7 * int_to_f32(shr(x3, 4) | (shr(y, 3) & 16)) - n7


@njit(cache=True, fastmath=False)
def dequant_row_q6_k(src, dst):
    # src: (nb*210,) uint8, blocks of [ql[128], qh[64], scales int8[16], d f16]; dst: (nb*256,) float32
    # Element e = 128*hh + 32*k + 16*p + l (l < 16), i = 16p + l: low nibble of ql[64hh + 32*(k&1) + i]
    # (high nibble for k >= 2), bits 4-5 from (qh[32hh + i] >> 2k) & 3; x = (d * scales[8hh+2k+p]) * (q - 32).
    n = dst.shape[0]
    nb = min(n // QK_K, src.shape[0] // 210)
    if nb == 0:
        return
    h = opaque32(n, nb, 3) >> 1  # 16
    for b in range(nb):
        o = b * 210
        t = b * QK_K
        d = f16_at(src, o + 208)
        for hh in range(2):
            s = o + 192 + 8 * hh  # scales[8hh + 2k + p]
            d00 = d * np.float32(np.int8(src[s]))
            d01 = d * np.float32(np.int8(src[s + 1]))
            d10 = d * np.float32(np.int8(src[s + 2]))
            d11 = d * np.float32(np.int8(src[s + 3]))
            d20 = d * np.float32(np.int8(src[s + 4]))
            d21 = d * np.float32(np.int8(src[s + 5]))
            d30 = d * np.float32(np.int8(src[s + 6]))
            d31 = d * np.float32(np.int8(src[s + 7]))
            ql = o + 64 * hh
            qh = o + 128 + 32 * hh
            e = t + 128 * hh
            for l in range(h):
                a0 = src[ql + l]  # p = 0, k = 0 / 2
                a1 = src[ql + 16 + l]  # p = 1
                c0 = src[ql + 32 + l]  # p = 0, k = 1 / 3
                c1 = src[ql + 48 + l]
                y0 = src[qh + l]
                y1 = src[qh + 16 + l]
                dst[e + l] = d00 * int_to_f32(((a0 & 15) | ((y0 & 3) << 4)) - 32)
                dst[e + 16 + l] = d01 * int_to_f32(((a1 & 15) | ((y1 & 3) << 4)) - 32)
                dst[e + 32 + l] = d10 * int_to_f32(((c0 & 15) | ((y0 & 12) << 2)) - 32)
                dst[e + 48 + l] = d11 * int_to_f32(((c1 & 15) | ((y1 & 12) << 2)) - 32)
                dst[e + 64 + l] = d20 * int_to_f32((shr(a0, 4) | (y0 & 48)) - 32)
                dst[e + 80 + l] = d21 * int_to_f32((shr(a1, 4) | (y1 & 48)) - 32)
                dst[e + 96 + l] = d30 * int_to_f32((shr(c0, 4) | (shr(y0, 2) & 48)) - 32)
                dst[e + 112 + l] = d31 * int_to_f32((shr(c1, 4) | (shr(y1, 2) & 48)) - 32)
