"""Mamba-2's mixer after its in-projection (llama.cpp's build_mamba2_layer from the causal
convolution to the grouped norm; granitehybrid's recurrent layers), as ggml's CPU backend computes
it: one pure kernel over caller-provided arrays, so a decode step allocates nothing.

The in-projection gives per token z (I = H * P: H heads of P), xBC (C = I + 2 G N: x, then B and
C of G groups of N) and dt (H).
1. The depthwise causal convolution of width L over xBC (ggml_ssm_conv, a float32 sum per
   channel, oldest input first), plus its bias, then SiLU (ggml_vec_silu_f32); the inputs before a
   sequence's first token in the batch come from its "conv" state, and before position 0 are zero
   (so a slot needs no reset: shortconv.py's rule).
2. The selective scan (ggml_ssm_scan with a scalar A per head), per head h of group
   h // (H / G), over its (P, N) state: dt' = softplus(dt + dt_bias), dA = exp(dt' A);
   s = s dA + B (x dt'); y = s . C. A sequence that starts at position 0 starts from a zero state.
   Bit for bit as ggml's AVX-512 build (checked against its ssm_scan: tests/test_mamba.py): the
   compiler fuses the update into fma(s, dA, B * x dt'), in the vector loop and the scalar tail
   alike; y's sum over N runs the whole steps of 64 in four 16-lane chains of fused multiply-adds
   (GGML_F32_STEP), the chains added (0 + 2, 1 + 3, then those) and their lanes halved down to one
   (GGML_F32x16_REDUCE), then the rest of N one fused step at a time.
3. y + x D (ggml_mul, then ggml_add), times SiLU(z) (ggml_swiglu_split over rows of P), then
   RMSNorm over each of the G groups of I / G times the norm weight (the grouped norm).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .delta_net import silu_row
from .elementwise import rms_scale
from .shortconv import keep_last_inputs, seq_spans
from .vexp import expf_row, fma32

_SILU_WIDTH = 16  # ggml_vec_swiglu_f32's vector (AVX-512): a row's tail past its last whole 16 takes expf
_LANES = 16  # ggml_ssm_scan's vector (AVX-512's GGML_F32_EPR) ...
_STEP = 4 * _LANES  # ... four of them a step (GGML_F32_STEP)
_ONE = np.float32(1.0)


@njit(cache=True, parallel=True, error_model="numpy")
def mamba2(proj, conv_w, conv_b, dt_bias, ssm_a, ssm_d, norm_w, eps, n_group, conv_state, state, slots, tok_seq,
           positions, first, count, xc, e, lanes, y):
    # proj: (T, I + C + H) f32 the in-projection: z (I = H P), xBC (C = I + 2 G N), dt (H)
    # conv_w: (L, C) f32 the convolution's kernel, oldest input first (the GGUF's (C, L) transposed)
    # conv_b: (C,) f32; dt_bias, ssm_a, ssm_d: (H,) f32; norm_w: (I,) f32 the grouped norm's weight
    # eps: f32 the model's RMS epsilon; n_group: G
    # conv_state: (n_slots, L - 1, C) f32 this layer's last xBC inputs of each slot, read then updated in place
    # state: (n_slots, H, P, N) f32 this layer's scan states, read then updated in place
    # slots: (S_seq,) int32 the state slot of each table row's sequence
    # tok_seq, positions: (T,) int32 each token's table row and position
    # first, count: (>= S_seq,) int32 scratch (shortconv.seq_spans)
    # xc: (T, C) f32 scratch: the convolution's output after SiLU
    # e: (T, C) f32 scratch (SiLU's exponentials)
    # lanes: (H, 64) f32 scratch: each head's vector chains of y's sum
    # y: (T, I) f32 out: the gated, normed scan output
    T, C, L = proj.shape[0], conv_w.shape[1], conv_w.shape[0]
    H, P = state.shape[1], state.shape[2]
    G = n_group
    inner = H * P
    seq_spans(tok_seq, positions, first, count)
    # 1. convolution, bias and SiLU
    for t in prange(T):
        s = tok_seq[t]
        p, f = positions[t], first[s]
        p0 = positions[f]
        slot = slots[s]
        row = xc[t]
        for c in range(C):
            row[c] = 0.0
        for i in range(L):
            q = p - (L - 1) + i
            if q < 0:
                continue
            w = conv_w[i]
            if q >= p0:
                src = proj[f + q - p0, inner:inner + C]
            else:
                src = conv_state[slot, q - p0 + L - 1]
            for c in range(C):
                row[c] = fma32(src[c], w[c], row[c])
        for c in range(C):
            row[c] = row[c] + conv_b[c]
        silu_row(row, e[t], row)
    # the convolution's state: each sequence's last L - 1 inputs
    n_seq = slots.shape[0]
    for s in prange(n_seq):
        if count[s]:
            keep_last_inputs(proj[:, inner:inner + C], first[s], positions[first[s]], count[s], conv_state[slots[s]])
    # 2. the scan (and y + x D)
    ssm_scan(xc, proj[:, inner + C:], dt_bias, ssm_a, ssm_d, G, state, slots, positions, first, count, lanes, y)
    # 3. times SiLU(z) per head's row of P (whole 16s the vector way, the tail by expf; e's row t
    # is spent, its first I columns take exp(-z)), then the grouped RMSNorm times its weight
    V = P - P % _SILU_WIDTH
    width = inner // G
    for t in prange(T):
        z = proj[t, :inner]
        ez = e[t, :inner]
        for h in range(H):
            expf_row(z[h * P:h * P + V], True, np.float32(0.0), ez[h * P:h * P + V])
            for j in range(h * P + V, (h + 1) * P):
                ez[j] = np.float32(math.exp(-z[j]))
        o = y[t]
        for j in range(inner):
            o[j] = (z[j] / (_ONE + ez[j])) * o[j]
        for gg in range(G):
            og = o[gg * width:(gg + 1) * width]
            scale = rms_scale(og, eps)
            for j in range(width):
                og[j] = np.float32(og[j] * scale) * norm_w[gg * width + j]


@njit(cache=True, parallel=True, error_model="numpy")
def ssm_scan(xc, dt, dt_bias, ssm_a, ssm_d, n_group, state, slots, positions, first, count, lanes, y):
    # ggml_ssm_scan (Mamba-2: a scalar A per head) plus x D, per sequence and in parallel over its
    # heads, its tokens in order, bit for bit as ggml's AVX-512 build: the state's update compiled
    # to fma(s, dA, B * x dt'); y's sum over N in its vector lanes for whole steps of 64, the rest
    # one fused step at a time (the module docstring).
    # xc: (T, I + 2 G N) f32 x | B | C of each token; dt: (T, H) f32 (a view)
    # dt_bias, ssm_a, ssm_d: (H,) f32; n_group: G
    # state: (n_slots, H, P, N) f32 read then updated in place; slots: (S_seq,) int32
    # positions: (T,) int32; first, count: (>= S_seq,) int32 each sequence's rows (shortconv.seq_spans)
    # lanes: (H, 64) f32 scratch; y: (T, H P) f32 out
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    G = n_group
    inner = H * P
    per_group = H // G
    n_vec = N - N % _STEP
    for s in range(slots.shape[0]):
        n = count[s]
        if n == 0:
            continue
        f = first[s]
        for h in prange(H):
            st = state[slots[s], h]
            acc = lanes[h]
            if positions[f] == 0:
                for i in range(P):
                    for j in range(N):
                        st[i, j] = 0.0
            g = h // per_group
            for t in range(f, f + n):
                B = xc[t, inner + g * N:inner + (g + 1) * N]
                Cm = xc[t, inner + G * N + g * N:inner + G * N + (g + 1) * N]
                d = np.float32(dt[t, h] + dt_bias[h])
                sp = d if d > np.float32(20.0) else np.float32(math.log(_ONE + np.float32(math.exp(d))))
                dA = np.float32(math.exp(np.float32(sp * ssm_a[h])))
                for i in range(P):
                    x = xc[t, h * P + i]
                    x_dt = np.float32(x * sp)
                    row = st[i]
                    for j in range(N):
                        row[j] = fma32(row[j], dA, np.float32(B[j] * x_dt))
                    total = np.float32(0.0)
                    if n_vec:
                        for k in range(_STEP):
                            acc[k] = 0.0
                        for m in range(0, n_vec, _STEP):
                            for k in range(_STEP):
                                acc[k] = fma32(row[m + k], Cm[m + k], acc[k])
                        # GGML_F32x16_REDUCE: the four vectors (0 + 2, 1 + 3, then those), then
                        # _mm512_reduce_add_ps: lane i plus lane i + w, w halving
                        for k in range(_LANES):
                            acc[k] = (acc[k] + acc[2 * _LANES + k]) + (acc[_LANES + k] + acc[3 * _LANES + k])
                        w = _LANES // 2
                        while w >= 1:
                            for k in range(w):
                                acc[k] = acc[k] + acc[k + w]
                            w //= 2
                        total = acc[0]
                    for j in range(n_vec, N):
                        total = fma32(row[j], Cm[j], total)
                    y[t, h * P + i] = total + np.float32(x * ssm_d[h])
