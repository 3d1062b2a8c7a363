"""Elementwise and per-row kernels of a layer: f16 rounding, RMS norms, RoPE, Q/K head post-processing,
the Hadamard transform, residual adds, embedding rows, softcap. Each writes into caller-provided arrays."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from infer.quant.dequant import dequant_static
from infer.quant.halves import bits_f32, f32_bits

from .vexp import fma32


@njit(cache=True, inline="always")
def f16_round(v):
    # float32 -> nearest IEEE half (ties to even) -> float32; numba has no float16 scalars.  The
    # same value as F16_TO_F32[f32_to_f16(v)], formed on the float itself (no table lookup: it is
    # every Q8_0 activation block's scale): a half keeps 10 of the 23 mantissa bits of a normal,
    # and is a multiple of 2**-24 below 2**-14.
    f = np.float32(v)
    a = abs(f)
    if a < np.float32(6.103515625e-05):  # half subnormals: fixed step 2**-24 (rint: ties to even)
        return np.float32(np.rint(f * np.float32(16777216.0)) / np.float32(16777216.0))
    if not a < np.float32(65520.0):  # rounds past 65504 to +-inf; NaN stays NaN
        return f if a != a else np.float32(np.copysign(np.float32(np.inf), f))
    b = f32_bits(f)  # 13 bits dropped, ties to even; a carry into the exponent is the right value
    return bits_f32(np.uint32((b + np.uint32(0x0FFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)))


@njit(cache=True)
def round_f16(x):
    # x: contiguous f32 array of any shape, rounded in place to the nearest half (ties to even).
    # llama.cpp keeps K/V in f16 and rounds Q and the softmax weights to f16 for its products.
    flat = x.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] = f16_round(flat[i])


@njit(cache=True)
def rms_scale(x, eps):
    # x: (D,) f32 -> 1/sqrt(mean(x*x) + eps) with ggml's arithmetic: float32 squares summed in double,
    # a float32 mean, float32 sqrt and division. Normalized activations reach hundreds on Gemma, so a
    # 1-ulp difference here flips a Q8 activation rounding downstream; no fastmath.
    D = x.shape[0]
    s = 0.0
    for i in range(D):
        s += np.float32(x[i] * x[i])
    mean = np.float32(s / D)
    return np.float32(1.0) / np.float32(math.sqrt(np.float32(mean + eps)))


@njit(cache=True)
def _rmsnorm_row(x, w, eps, out):
    # x, out: (D,) f32 (out may alias x); w: (D,) f32 -- one row, with ggml's arithmetic (rms_scale)
    scale = rms_scale(x, eps)
    for i in range(x.shape[0]):
        out[i] = np.float32(x[i] * scale) * w[i]


@njit(cache=True)
def rmsnorm(x, w, eps, out):
    # x: (T, D) f32; w: (D,) f32; out: (T, D) f32 (may alias x)
    for t in range(x.shape[0]):
        _rmsnorm_row(x[t], w, eps, out[t])


@njit(cache=True)
def rope_cache(positions, n_rot, base, pos_scale, freq_factors, mscale, ext_factor, corr_lo, corr_hi, cos_out, sin_out):
    # positions: (T,) int32; freq_factors: (n_rot/2,) f32 (ones when the model has none)
    # mscale: multiplies cos and sin (rope.scaling.attn_factor, LongRoPE's magnitude; else 1)
    # ext_factor, corr_lo, corr_hi: YaRN (ggml's rope_yarn): pair i's angle mixes the scaled
    #   (interpolated) and the unscaled (extrapolated) one by a ramp over pairs corr_lo..corr_hi,
    #   and cos/sin grow by 1 + 0.1 ln(1/pos_scale); ext_factor 0: plain (linear) scaling
    # cos_out, sin_out: (T, n_rot/2) f32
    # theta is advanced by repeated float32 multiplication, as ggml does, so angles match llama.cpp.
    theta_scale = np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot))
    m = np.float32(mscale)
    if ext_factor != 0.0:
        m = np.float32(m * (np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / np.float32(pos_scale))))
    span = max(np.float32(0.001), np.float32(corr_hi) - np.float32(corr_lo))
    for t in range(positions.shape[0]):
        theta = np.float32(positions[t])
        for i in range(n_rot // 2):
            extrap = theta / freq_factors[i]
            angle = np.float32(pos_scale) * extrap
            if ext_factor != 0.0:
                y = (np.float32(i) - np.float32(corr_lo)) / span
                mix = (np.float32(1.0) - min(np.float32(1.0), max(np.float32(0.0), y))) * np.float32(ext_factor)
                angle = angle * (np.float32(1.0) - mix) + extrap * mix
            cos_out[t, i] = np.float32(np.cos(angle)) * m
            sin_out[t, i] = np.float32(np.sin(angle)) * m
            theta = np.float32(theta * theta_scale)


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """The pairs YaRN's ramp runs over (ggml_rope_yarn_corr_dims, in its float32 arithmetic): from the
    pair turning beta_fast times over the original context to the one turning beta_slow times."""
    f32 = np.float32

    def corr_dim(turns: float) -> np.float32:
        return f32(n_rot) * np.log(f32(n_ctx_orig) / (f32(turns) * f32(2) * f32(math.pi))) / (f32(2) * np.log(f32(base)))

    return float(max(0.0, np.floor(corr_dim(beta_fast)))), float(min(n_rot - 1.0, np.ceil(corr_dim(beta_slow))))


def rope_angles(cfg: Any, positions: np.ndarray, swa: bool, freq_factors: np.ndarray, cos_out: np.ndarray,
                sin_out: np.ndarray) -> None:
    """The cos and sin of a batch's positions for the global layers (swa False) or the sliding-window
    ones, from the model's RoPE settings: what both the cpu and the mlx backend rotate by."""
    base, scale = (cfg.rope_base_swa, cfg.rope_scale_swa) if swa else (cfg.rope_base, cfg.rope_scale)
    n_rot = 2 * cos_out.shape[1]  # the layers' rotated dims (Gemma 4's sliding-window layers have their own)
    lo, hi = yarn_corr_dims(n_rot, cfg.n_ctx_orig, base, cfg.yarn_beta_fast, cfg.yarn_beta_slow)
    rope_cache(positions, n_rot, base, scale, freq_factors, cfg.rope_attn_factor, cfg.rope_ext_factor, lo, hi,
               cos_out, sin_out)


