"""Qwen3.5's gated delta net after its input products (llama.cpp's build_layer_attn_linear from
the causal convolution to the gated norm), as ggml's CPU backend computes it: one pure kernel over
caller-provided arrays, so a decode step allocates nothing.

1. The depthwise causal convolution of width L over Q|K|V (ggml_ssm_conv, a float32 sum per
   channel, oldest input first), then SiLU (ggml_vec_silu_f32); the inputs before a sequence's
   first token in the batch come from its "conv" state, and before position 0 are zero (so a slot
   needs no reset: shortconv.py's rule).
2. Q and K L2-normalized per key head (llama.cpp's build_gdn_l2_norm: rms_norm with eps / S, then
   times 1 / sqrt(S)).
3. The gated delta rule (ggml_compute_forward_gated_delta_net, which llama.cpp's CPU backend runs
   for prompts and single tokens alike: the fused op), per value head h with key head h % H_k
   (Qwen3.5's tiling; Qwen3-Next's grouping: h // (H_v / H_k)), over
   the state M (S x S, M[j, i]: value component j, key component i): M *= exp(g); d = (v - M k) *
   beta; M += d k^T; o = M q / sqrt(S). g = softplus(alpha + dt_bias) * A, beta = sigmoid(beta).
   A sequence that starts at position 0 starts from a zero state.
4. RMSNorm of each head's output times the norm weight, times SiLU(z) (build_norm_gated).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .elementwise import rms_scale
from .shortconv import causal_conv_row, keep_last_inputs, seq_spans
from .vexp import expf_row, fma32

_SILU_WIDTH = 16  # ggml_vec_silu_f32's vector (AVX-512): the tail of a row past its last whole 16 takes expf
_ONE = np.float32(1.0)


@njit(cache=True, inline="always", error_model="numpy")
def silu_row(x, e, out):
    # x, e, out: (n,) f32; out = silu(x) as ggml_vec_silu_f32 (e: scratch, exp(-x)); out may be x
    n = x.shape[0]
    V = n - n % _SILU_WIDTH
    expf_row(x[:V], True, np.float32(0.0), e[:V])
    for i in range(V):
        out[i] = x[i] / (_ONE + e[i])
    for i in range(V, n):
        v = x[i]
        out[i] = v / (_ONE + np.float32(math.exp(-v)))


@njit(cache=True, parallel=True, error_model="numpy")
def delta_net(proj, conv_w, dt_bias, ssm_a, norm_w, eps, n_k_heads, k_repeat, conv_state, state, slots, tok_seq, positions,
              first, count, xc, e, y):
    # proj: (T, C + I + 2 Hv) f32 the input products side by side: Q|K|V (C = 2 Hk S + I), z (I = Hv S),
    #   beta's and alpha's logits (Hv each)
    # conv_w: (L, C) f32 the convolution's kernel, oldest input first (the GGUF's (C, L) transposed)
    # dt_bias, ssm_a: (Hv,) f32; norm_w: (S,) f32; eps: f32 the model's RMS epsilon; n_k_heads: Hk
    # k_repeat: value head h reads key head (h // k_repeat) % Hk: 1 where the V heads are tiled over
    #   the key heads (Qwen3.5), Hv / Hk where they are grouped by key head (Qwen3-Next)
    # conv_state: (n_slots, L - 1, C) f32 this layer's last inputs of each slot, read then updated in place
    # state: (n_slots, Hv, S, S) f32 this layer's delta-rule matrices, read then updated in place
    # slots: (S_seq,) int32 the state slot of each table row's sequence
    # tok_seq, positions: (T,) int32 each token's table row and position
    # first, count: (>= S_seq,) int32 scratch (shortconv.seq_spans)
    # xc: (T, C) f32 scratch: the convolution's output, Q and K normalized in place
    # e: (T, C) f32 scratch (SiLU's exponentials)
    # y: (T, I) f32 out: the gated norm of each head's output
    T, C = proj.shape[0], conv_w.shape[1]
    Hv, S = state.shape[1], state.shape[2]
    Hk = n_k_heads
    inner = Hv * S
    key_dim = Hk * S
    seq_spans(tok_seq, positions, first, count)
    # 1. convolution and SiLU
    for t in prange(T):
        s = tok_seq[t]
        p, f = positions[t], first[s]
        p0 = positions[f]
        slot = slots[s]
        row = xc[t]
        causal_conv_row(proj, conv_state, slot, f, p, p0, conv_w, row)
        silu_row(row, e[t], row)
        # 2. Q and K L2-normalized per key head
        eps_l2 = np.float32(eps / np.float32(S))
        inv = np.float32(1.0) / np.float32(math.sqrt(np.float32(S)))
        for hh in range(2 * Hk):
            x = row[hh * S:(hh + 1) * S]
            scale = rms_scale(x, eps_l2)
            for i in range(S):
                x[i] = np.float32(x[i] * scale) * inv
    # the convolution's state: each sequence's last L - 1 inputs
    n_seq = slots.shape[0]
    for s in prange(n_seq):
        if count[s]:
            keep_last_inputs(proj, first[s], positions[first[s]], count[s], conv_state[slots[s]])
    # 3. the delta rule, per (sequence, value head), its tokens in order
    q_scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(S)))
    for sh in prange(n_seq * Hv):
        s = sh // Hv
        h = sh % Hv
        n = count[s]
        if n == 0:
            continue
        f = first[s]
        M = state[slots[s], h]
        if positions[f] == 0:
            for j in range(S):
                for i in range(S):
                    M[j, i] = 0.0
        kh = (h // k_repeat) % Hk
        for t in range(f, f + n):
            qv = xc[t, kh * S:(kh + 1) * S]
            kv = xc[t, key_dim + kh * S:key_dim + (kh + 1) * S]
            vv = xc[t, 2 * key_dim + h * S:2 * key_dim + (h + 1) * S]
            out = y[t, h * S:(h + 1) * S]
            b = proj[t, C + inner + h]
            beta = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-b)))
            ab = np.float32(proj[t, C + inner + Hv + h] + dt_bias[h])
            sp = ab if ab > np.float32(20.0) else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(ab))))
            decay = np.float32(math.exp(np.float32(sp * ssm_a[h])))
            for j in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    M[j, i] = M[j, i] * decay
                    acc = fma32(M[j, i], kv[i], acc)
                out[j] = np.float32(vv[j] - acc) * beta  # the delta, until the output replaces it
            for j in range(S):
                d = out[j]
                acc = np.float32(0.0)
                for i in range(S):
                    M[j, i] = fma32(kv[i], d, M[j, i])
                    acc = fma32(M[j, i], qv[i], acc)
                out[j] = acc * q_scale
    # 4. RMSNorm per head times the weight, times SiLU(z) (z's rows of S as ggml's silu takes
    # them: whole 16s the vector way, the tail by expf); e's row t is spent, its h-th S columns
    # hold exp(-z) of head h (C > I, so they exist)
    V = S - S % _SILU_WIDTH
    for th in prange(T * Hv):
        t = th // Hv
        h = th % Hv
        o = y[t, h * S:(h + 1) * S]
        z = proj[t, C + h * S:C + (h + 1) * S]
        ez = e[t, h * S:(h + 1) * S]
        expf_row(z[:V], True, np.float32(0.0), ez[:V])
        for j in range(V, S):
            ez[j] = np.float32(math.exp(-z[j]))
        scale = rms_scale(o, eps)
        for j in range(S):
            o[j] = np.float32(o[j] * scale) * norm_w[j] * (z[j] / (_ONE + ez[j]))
