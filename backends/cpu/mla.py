"""Multi-head latent attention's steps around the attention kernel (deepseek2; the recipe is
models/arch/deepseek2.py), with the arithmetic of llama.cpp's graph (src/models/deepseek2.cpp):
- mla_post: the latent's RMSNorm and the RoPE of the shared key part, written to the cache as one
  row latent | key part in the cache's type (kv_write.kv_store); each head's RoPE'd Q part placed
  after the room its absorbed part takes (ggml_concat(q_nope_absorbed, q_pe));
- mla_prepare_q: the whole Q row (absorbed | RoPE'd) prepared for the products with the cache's K
  (kv_write.prepare_q), once the absorbed parts are in;
- heads_matmul: every head's product with its own matrix (attn_k_b's: Q's nope part into the
  latent's room, q_nope_absorbed; attn_v_b's: the latent mix back to the value's width, kqv_mla) in
  one parallel loop, each head's outputs the bits qmatmul gives it alone.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .activations import ACT_Q8_K, pair_sums, quantize_rows
from .elementwise import heads_post
from .kv_write import kv_store, prepare_q
from .qdot import EXPAND_FROM, EXPANDED, packed_tiles


@njit(cache=True)
def mla_post(q, kv, kv_norm, eps, cos_t, sin_t, q3, kn, kp, qp, qr, krow, k_pool, slots, dxb, bsum):
    # q: (T, H * Dq) f32 the Q product, per head its nope part then its RoPE part (n_rot)
    # kv: (T, R + n_rot) f32 attn_kv_a_mqa's product: the latent (R), then the key's RoPE part
    # kv_norm: (R,) f32 attn_kv_a_norm; cos_t, sin_t: (T, n_rot/2) f32 (rope_angles; adjacent pairs)
    # q3: (T, H, R + n_rot) f32 out: [t, h, R:] head h's RoPE'd part ([t, h, :R] is left to attn_k_b's products)
    # kn: (1, R), kp: (1, n_rot), qp: (H * n_rot,), qr: (H, n_rot), krow: (R + n_rot,) f32 scratch
    # k_pool: (n_slots, 1, K row) this layer's cache (kv_pool.py), token t written to row slots[t]
    # dxb, bsum: (>= (R + n_rot) // 16,) f32 scratch
    T = q.shape[0]
    H, Dk = q3.shape[1], q3.shape[2]
    R = kv_norm.shape[0]
    n_rot = Dk - R
    Dq = q.shape[1] // H
    nope = Dq - n_rot
    none = kv_norm[:0]
    for t in range(T):
        heads_post(kv[t, :R], none, kv_norm, eps, cos_t[t], sin_t[t], False, False, False, np.float32(1.0), kn)
        heads_post(kv[t, R:], none, none, eps, cos_t[t], sin_t[t], True, False, False, np.float32(1.0), kp)
        krow[:R] = kn[0]
        krow[R:] = kp[0]
        kv_store(krow, dxb, bsum, k_pool[slots[t]].reshape(-1))
        for h in range(H):
            qp[h * n_rot:(h + 1) * n_rot] = q[t, h * Dq + nope:(h + 1) * Dq]
        heads_post(qp, none, none, eps, cos_t[t], sin_t[t], True, False, False, np.float32(1.0), qr)
        for h in range(H):
            q3[t, h, R:] = qr[h]


@njit(cache=True)
def mla_prepare_q(q3, qd, bsum, k_pool):
    # q3: (T, H, K row) f32 in place, qd: (T, H * K row // 16) f32 out: each token's Q as the
    # products with the cache's K take it (prepare_q)
    for t in range(q3.shape[0]):
        prepare_q(q3[t].reshape(-1), qd[t], bsum, k_pool)


@njit(cache=True, parallel=True)
def heads_matmul(src, in_stride, K, lo, hi, s, m, sc, key, mode, N, lo_bits, hi_bits, group, xq_buf, dxb_buf, bsum_buf,
                 acc, expanded, x, out, out_stride):
    # src: (T, >= H * in_stride) f32, head h's input its columns h * in_stride ... + K
    # lo, hi, s, m, sc: the heads' (N, K) matrices as PackedExperts' planes, head axis first;
    #   key, mode, N, lo_bits, hi_bits, group: their PackedExperts.info
    # xq_buf: (>= H * T * K,) int8 for the integer kernel, f32 for the portable one; dxb_buf:
    #   (>= H * T * K / 16,), bsum_buf: (>= H * (T * K / 16 + T * K / 32),) f32: every head's
    #   quantized input, laid out per head as matmul_packed lays out one's (MatmulWorkspace's)
    # acc: (n_chunks, 4, NC), expanded: (n_chunks, 1, 1, >= K * NC) matmul_packed's scratch
    # x: (>= T * K,) f32 scratch, one head's input made contiguous
    # out: (T, >= H * out_stride) f32, head h's product written to its columns h * out_stride ... + N
    # Each head's inputs quantized as matmul_packed quantizes them, then one parallel loop over
    # every head's tiles: a parallel region per head costs more than a head's product on a
    # decode step (16 heads of 512 x 128), and a tile's sums do not depend on who runs it.
    T = src.shape[0]
    H, NT = lo.shape[0], lo.shape[1]
    n16, npair = T * K // 16, K // (2 * group)
    nb = n16 + T * K // 32  # one head's share of bsum_buf: its sums per 16, then its pair sums
    xs = x[:T * K].reshape(T, K)
    for h in range(H):
        for t in range(T):
            xs[t] = src[t, h * in_stride:h * in_stride + K]
        bsum = bsum_buf[h * nb:h * nb + n16].reshape(T, K // 16)
        quantize_rows(mode, xs, xq_buf[h * T * K:(h + 1) * T * K].reshape(T, K),
                      dxb_buf[h * n16:(h + 1) * n16].reshape(T, K // 16), bsum)
        if mode == ACT_Q8_K:
            pair_sums(bsum, group // 16, bsum_buf[h * nb + n16:h * nb + n16 + T * npair].view(np.int32).reshape(T, npair))
    expand = 0 < EXPAND_FROM[key.id] <= T
    tid = key.id + EXPANDED if expand else key.id
    n_chunks = min(acc.shape[0], H * NT)
    for c in prange(n_chunks):
        i, end = c * H * NT // n_chunks, (c + 1) * H * NT // n_chunks
        while i < end:
            h = i // NT
            stop = min(end, (h + 1) * NT)
            packed_tiles(key, tid, expand, i - h * NT, stop - h * NT, lo[h], hi[h], s[h], m[h], sc[h], N,
                         xq_buf[h * T * K:(h + 1) * T * K].reshape(T, K),
                         dxb_buf[h * n16:(h + 1) * n16].reshape(T, K // 16),
                         bsum_buf[h * nb:h * nb + n16].reshape(T, K // 16),
                         bsum_buf[h * nb + n16:h * nb + n16 + T * npair].view(np.int32).reshape(T, npair), out,
                         h * out_stride, acc[c], lo_bits, hi_bits, group, expanded[c])
            i = stop