@njit(cache=True, inline="always")
def _rotate(x, i, j, c, s):
    # x[i], x[j] rotated by the angle of cos c, sin s as llama.cpp's compiled rotate_pairs computes
    # x0*c - x1*s and x0*s + x1*c: the compiler contracts each first product into a fused
    # multiply-add with the second rounded (GCC's -ffp-contract=fast with FMA, clang's fmuladd),
    # so ggml's Q and K are fma(x0, c, -(x1*s)) and fma(x0, s, x1*c), bit for bit
    a = x[i]
    b = x[j]
    x[i] = fma32(a, c, -(b * s))
    x[j] = fma32(a, s, b * c)


@njit(cache=True)
def heads_post(src, bias, norm, eps, cos_t, sin_t, rot, late_norm, neox, scale, dst):
    # One token's Q, K or V: dst (H, hd) = rope(norm(src + bias)) * scale, each step optional:
    # bias (H*hd,) or (0,); norm (hd,): RMSNorm over each head, (H*hd,) (H > 1): over the whole
    # projection before it is split into heads (olmo2), or (0,); rot: apply RoPE (cos_t, sin_t: (n_rot/2,));
    # late_norm: the per-head norm after RoPE instead (llama4's L2 norm: rotations keep the sum of
    # squares only up to rounding, so the order shows)
    # No fastmath: with it LLVM chose which products to fuse, differently as the code around it
    # compiled (a fresh compile and numba's cached one differed), and numba compiles the norm it
    # calls with the caller's flags
    H, D = dst.shape
    for h in range(H):
        for i in range(D):
            v = src[h * D + i]
            if bias.shape[0] > 0:
                v += bias[h * D + i]
            dst[h, i] = v
    if H > 1 and norm.shape[0] == H * D:
        flat = dst.reshape(H * D)
        _rmsnorm_row(flat, norm, eps, flat)
    for h in range(H):
        if norm.shape[0] == D and not late_norm:
            _rmsnorm_row(dst[h], norm, eps, dst[h])
        if rot:
            half = cos_t.shape[0]
            row = dst[h]
            if neox:
                for i in range(half):
                    _rotate(row, i, i + half, cos_t[i], sin_t[i])
            else:
                for i in range(half):
                    _rotate(row, 2 * i, 2 * i + 1, cos_t[i], sin_t[i])
        if norm.shape[0] == D and late_norm:
            _rmsnorm_row(dst[h], norm, eps, dst[h])
        if scale != 1.0:
            for i in range(D):
                dst[h, i] *= scale


@njit(cache=True)
def fwht(x, n):
    # x: (m * n,) f32 in place: each run of n (a power of two) times the orthonormal Walsh-Hadamard
    # matrix, as llama.cpp's ggml_compute_forward_fwht does it: scaled by 1/sqrt(n) first, then the
    # butterflies (u + v, u - v) for strides 1, 2, 4, ... (its SIMD passes do the same operations)
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(n)))
    for i in range(x.shape[0]):
        x[i] *= scale
    for c in range(0, x.shape[0], n):
        step = 1
        while step < n:
            for i in range(c, c + n, 2 * step):
                for j in range(i, i + step):
                    u = x[j]
                    v = x[j + step]
                    x[j] = u + v
                    x[j + step] = u - v
            step *= 2


