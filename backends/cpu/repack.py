"""Weights repacked once, at load, into the layout the matrix kernels (qdot.py) stream best.

Every block-quantized GGML type stores each weight as `scale * q - min` with a small integer q
and a float scale (and min) per block of 16 or 32 elements.  We expand that into:

- q: (NT, nb, G, NC) int8, the integer quants, in tiles of NC rows.  Within a tile the NC rows
  of one column k lie next to each other, so the kernel's innermost loop runs over rows: long,
  contiguous and free of reductions, which is what vectorizes well.  (A 32-element block loop
  inside a row loop does not.)  Every block of a tile is one contiguous G*NC-byte run, so a
  tile streams from memory in order.
  On a CPU with AVX-512 VNNI (target.VNNI) the kernel takes integer dot products of 4 columns
  at a time (qdot.py), so each block is laid out (G//4, NC, 4) instead: the 4 consecutive
  quants of a row that one int32 lane consumes are adjacent, and NC rows of them follow each
  other.  They are stored as q + 128 in uint8 (vpdpbusd's unsigned operand; every type's quants
  lie in [-128, 127]), so the array is (NT, nb, G//4, NC, 4) uint8, the same size.  Only one
  layout is kept, chosen when packing: INFER_NO_VNNI=1 (or pack_stacked(..., vnni=False))
  selects the portable one, to run or test its kernels on a VNNI machine.
- s, m: (NT, nb, NC) scale and min of each block of each row: the f16 bits (uint16) for the
  legacy types, whose scales are f16 values, float32 for the K-quants (m is a (1, nb, NC) zero
  placeholder for types without mins).

G is 32 for the legacy types, Q4_K and Q5_K, 16 for Q2_K, Q3_K and Q6_K (their sub-blocks).
Rows are padded with zeros up to a whole tile.  The scale products are formed exactly as
`infer.quant.dequant` forms them (e.g. d * sc in float32), so s * q - m is bit-identical to the
dequantized weight.  Weights that take the same input can be stacked into one matrix (Q, K and
V; gate and up), so one call computes them side by side.  Repacking is a parallel pass over the
tensor, done once by whoever runs the weights (the CPU transformer keeps its packed copies);
the raw tensor stays in place for the embedding lookup.  The packed copy of the default
model takes about 290 MB (int8: 1 byte per weight, against 4.5 to 8.5 bits in the file).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from infer.quant import types as qt
from infer.quant.kquants import f16_at, f32_to_f16, q3_scale, scale_min_k4

from .target import VNNI

# How llama.cpp rounds the activations before a dot product with each weight type ("vec_dot_type").
# Applying the same rounding keeps our logits within llama.cpp's own rounding of the same file.
ACT_NONE, ACT_Q8_0, ACT_Q8_K, ACT_F16, ACT_BF16 = 0, 1, 2, 3, 4
ACT_ROUNDING = {
    qt.F32: ACT_NONE, qt.F16: ACT_F16, qt.BF16: ACT_BF16,
    qt.Q4_0: ACT_Q8_0, qt.Q4_1: ACT_Q8_0, qt.Q5_0: ACT_Q8_0, qt.Q5_1: ACT_Q8_0, qt.Q8_0: ACT_Q8_0,
    qt.Q2_K: ACT_Q8_K, qt.Q3_K: ACT_Q8_K, qt.Q4_K: ACT_Q8_K, qt.Q5_K: ACT_Q8_K, qt.Q6_K: ACT_Q8_K,
}

NC = 64  # rows per tile: 4 vectors of 16 lanes, enough independent work per column to hide latency

# Elements per scale block of each repackable type.
GROUP = {
    qt.Q4_0: 32, qt.Q4_1: 32, qt.Q5_0: 32, qt.Q5_1: 32, qt.Q8_0: 32,
    qt.Q2_K: 16, qt.Q3_K: 16, qt.Q4_K: 32, qt.Q5_K: 32, qt.Q6_K: 16,
}
HAS_MIN = {qt.Q4_1, qt.Q5_1, qt.Q2_K, qt.Q4_K, qt.Q5_K}
# Types whose block scales (and mins) are f16 values: kept as f16 bits, half the bytes of float32.
# (K-quant scales are products d * sc, not representable in f16.)
F16_SCALES = {qt.Q4_0, qt.Q4_1, qt.Q5_0, qt.Q5_1, qt.Q8_0}


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A (N, K) weight as int8 quants in row tiles plus float32 block scales (see module doc)."""

    type_id: int  # GGML type (of the first part, for a concatenation: all share G, mins and activation rounding)
    n: int  # rows N (output features)
    k: int  # row length K (input features)
    group: int  # G
    q: np.ndarray  # (NT, K//G, G, NC) int8, or with vnni (NT, K//G, G//4, NC, 4) uint8 holding q + 128
    s: np.ndarray  # (NT, K//G, NC) float32, or uint16 f16 bits for F16_SCALES types
    m: np.ndarray  # (NT, K//G, NC) like s; (1, K//G, NC) zeros when the type has no mins
    has_min: bool
    src: tuple  # the QTensors it was packed from, stacked row-wise
    act: int  # how the activations are rounded for it (ACT_ROUNDING of its type)
    vnni: bool = False  # q in the layout of the VNNI kernel (see module doc)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.s.nbytes + self.m.nbytes


