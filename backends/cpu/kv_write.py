"""The step between the Q/K/V products and attention: biases, norms, RoPE, and K and V written to
the paged cache in its type (kv_pool.py), with Q prepared for the products with that K
(attention.py reads them):
- an f16 K or V: rounded to the nearest half;
- a q8_0 K or V: q8_0 blocks written by the quantizer of llama.cpp's q8_0 activations;
- Q, after K's type: rounded to f16 for an f16 K (llama.cpp's f16 vec_dot), quantized to q8_0 for
  a q8_0 K (its q8_0 x q8_0 vec_dot).
The writers dispatch on the cache's dtypes at compile time (numba overloads).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from infer.quant.halves import f32_to_f16

from .activations import ACT_Q8_0, quantize_row
from .elementwise import fwht, heads_post, round_f16
from .kv_pool import Q8_0_BLOCK as Q8
from .kv_pool import Q8_0_BYTES as Q8_BYTES


def kv_store(x, dxb, bsum, dst):
    """dst = x in the cache's type. x: (n,) f32 (overwritten with q8_0 quants for a q8_0 cache);
    dst: (n,) uint16 f16 bits, or (n // 32 * 34,) uint8 q8_0 blocks; dxb, bsum: (n // 16,) f32 scratch."""


@overload(kv_store)
def _kv_store(x, dxb, bsum, dst):
    if dst.dtype == types.uint16:
        def f16(x, dxb, bsum, dst):
            for i in range(x.shape[0]):  # rounded to the nearest half as it converts
                dst[i] = f32_to_f16(x[i])
        return f16

    def q8_0(x, dxb, bsum, dst):
        # llama.cpp writes a q8_0 cache with the quantizer of its q8_0 activations (quantize_row_q8_0)
        quantize_row(ACT_Q8_0, x, x, dxb, bsum)
        for b in range(x.shape[0] // Q8):
            o = b * Q8_BYTES
            d = f32_to_f16(dxb[2 * b])  # an f16 value already: exact
            dst[o] = np.uint8(d & np.uint16(0xFF))
            dst[o + 1] = np.uint8(d >> np.uint16(8))
            for i in range(Q8):
                dst[o + 2 + i] = np.uint8(np.int32(x[b * Q8 + i]) & 0xFF)
    return q8_0


def prepare_q(q, qd, bsum, k_rows):
    """Q as the products with the cache's K take it. q: (n,) f32 in place; for f16 K rounded to f16,
    for q8_0 K replaced by its q8_0 quants with their scales in qd (n // 16,) f32 (bsum: scratch)."""


@overload(prepare_q)
def _prepare_q(q, qd, bsum, k_rows):
    if k_rows.dtype == types.uint16:
        return lambda q, qd, bsum, k_rows: round_f16(q)
    return lambda q, qd, bsum, k_rows: quantize_row(ACT_Q8_0, q, q, qd, bsum)


@njit(cache=True)
def qkv_post(qkv, bq, bk, bv, q_norm, k_norm, v_norm, eps, cos_t, sin_t, rope, late_norm, neox, q_scale, q_temp,
             q, qd, k_pool, v_pool, slots, kf, vf, dxb, bsum, rot_k, rot_v):
    # What follows the Q/K/V products, in one call: biases, Q/K norms, RoPE, the Q prescale,
    # the rotation of Q and K by rot_k and of V by rot_v (0: none; kv_pool.rotation), Q prepared for
    # the products with K (prepare_q) and K, V written to the cache (kv_store).
    # qkv: (T, Nq+Nk+Nv) f32, the three products side by side; bq, bk, bv: (N,) or (0,) biases
    # q_norm, k_norm: (hd,) per head, (H*hd,) / (Hkv*hd,) over the whole projection, or (0,) (heads_post)
    # v_norm: (hdv,) per head or (0,) (Gemma 4's V: ggml_rms_norm without a weight, here ones)
    # cos_t, sin_t: (T, n_rot/2) f32 from rope_cache; rope: rotate Q and K by them (a layer without
    #   RoPE: not); late_norm: the Q/K norms after RoPE (heads_post)
    # q_temp: (T,) f32 per token, Q's factor beside q_scale after RoPE (the attention temperature,
    #   ModelConfig.attn_temperature, on the layers that take it), or (0,)
    # q: (T, H, hd) f32 out; qd: (T, H*hd // 16) f32 out, Q's q8_0 scales (q8_0 K only)
    # k_pool: (n_slots, Hkv, K row), v_pool: (n_slots, Hkv, V row): the layer's KV cache (kv_pool.py),
    #   token t written to row slots[t] (slots: (T,) int32)
    # kf: (Hkv, hd), vf: (Hkv, hdv) f32 scratch; dxb, bsum: (>= max(Nk, Nv) // 16,) f32 scratch
    T = qkv.shape[0]
    Nq = q.shape[1] * q.shape[2]
    Nk = kf.shape[0] * kf.shape[1]
    Nv = vf.shape[0] * vf.shape[1]
    kb = kf.reshape(Nk)
    vb = vf.reshape(Nv)
    for t in range(T):
        row = qkv[t]
        qs = q_scale * q_temp[t] if q_temp.shape[0] else q_scale
        heads_post(row[:Nq], bq, q_norm, eps, cos_t[t], sin_t[t], rope, late_norm, neox, qs, q[t])
        heads_post(row[Nq:Nq + Nk], bk, k_norm, eps, cos_t[t], sin_t[t], rope, late_norm, neox, np.float32(1.0), kf)
        heads_post(row[Nq + Nk:Nq + Nk + Nv], bv, v_norm, eps, cos_t[t], sin_t[t], False, False, neox,
                   np.float32(1.0), vf)
        if rot_k > 0:
            fwht(q[t].reshape(Nq), rot_k)
            fwht(kb, rot_k)
        if rot_v > 0:
            fwht(vb, rot_v)
        prepare_q(q[t].reshape(Nq), qd[t], bsum, k_pool)
        kv_store(kb, dxb, bsum, k_pool[slots[t]].reshape(-1))
        kv_store(vb, dxb, bsum, v_pool[slots[t]].reshape(-1))


@njit(cache=True)
def q_post(qkv, bq, q_norm, eps, cos_t, sin_t, rope, late_norm, neox, q_scale, q_temp, q, qd, k_pool, bsum, rot_k):
    # qkv_post's work on Q alone, for a layer that attends over an earlier layer's K/V and writes
    # none (Gemma 4's shared-KV layers): qkv (T, >= Nq) f32, Q its first Nq columns; the other
    # arrays as qkv_post's (k_pool: the K rows it attends over, whose type Q is prepared for)
    T = qkv.shape[0]
    Nq = q.shape[1] * q.shape[2]
    for t in range(T):
        qs = q_scale * q_temp[t] if q_temp.shape[0] else q_scale
        heads_post(qkv[t, :Nq], bq, q_norm, eps, cos_t[t], sin_t[t], rope, late_norm, neox, qs, q[t])
        if rot_k > 0:
            fwht(q[t].reshape(Nq), rot_k)
        prepare_q(q[t].reshape(Nq), qd[t], bsum, k_pool)
