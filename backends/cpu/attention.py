"""Causal (optionally sliding-window) grouped-query attention over a contiguous KV cache."""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .ops import round_f16


@njit(cache=True, fastmath=True, parallel=True)
def attention(q, k_cache, v_cache, q_pos, window, scale, softcap, out, scores):
    # q: (T, Hq, D) f32, rounded to f16 values like K and V; scale multiplies q·k; k_cache: (S, Hkv, D) f32; v_cache: (S, Hkv, Dv) f32,
    #   cache row p holds the key/value of position p
    # q_pos: (T,) int32 position of each query; keys 0..q_pos[t] are visible (causal)
    # window: 0 or the sliding window (key p visible iff q_pos - p < window)
    # out: (T, Hq, Dv) f32; scores: (n_chunks, S) f32 scratch, one row per parallel chunk
    T, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    Dv = v_cache.shape[2]
    group = Hq // Hkv
    n_work = T * Hq
    n_chunks = min(scores.shape[0], n_work)
    per = (n_work + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        s = scores[c]
        for w in range(c * per, min(n_work, (c + 1) * per)):
            t = w // Hq
            h = w % Hq
            kh = h // group
            hi = q_pos[t]
            lo = 0
            if window > 0 and hi - window + 1 > 0:
                lo = hi - window + 1
            m = np.float32(-np.inf)
            for p in range(lo, hi + 1):
                acc = np.float32(0.0)
                for i in range(D):
                    acc += q[t, h, i] * k_cache[p, kh, i]
                acc *= scale
                if softcap > 0:
                    acc = softcap * np.float32(math.tanh(acc / softcap))
                s[p] = acc
                if acc > m:
                    m = acc
            total = np.float32(0.0)
            for p in range(lo, hi + 1):
                e = np.float32(math.exp(s[p] - m))
                s[p] = e
                total += e
            inv = np.float32(1.0) / total
            for p in range(lo, hi + 1):
                s[p] *= inv
            round_f16(s[lo:hi + 1])  # llama.cpp multiplies V (f16) by the weights rounded to f16
            for i in range(Dv):
                out[t, h, i] = 0.0
            for p in range(lo, hi + 1):
                wgt = s[p]
                for i in range(Dv):
                    out[t, h, i] += wgt * v_cache[p, kh, i]