@njit(cache=True)
def unpack_row(type_id, src, q, s, m):
    # src: (row_bytes,) uint8, one raw row; q: (K,) int8 quants; s, m: (K//G,) float32 block scale
    # and min, so that weight k = s[k // G] * q[k] - m[k // G] (m untouched for types without mins)
    K = q.shape[0]
    if type_id == qt.Q8_0 or type_id == qt.Q4_0 or type_id == qt.Q4_1 or type_id == qt.Q5_0 or type_id == qt.Q5_1:
        size = 34 if type_id == qt.Q8_0 else 18 if type_id == qt.Q4_0 else 20 if type_id == qt.Q4_1 else (
            22 if type_id == qt.Q5_0 else 24)  # bytes per block
        off = 8 if type_id == qt.Q4_0 else 16 if type_id == qt.Q5_0 else 0  # q - off is the signed quant
        for b in range(K // 32):
            o = b * size
            t = b * 32
            s[b] = f16_at(src, o)
            if type_id == qt.Q8_0:
                for j in range(32):
                    q[t + j] = np.int8(np.int32(src[o + 2 + j]) - (np.int32(src[o + 2 + j]) >> 7 << 8))
                continue
            if type_id == qt.Q4_1 or type_id == qt.Q5_1:
                m[b] = -f16_at(src, o + 2)
            qh = np.int64(0)
            if type_id == qt.Q5_0 or type_id == qt.Q5_1:
                p = o + 2 if type_id == qt.Q5_0 else o + 4
                qh = np.int64(src[p]) | (np.int64(src[p + 1]) << 8) | (np.int64(src[p + 2]) << 16) | (np.int64(src[p + 3]) << 24)
            qs = o + size - 16
            for j in range(16):
                x = np.int32(src[qs + j])
                q[t + j] = (x & 15) + (((qh >> j) & 1) << 4) - off
                q[t + 16 + j] = (x >> 4) + (((qh >> (j + 16)) & 1) << 4) - off
    elif type_id == qt.Q4_K or type_id == qt.Q5_K:
        size = 144 if type_id == qt.Q4_K else 176
        qs = 16 if type_id == qt.Q4_K else 48
        for b in range(K // 256):
            o = b * size
            d = f16_at(src, o)
            dmin = f16_at(src, o + 2)
            for j in range(8):
                sc, mn = scale_min_k4(src, o + 4, j)
                s[8 * b + j] = d * np.float32(sc)
                m[8 * b + j] = dmin * np.float32(mn)
                t = 256 * b + 32 * j
                base = o + qs + 32 * (j >> 1)
                sh = 4 * (j & 1)
                for l in range(32):
                    v = (np.int32(src[base + l]) >> sh) & 15
                    if type_id == qt.Q5_K:
                        v |= ((np.int32(src[o + 16 + l]) >> j) & 1) << 4
                    q[t + l] = v
    elif type_id == qt.Q2_K or type_id == qt.Q3_K or type_id == qt.Q6_K:
        size = 84 if type_id == qt.Q2_K else 110 if type_id == qt.Q3_K else 210
        for b in range(K // 256):
            o = b * size
            for hh in range(2):
                for kk in range(4):
                    for p in range(2):
                        sb = 16 * b + 8 * hh + 2 * kk + p  # the 16-element sub-block
                        t = 16 * sb
                        if type_id == qt.Q2_K:
                            sc = np.int32(src[o + 8 * hh + 2 * kk + p])
                            s[sb] = f16_at(src, o + 80) * np.float32(sc & 15)
                            m[sb] = f16_at(src, o + 82) * np.float32(sc >> 4)
                            for l in range(16):
                                q[t + l] = (np.int32(src[o + 16 + 32 * hh + 16 * p + l]) >> (2 * kk)) & 3
                        elif type_id == qt.Q3_K:
                            s[sb] = f16_at(src, o + 108) * np.float32(q3_scale(src, o + 96, 8 * hh + 2 * kk + p))
                            for l in range(16):
                                lo = (np.int32(src[o + 32 + 32 * hh + 16 * p + l]) >> (2 * kk)) & 3
                                hb = (np.int32(src[o + 16 * p + l]) >> (4 * hh + kk)) & 1
                                q[t + l] = lo + 4 * hb - 4
                        else:
                            sc = np.int32(src[o + 192 + 8 * hh + 2 * kk + p])
                            s[sb] = f16_at(src, o + 208) * np.float32(sc - (sc >> 7 << 8))
                            for l in range(16):
                                i = 16 * p + l
                                lo = (np.int32(src[o + 64 * hh + 32 * (kk & 1) + i]) >> (4 * (kk >> 1))) & 15
                                hi = (np.int32(src[o + 128 + 32 * hh + i]) >> (2 * kk)) & 3
                                q[t + l] = (lo | (hi << 4)) - 32


@njit(cache=True, parallel=True)
def pack_rows(type_id, raw, q, s, m, has_min, vnni, rq, rs, rm):
    # raw: (N, row_bytes) uint8; q: (NT, nb, G*NC) int8, each block's bytes in the layout `vnni` picks
    # (see module doc); s, m: (NT, nb, NC) f32 (m: (1, nb, NC) zeros if no mins)
    # rq: (n_chunks, NC, K) int8, rs, rm: (n_chunks, NC, nb) f32 scratch, one tile's rows per parallel chunk
    N = raw.shape[0]
    NT, nb, GN = q.shape
    nc = s.shape[2]
    G = GN // nc
    n_chunks = rq.shape[0]
    for c in prange(n_chunks):
        tq, ts, tm = rq[c], rs[c], rm[c]
        for tile in range(c * NT // n_chunks, (c + 1) * NT // n_chunks):
            for r in range(nc):
                row = tile * nc + r
                if row < N:
                    unpack_row(type_id, raw[row], tq[r], ts[r], tm[r])
                else:  # padding rows: zero weights
                    tq[r, :] = 0
                    ts[r, :] = 0.0
                    tm[r, :] = 0.0
            # transpose into the tile, rows innermost: contiguous writes
            qt, st = q[tile], s[tile]
            mt = m[tile] if has_min else m[0]
            for b in range(nb):
                for r in range(nc):
                    st[b, r] = ts[r, b]
                if has_min:
                    for r in range(nc):
                        mt[b, r] = tm[r, b]
                if vnni:
                    # (G//4, NC, 4): q + 128 as uint8 (stored through int8: the same bits)
                    for j4 in range(G // 4):
                        for r in range(nc):
                            for i in range(4):
                                qt[b, (j4 * nc + r) * 4 + i] = tq[r, b * G + 4 * j4 + i] ^ np.int8(-128)
                else:
                    for j in range(G):
                        for r in range(nc):
                            qt[b, j * nc + r] = tq[r, b * G + j]


def stackable(ws) -> bool:
    """Whether QTensors of the same row length can be packed as one matrix, their rows stacked:
    every type repackable with the same block size, mins and activation rounding, and every part
    but the last a whole number of tiles (so each part's outputs start at a known column)."""
    return (
        all(w.type_id in GROUP for w in ws)
        and len({(GROUP[w.type_id], w.type_id in HAS_MIN, w.type_id in F16_SCALES, ACT_ROUNDING[w.type_id],
                  w.shape[-1]) for w in ws}) == 1
        and all(w.raw.shape[0] % NC == 0 for w in ws[:-1])
    )


def use_vnni() -> bool:
    """Whether weights packed now take the VNNI layout: where the CPU has it, unless the
    environment sets INFER_NO_VNNI=1 (to run or test the portable kernels on such a CPU)."""
    return VNNI and os.environ.get("INFER_NO_VNNI", "") in ("", "0")


def pack_stacked(ws, vnni: bool | None = None) -> PackedWeight | None:
    """QTensors (N_i, K) packed as one (sum N_i, K) matrix (see stackable), or None if they cannot be.
    vnni: the layout (see module doc); None picks use_vnni()'s.  True needs a CPU with VNNI."""
    ws = tuple(ws)
    if not stackable(ws):
        return None
    vnni = use_vnni() if vnni is None else bool(vnni)
    if vnni and not VNNI:
        raise ValueError("the VNNI layout needs a CPU with AVX-512 VNNI")
    t0 = ws[0].type_id
    G, has_min, K = GROUP[t0], t0 in HAS_MIN, ws[0].shape[-1]
    nts = [-(-w.raw.shape[0] // NC) for w in ws]
    nt, nb = sum(nts), K // G
    q = np.empty((nt, nb, G * NC), np.int8)
    s = np.empty((nt, nb, NC), np.float32)
    m = np.empty((nt, nb, NC), np.float32) if has_min else np.zeros((1, nb, NC), np.float32)
    n_chunks = min(16, max(nts))
    rq = np.empty((n_chunks, NC, K), np.int8)
    rs = np.zeros((n_chunks, NC, nb), np.float32)
    rm = np.zeros((n_chunks, NC, nb), np.float32)
    a = 0
    for w, n in zip(ws, nts):
        pack_rows(w.type_id, w.raw, q[a:a + n], s[a:a + n], m[a:a + n] if has_min else m, has_min, vnni, rq, rs, rm)
        a += n
    q = q.view(np.uint8).reshape(nt, nb, G // 4, NC, 4) if vnni else q.reshape(nt, nb, G, NC)
    if t0 in F16_SCALES:
        s, m = _to_f16_bits(s), _to_f16_bits(m)
    return PackedWeight(t0, sum(w.raw.shape[0] for w in ws), K, G, q, s, m, has_min, ws, ACT_ROUNDING[t0], vnni)


def _to_f16_bits(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, np.uint16)
    f32_to_f16_bits(a.reshape(-1), out.reshape(-1))
    return out


@njit(cache=True, parallel=True)
def f32_to_f16_bits(a, out):
    # a: (n,) f32 values that are f16 values (exactly); out: (n,) uint16 their f16 bits
    for i in prange(a.shape[0]):
        out[i] = f32_to_f16(a[i])
