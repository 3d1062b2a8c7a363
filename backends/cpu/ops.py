"""Elementwise and normalization kernels. Each writes into caller-provided arrays."""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True)
def f16_round(v):
    # float32 -> nearest IEEE half (ties to even) -> float32; numba has no float16 scalars.
    a = abs(v)
    if a == 0 or a != a:
        return np.float32(v)
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    ulp_exp = max(e - 11, -24)  # 11 significant bits; subnormal halves have a fixed 2**-24 step
    r = math.ldexp(np.rint(math.ldexp(a, -ulp_exp)), ulp_exp)
    if r > 65504.0:
        r = np.inf
    return np.float32(r if v > 0 else -r)


@njit(cache=True)
def round_f16(x):
    # x: contiguous f32 array of any shape, rounded in place to the nearest half (ties to even).
    # llama.cpp keeps K/V in f16 and rounds Q and the softmax weights to f16 for its products.
    flat = x.reshape(-1)
    u = flat.view(np.uint32)
    for i in range(flat.shape[0]):
        if abs(flat[i]) < np.float32(6.103515625e-05):  # half subnormals: fixed step 2**-24
            flat[i] = np.float32(np.rint(flat[i] * np.float32(16777216.0)) / np.float32(16777216.0))
        else:
            b = u[i]
            u[i] = (b + np.uint32(0x0FFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)


@njit(cache=True, fastmath=True)
def rmsnorm(x, w, eps, out):
    # x: (T, D) f32; w: (D,) f32; out: (T, D) f32 (may alias x)
    T, D = x.shape
    for t in range(T):
        ss = np.float32(0.0)
        for i in range(D):
            ss += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.float32(math.sqrt(ss / D + eps))
        for i in range(D):
            out[t, i] = x[t, i] * scale * w[i]


@njit(cache=True, fastmath=True)
def rmsnorm_heads(x, w, eps):
    # x: (T, H, D) f32, normalized in place per head; w: (D,) f32
    T, H, D = x.shape
    for t in range(T):
        for h in range(H):
            ss = np.float32(0.0)
            for i in range(D):
                ss += x[t, h, i] * x[t, h, i]
            scale = np.float32(1.0) / np.float32(math.sqrt(ss / D + eps))
            for i in range(D):
                x[t, h, i] = x[t, h, i] * scale * w[i]


@njit(cache=True)
def rope_cache(positions, n_rot, base, pos_scale, freq_factors, cos_out, sin_out):
    # positions: (T,) int32; freq_factors: (n_rot/2,) f32 (ones when the model has none)
    # cos_out, sin_out: (T, n_rot/2) f32
    # theta is advanced by repeated float32 multiplication, as ggml does, so angles match llama.cpp.
    theta_scale = np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot))
    for t in range(positions.shape[0]):
        theta = np.float32(positions[t])
        for i in range(n_rot // 2):
            angle = np.float32(pos_scale) * (theta / freq_factors[i])
            cos_out[t, i] = np.cos(angle)
            sin_out[t, i] = np.sin(angle)
            theta = np.float32(theta * theta_scale)


@njit(cache=True, fastmath=True)
def rope(x, cos_t, sin_t, neox):
    # x: (T, H, D) f32 rotated in place over its first 2*cos_t.shape[1] dims
    # cos_t, sin_t: (T, n_rot/2) f32 from rope_cache
    T, H, D = x.shape
    half = cos_t.shape[1]
    for t in range(T):
        for h in range(H):
            if neox:
                for i in range(half):
                    a = x[t, h, i]
                    b = x[t, h, i + half]
                    x[t, h, i] = a * cos_t[t, i] - b * sin_t[t, i]
                    x[t, h, i + half] = a * sin_t[t, i] + b * cos_t[t, i]
            else:
                for i in range(half):
                    a = x[t, h, 2 * i]
                    b = x[t, h, 2 * i + 1]
                    x[t, h, 2 * i] = a * cos_t[t, i] - b * sin_t[t, i]
                    x[t, h, 2 * i + 1] = a * sin_t[t, i] + b * cos_t[t, i]


@njit(cache=True, fastmath=True, parallel=True)
def gated_act(gate, up, gelu, out):
    # gate, up, out: (T, F) f32; out = act(gate) * up
    T, F = gate.shape
    for t in prange(T):
        for i in range(F):
            g = gate[t, i]
            if gelu:
                # tanh approximation through an f16 table, as ggml_gelu: f16(gelu(f16(g))), exact outside ±10
                if g <= -10.0:
                    a = np.float32(0.0)
                elif g >= 10.0:
                    a = g
                else:
                    h = f16_round(g)
                    a = f16_round(np.float32(0.5) * h * (np.float32(1.0) + np.float32(math.tanh(
                        np.float32(0.7978845608028654) * h * (np.float32(1.0) + np.float32(0.044715) * h * h)))))
            else:
                a = g / (np.float32(1.0) + np.float32(math.exp(-g)))
            out[t, i] = a * up[t, i]


@njit(cache=True, fastmath=True)
def add_into(x, y):
    # x, y: (T, D) f32; x += y
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            x[t, i] += y[t, i]


@njit(cache=True, fastmath=True)
def add_bias(x, b):
    # x: (T, D) f32; b: (D,) f32
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            x[t, i] += b[i]


@njit(cache=True)
def softcap(x, cap):
    # x: (T, V) f32 in place: cap * tanh(x / cap)
    T, V = x.shape
    for t in range(T):
        for i in range(V):
            x[t, i] = cap * math.tanh(x[t, i] / cap)