PAR_ROWS_MIN = 8  # from this many rows on, residual_norm runs in parallel


@njit(cache=True, parallel=True)  # no fastmath: numba would compile rms_scale's sum with it
def residual_norm(x, o, post_norm, eps, scale, next_norm, xn):
    # After a block: x += scale * norm(o) (o normalized in place by post_norm unless it is (0,)), then
    # xn = norm(x) by next_norm, the input of the next block (x itself where next_norm is (0,)).
    # x, o, xn: (T, D) f32; norms: (D,) or (0,) f32; scale: the residual scale (granite; else 1)
    # Rows in parallel when there are many: each row's norm is a chain of float64 adds (ggml's order)
    T = x.shape[0]
    if T >= PAR_ROWS_MIN:
        for t in prange(T):
            _residual_row(x[t], o[t], post_norm, eps, scale, next_norm, xn[t])
    else:  # a parallel region costs more than a few rows
        for t in range(T):
            _residual_row(x[t], o[t], post_norm, eps, scale, next_norm, xn[t])


@njit(cache=True)
def _residual_row(x, o, post_norm, eps, scale, next_norm, xn):
    # residual_norm of one row: x, o, xn (D,) f32
    if post_norm.shape[0] > 0:
        _rmsnorm_row(o, post_norm, eps, o)
    if scale != 1.0:
        for i in range(x.shape[0]):
            o[i] *= scale
    for i in range(x.shape[0]):
        x[i] += o[i]
    if next_norm.shape[0] > 0:
        _rmsnorm_row(x, next_norm, eps, xn)
    else:
        xn[:] = x


@njit(cache=True)
def embed(key, raw, tokens, scale, out):
    # key: the rows' StaticType; tokens: (T,) int32; raw: (V, row_bytes) uint8 embedding rows; out: (T, D) f32 = rows * scale
    for t in range(tokens.shape[0]):
        dequant_static(key, raw[tokens[t]], out[t])
        if scale != 1.0:
            for i in range(out.shape[1]):
                out[t, i] *= scale


@njit(cache=True)
def softcap(x, cap):
    # x: (T, V) f32 in place: cap * tanh(x / cap)
    T, V = x.shape
    for t in range(T):
        for i in range(V):
            x[t, i] = cap * math.tanh(x[t, i] / cap)


@njit(cache=True)
def sigmoid_gate(a, gate):
    # a: (T, N) f32, multiplied in place by sigmoid(gate); gate: (T, N) f32 (a view of the Q|K|V|gate
    # products). ggml's sigmoid, 1 / (1 + expf(-x)), then its mul (Qwen3.5's gated attention)
    for t in range(a.shape[0]):
        for i in range(a.shape[1]):
            a[t, i] = a[t, i] * (np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-gate[t, i]))))


@njit(cache=True)
def _layer_norm_row(x, w, b, eps, out):
    # x, out: (D,) f32 (out may alias x); w, b: (D,) f32. ggml_norm's arithmetic (the mean and the
    # variance of x - mean summed in double, float32 otherwise), then times w plus b
    D = x.shape[0]
    s = 0.0
    for i in range(D):
        s += x[i]
    mean = np.float32(s / D)
    v = 0.0
    for i in range(D):
        y = np.float32(x[i] - mean)
        out[i] = y
        v += np.float32(y * y)
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(np.float32(v / D) + eps)))
    for i in range(D):
        out[i] = np.float32(out[i] * scale) * w[i] + b[i]


@njit(cache=True, parallel=True)
def residual_layer_norm(x, o, w, b, eps):
    # x: (T, D) f32 in place = LayerNorm(x + o) * w + b; o: (T, D) f32 ((0, D): none, x alone);
    # w, b: (D,) f32 (the BERT family's norms, each with its bias)
    for t in prange(x.shape[0]):
        if o.shape[0]:
            for i in range(x.shape[1]):
                x[t, i] += o[t, i]
        _layer_norm_row(x[t], w, b, eps, x[t])


@njit(cache=True)
def add_rows(x, table, rows, row):
    # x: (T, D) f32 += table[rows[t]] (table: (N, D) f32; rows: (T,) int32; (0, D) table: none) and
    # += row (D,) f32 ((0,): none): the BERT family's position embeddings and token type 0's row,
    # added in llama.cpp's order (the type row to the token's, then the position's to that)
    for t in range(x.shape[0]):
        if row.shape[0]:
            for i in range(x.shape[1]):
                x[t, i] += row[i]
        if table.shape[0]:
            r = rows[t]
            for i in range(x.shape[1]):
                x[t, i] = table[r, i] + x[t, i]
