"""Numba quantizers for the K-quant super-blocks (Q4_K, Q5_K, Q6_K) and the helpers that
`quantizers.py` shares: `nearest_int`, and the scale searches
(`make_qx_quants`, `make_qkx2_quants`, `make_qkx3_quants`, `make_qp_quants`).

Written after llama.cpp's quantizers (ggml/src/ggml-quants.c); the output is
byte-identical to llama.cpp's `ggml_quantize_chunk` (tests/test_quantize.py checks it against
the library).  Byte equality needs llama.cpp's exact float32 arithmetic:
- every value and constant stays float32 (`np.float32(...)` around literals and loop indices:
  numba promotes int*float32 and Python floats to float64), no fastmath, so no fused multiply-add;
- sums run left to right in the order the reference writes them (`w*l*x` is `(w*l)*x`);
- integers that the reference keeps in uint8 wrap as uint8 (`& 0xFF`).

Row functions take `x` (K,) float32, `qw` (K,) float32 importance weights or an empty array for
none, and write one row of blocks into `y` (row_bytes,) uint8.  They never raise: the caller
checks the input for NaN/Inf first.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from infer.quant.halves import F16_TO_F32, f32_bits, f32_to_f16

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)


# --------------------------------------------------------------------------- scalar helpers


@njit(cache=True, inline="always")
def nearest_int(f):
    # ggml rounds by adding 1.5*2**23 in float32 and reading the low mantissa bits: half to even
    # inside +-4194303, and a deterministic (wrong) value outside, which we reproduce too.
    v = f + np.float32(12582912.0)
    return np.int64(f32_bits(v) & np.uint32(0x7FFFFF)) - 0x400000


@njit(cache=True, inline="always")
def put_f16(y, o, f):
    # y: (n,) uint8; stores f as little-endian f16 at byte o and returns the stored value as
    # float32 (the requantization uses the rounded scale)
    h = f32_to_f16(f)
    y[o] = np.uint8(h & 0xFF)
    y[o + 1] = np.uint8(h >> 8)
    return F16_TO_F32[h]


@njit(cache=True, inline="always")
def importance(x, xo, qw, sigma2, w):
    # w: (32,) out: the importance-weighted path's weights qw * sqrt(sigma2 + x^2) for x[xo:xo+32];
    # returns their sum (added left to right, as the reference does)
    total = np.float32(0.0)
    for l in range(32):
        v = x[xo + l]
        w[l] = qw[xo + l] * np.sqrt(sigma2 + v * v)
        total += w[l]
    return total


# --------------------------------------------------------------------------- scale searches


@njit(cache=True)
def make_qx_quants(n, nmax, x, xo, L, qw, qo):
    # x: (>= xo+n,) float32, the group at xo; L: (n,) int8-valued int32 out, in 0..2*nmax-1;
    # qw: (>= qo+n,) float32 weights at qo, or (0,) for w = x*x.  Returns the scale.
    # A symmetric grid searched over 19 trial scales around -nmax/max (rmse_type 1).
    fmax = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        ax = np.abs(x[xo + i])
        if ax > amax:
            amax = ax
            fmax = x[xo + i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0)
    has_w = qw.shape[0] > 0
    fn = np.float32(nmax)
    iscale = np.float32(-nmax) / fmax
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        v = x[xo + i]
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * v)))
        L[i] = l + nmax
        w = qw[qo + i] if has_w else v * v
        fl = np.float32(l)
        sumlx += w * v * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fn + np.float32(0.1) * np.float32(step)) / fmax
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(n):
            v = x[xo + i]
            fl = np.float32(max(-nmax, min(nmax - 1, nearest_int(iscale * v))))
            w = qw[qo + i] if has_w else v * v
            sumlx += w * v * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[xo + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def make_qkx_quants(n, nmax, x, xo, w, L, Laux, rmin, rdelta, nstep, v3):
    # x: (>= xo+n,) float32, the group at xo; w: (n,) float32 weights; L, Laux: (n,) int32 (L out,
    # in 0..nmax).  Returns (scale, -min) of an asymmetric grid: a least-squares fit of scale and
    # min for nstep+1 trial grids.  v3=False is make_qkx2_quants, True make_qkx3_quants (which
    # treats max <= min as degenerate and clamps the trial levels before rounding).
    fmin = x[xo]
    fmax = x[xo]
    sum_w = w[0]
    sum_x = sum_w * x[xo]
    for i in range(1, n):
        v = x[xo + i]
        if v < fmin:
            fmin = v
        if v > fmax:
            fmax = v
        sum_w += w[i]
        sum_x += w[i] * v
    if fmin > 0:
        fmin = np.float32(0.0)
    if (fmax <= fmin) if v3 else (fmax == fmin):
        for i in range(n):
            L[i] = 0
        return np.float32(0.0), -fmin
    fn = np.float32(nmax)
    iscale = fn / (fmax - fmin)
    scale = np.float32(1.0) / iscale
    best = np.float32(0.0)
    for i in range(n):
        l = max(0, min(nmax, nearest_int(iscale * (x[xo + i] - fmin))))
        L[i] = l
        diff = scale * np.float32(l) + fmin - x[xo + i]
        best += w[i] * (diff * diff)
    for step in range(nstep + 1):
        # fmin is the best fit so far, not the data minimum (as in the reference)
        iscale = (rmin + rdelta * np.float32(step) + fn) / (fmax - fmin)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            t = iscale * (x[xo + i] - fmin)
            if v3:
                l = nearest_int(t if t < fn else fn) if t > 0 else 0
            else:
                l = max(0, min(nmax, nearest_int(t)))
            Laux[i] = l
            wl = w[i] * np.float32(l)
            sum_l += wl
            sum_l2 += wl * np.float32(l)
            sum_xl += wl * x[xo + i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = np.float32(0.0)
                this_scale = sum_xl / sum_l2
            err = np.float32(0.0)
            for i in range(n):
                diff = this_scale * np.float32(Laux[i]) + this_min - x[xo + i]
                err += w[i] * (diff * diff)
            if err < best:
                for i in range(n):
                    L[i] = Laux[i]
                best = err
                scale = this_scale
                fmin = this_min
    return scale, -fmin


@njit(cache=True)
def make_qp_quants(n, nmax, x, L, qw):
    # x: (n,) float32 non-negative values (sub-block scales or mins); L: (n,) int32 out, uint8
    # values as the reference stores them; qw: (n,) float32 weights.  Returns the super-block
    # scale: 9 trial grids, then up to 5 rounds of coordinate descent on single levels.
    fmax = np.float32(0.0)
    for i in range(n):
        fmax = fmax if fmax > x[i] else x[i]
    if fmax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0)
    fn = np.float32(nmax)
    iscale = fn / fmax
    scale = np.float32(1.0) / iscale
    best = np.float32(0.0)
    for i in range(n):
        l = nearest_int(iscale * x[i]) & 0xFF  # stored in uint8 first, unclamped
        diff = x[i] - scale * np.float32(l)
        best += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (np.float32(0.1) * np.float32(step) + fn) / fmax
        scale_is = np.float32(1.0) / iscale_is
        mse = np.float32(0.0)
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * np.float32(l)
            mse += qw[i] * diff * diff
        if mse < best:
            best = mse
            iscale = iscale_is
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i])) & 0xFF
        L[i] = l
        fl = np.float32(l)
        sumlx += qw[i] * x[i] * fl
        suml2 += qw[i] * fl * fl
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = qw[i]
            fl = np.float32(L[i])
            slx = sumlx - w * x[i] * fl
            sl2 = suml2 - w * fl * fl
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fnl = np.float32(new_l)
                    slx += w * x[i] * fnl
                    sl2 += w * fnl * fnl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else np.float32(0.0)


# --------------------------------------------------------------------------- Q4_K / Q5_K


@njit(cache=True, inline="always")
def _pack_k4_scales(y, o, j, ls, lm):
    # y: (n,) uint8, the 12 scale bytes at o; sub-block j's 6-bit scale ls and min lm
    if j < 4:
        y[o + j] = np.uint8(ls & 0xFF)
        y[o + j + 4] = np.uint8(lm & 0xFF)
    else:
        y[o + j + 4] = np.uint8(((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF)
        y[o + j - 4] |= np.uint8(((ls >> 4) << 6) & 0xFF)
        y[o + j] |= np.uint8(((lm >> 4) << 6) & 0xFF)


@njit(cache=True, inline="always")
def _k4_scale_min(y, o, j):
    # the (scale, min) pair of sub-block j back from the packed bytes at o (y: (n,) uint8)
    if j < 4:
        return np.int64(y[o + j]) & 63, np.int64(y[o + j + 4]) & 63
    sc = (np.int64(y[o + j + 4]) & 0xF) | ((np.int64(y[o + j - 4]) >> 6) << 4)
    m = (np.int64(y[o + j + 4]) >> 4) | ((np.int64(y[o + j]) >> 6) << 4)
    return sc, m


@njit(cache=True)
def quantize_row_qk45(x, qw, y, nmax):
    # x: (K,) float32; qw: (K,) float32 or (0,); y: (K/256*bs,) uint8 out; nmax 15 -> Q4_K, 31 -> Q5_K
    five = nmax == 31
    bs = 176 if five else 144
    qo = 48 if five else 16  # byte offset of the low nibbles
    nb = x.shape[0] // QK_K
    has_w = qw.shape[0] > 0
    L = np.empty(QK_K, dtype=np.int32)
    Laux = np.empty(32, dtype=np.int32)
    w = np.empty(32, dtype=np.float32)
    scales = np.empty(8, dtype=np.float32)
    mins = np.empty(8, dtype=np.float32)
    sw = np.empty(8, dtype=np.float32)
    Ls = np.empty(8, dtype=np.int32)
    Lm = np.empty(8, dtype=np.int32)
    for i in range(nb):
        xo = i * QK_K
        o = i * bs
        for b in range(bs):
            y[o + b] = 0
        if has_w:
            # importance path: qkx3 per sub-block, then make_qp_quants for the 6-bit scales
            sum_x2 = np.float32(0.0)
            for l in range(QK_K):
                sum_x2 += x[xo + l] * x[xo + l]
            sigma2 = np.float32(2.0) * sum_x2 / np.float32(QK_K)
            for j in range(8):
                sw[j] = importance(x, xo + 32 * j, qw, sigma2, w)
                s, m = make_qkx_quants(32, nmax, x, xo + 32 * j, w, L[32 * j:32 * j + 32], Laux,
                                       np.float32(-0.9), np.float32(0.05), 36, True)
                scales[j] = s
                mins[j] = m
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            for j in range(8):
                ls = Ls[j]
                lm = Lm[j]
                if five:
                    ls = min(63, ls)
                    lm = min(63, lm)
                _pack_k4_scales(y, o + 4, j, ls, lm)
        else:
            max_scale = np.float32(0.0)
            max_min = np.float32(0.0)
            for j in range(8):
                sum_x2 = np.float32(0.0)
                for l in range(32):
                    sum_x2 += x[xo + 32 * j + l] * x[xo + 32 * j + l]
                av_x = np.sqrt(sum_x2 / np.float32(32.0))
                for l in range(32):
                    w[l] = av_x + np.abs(x[xo + 32 * j + l])
                if five:
                    s, m = make_qkx_quants(32, 31, x, xo + 32 * j, w, L[32 * j:32 * j + 32], Laux,
                                           np.float32(-0.5), np.float32(0.1), 15, False)
                else:
                    s, m = make_qkx_quants(32, 15, x, xo + 32 * j, w, L[32 * j:32 * j + 32], Laux,
                                           np.float32(-1.0), np.float32(0.1), 20, False)
                scales[j] = s
                mins[j] = m
                if s > max_scale:
                    max_scale = s
                if m > max_min:
                    max_min = m
            inv_scale = np.float32(63.0) / max_scale if max_scale > 0 else np.float32(0.0)
            inv_min = np.float32(63.0) / max_min if max_min > 0 else np.float32(0.0)
            for j in range(8):
                # uint8 first (a negative level wraps), then the clamp
                ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
                lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
                _pack_k4_scales(y, o + 4, j, ls, lm)
            d_block = max_scale / np.float32(63.0)
            m_block = max_min / np.float32(63.0)
        d = put_f16(y, o, d_block)
        dmin = put_f16(y, o + 2, m_block)
        for j in range(8):
            sc, m = _k4_scale_min(y, o + 4, j)
            dj = d * np.float32(sc)
            if dj == 0:
                continue  # keep the levels of the scale search
            dm = dmin * np.float32(m)
            for l in range(32):
                L[32 * j + l] = max(0, min(nmax, nearest_int((x[xo + 32 * j + l] + dm) / dj)))
        for c in range(4):
            for l in range(32):
                lo = L[64 * c + l]
                hi = L[64 * c + 32 + l]
                if five:
                    if lo > 15:
                        lo -= 16
                        y[o + 16 + l] |= np.uint8(1 << (2 * c))
                    if hi > 15:
                        hi -= 16
                        y[o + 16 + l] |= np.uint8(2 << (2 * c))
                y[o + qo + 32 * c + l] = np.uint8(lo | (hi << 4))


# --------------------------------------------------------------------------- Q6_K


@njit(cache=True)
def quantize_row_q6_k(x, qw, y):
    # x: (K,) float32; qw: (K,) float32 or (0,); y: (K/256*210,) uint8 out
    nb = x.shape[0] // QK_K
    L = np.empty(QK_K, dtype=np.int32)
    scales = np.empty(16, dtype=np.float32)
    empty = np.empty(0, dtype=np.float32)
    for i in range(nb):
        xo = i * QK_K
        o = i * 210
        for b in range(210):
            y[o + b] = 0
        max_scale = np.float32(0.0)
        max_abs = np.float32(0.0)
        for ib in range(16):
            if qw.shape[0] > 0:
                s = make_qx_quants(16, 32, x, xo + 16 * ib, L[16 * ib:16 * ib + 16], qw, xo + 16 * ib)
            else:
                s = make_qx_quants(16, 32, x, xo + 16 * ib, L[16 * ib:16 * ib + 16], empty, 0)
            scales[ib] = s
            if np.abs(s) > max_abs:
                max_abs = np.abs(s)
                max_scale = s
        if max_abs < GROUP_MAX_EPS:
            continue  # the whole block stays zero
        iscale = np.float32(-128.0) / max_scale
        d = put_f16(y, o + 208, np.float32(1.0) / iscale)
        for ib in range(16):
            y[o + 192 + ib] = np.uint8(min(127, nearest_int(iscale * scales[ib])) & 0xFF)
        for j in range(16):
            sc = np.int64(y[o + 192 + j])
            sc = sc - 256 if sc > 127 else sc
            dj = d * np.float32(sc)
            if dj == 0:
                continue
            for l in range(16):
                L[16 * j + l] = max(-32, min(31, nearest_int(x[xo + 16 * j + l] / dj))) + 32
        for h in range(2):
            for l in range(32):
                q1 = L[128 * h + l]
                q2 = L[128 * h + l + 32]
                q3 = L[128 * h + l + 64]
                q4 = L[128 * h + l + 96]
                y[o + 64 * h + l] = np.uint8((q1 & 0xF) | ((q3 & 0xF) << 4))
                y[o + 64 * h + l + 32] = np.uint8((q2 & 0xF) | ((q4 & 0xF) << 4))
                y[o + 128 + 32 * h + l] = np.uint8((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6))
