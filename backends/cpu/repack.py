"""Weights repacked once, at load, into the layout the matrix kernels (qdot.py) stream best.

Every block-quantized GGML type stores each weight as `scale * q - min` with a small integer q
and a scale (and min) per block of 16 or 32 elements.  We keep the same bits, reordered into
tiles of NC rows so that the kernels' innermost work runs across rows (long, contiguous, no
reductions), in the planes qdot.LAYOUTS describes:

- lo, hi: (NT, nb, bytes per block) uint8.  u = q + offset of each quant, its low bits in lo, its
  high bits (5- and 6-bit types) in hi.  Within a block, the quants come in groups of 4 columns;
  for each group the NC rows follow each other, 4 bytes-worth of quants each, and a plane of
  `bits` bits packs 8 // bits consecutive groups into each byte, group k at bit bits * k.  So each
  block of a tile is one contiguous run per plane, and a tile streams in order.
- s, m: (NT, blocks or super-blocks, NC) uint16: the file's f16 scale and (negated) min of each
  block of each row for the legacy types; the f16 super-block d and dmin for the K-quants.
- sc: (NT, X, NC) uint8: the K-quants' sub-block scales as the file has them (one byte per
  sub-block for Q2_K, Q3_K and Q6_K -- Q3_K's 6-bit ones unpacked; llama.cpp's 12 packed bytes
  per super-block for Q4_K and Q5_K).

The packed weight costs the file's bits per weight (Q4_K: 4.5, Q6_K: 6.5625, Q8_0: 8.5; only
Q3_K's 1-bit plane is half used: 4.56 against 3.44), and its scale products are formed as
`infer.quant.dequant` forms them, so the kernels' result equals dequantize-then-dot.  Weights that take the same input and have the same type can be stacked
into one matrix (Q, K and V; gate and up), so one call computes them side by side.  Repacking is
a parallel pass over the tensor, done once by whoever runs the weights, CHUNK_TILES tiles at a
time: each chunk's pages of the file are mapped in one call before (a page fault per 4 KiB cost
more than the packing) and released as soon as it is packed.

MXFP4 keeps its 4-bit codes in the lo plane (qdot's Layout.e2m1: the kernels map each code to
u = value + 12, its values being the integers 0, +-1, +-2, +-3, +-4, +-6, +-8, +-12) and its
scale 2**(e - 128), a power of two, as an f16 d: exact for e - 128 in [-24, 15], so
weight = d * (u - 12) exactly, and the block's integer dot is llama.cpp's (ggml_vec_dot_mxfp4_q8_0:
Q8_0 activations, (d_x * d_y) * the integer dot).  4.5 bits per weight against the file's 4.25
(the f16 scale against its exponent byte).  A block of zeros scales by 0 whatever its e (llama.cpp
writes e = 0 for one).  A tensor with a block of nonzero weights that f16 cannot scale (e - 128
outside [-24, 15]: llama.cpp's quantizer writes one only for 32 weights all below ~2**-21 and not
all zero, or for one reaching ~2**19) is not packed (pack_stacked finds one as it packs, warns and
returns None): it runs on the reference path (matmul.py), exact as well, only slower.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit, prange
from numba.extending import overload

from infer.quant import types as qt
from infer.quant.kquants import q3_scale
from infer.quant.lanes import u32_at
from infer.quant.static_type import StaticTypeType, static_type
from infer.quant.tensor import populate_mapped, release_mapped

from .activations import ACT_ROUNDING
from .hugepages import huge_empty
from .qdot import LAYOUTS, NC, SC_F16, SC_K4, Layout
from .target import INT_KERNEL

CHUNK_TILES = 64  # tiles packed per call (4096 rows): the most of a tensor's file pages resident at once

@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A (N, K) weight in the planes of its type's Layout (see module doc)."""

    type_id: int  # GGML type (of every part, for a stack)
    n: int  # rows N (output features)
    k: int  # row length K (input features)
    layout: Layout
    lo: np.ndarray  # (NT, K//G, lo_bytes) uint8
    hi: np.ndarray  # (NT, K//G, hi_bytes) uint8; (0, 0, 0) without a high plane
    s: np.ndarray  # (NT, K//G or K//256, NC) uint16 f16 bits
    m: np.ndarray  # like s; (0, 0, 0) without mins
    sc: np.ndarray  # (NT, K//G or 12*K//256, NC) uint8 K-quant sub-block scales; (0, 0, 0) for legacy types
    src: tuple  # the QTensors it was packed from, stacked row-wise
    act: int  # how the activations are rounded for it (ACT_ROUNDING of its type)
    int_kernel: bool = False  # run by the integer kernel (VNNI, AVX-512BW or AVX2), else the portable one

    @property
    def nbytes(self) -> int:
        return self.lo.nbytes + self.hi.nbytes + self.s.nbytes + self.m.nbytes + self.sc.nbytes


@njit(cache=True, inline="always")
def _bits_to_bytes(x):
    # bits 0..3 of x -> bit 0 of bytes 0..3 (the four products land on distinct bits: no carries)
    return ((x & np.uint32(15)) * np.uint32(0x00204081)) & np.uint32(0x01010101)


@njit(cache=True, inline="always")
def unpack_row(type_id, src, u):
    # src: (row_bytes,) uint8, one raw row; u: (K,) uint8, its quants as the planes keep them,
    # u = q + LAYOUTS[type].offset (weight = scale * q - min): the unsigned value each type stores
    # (Q8_0's signed byte with its sign bit flipped; MXFP4's 4-bit code, which the kernels map).
    # Four quants at a time, as the bytes of a uint32 (uw; every block starts at a multiple of 4
    # quants): a shift moves every byte of a word alike and the masks keep each byte's own bits,
    # so a word's bytes are the quants a byte loop would give.
    K = u.shape[0]
    uw = u.view(np.uint32)
    lo4, lo2, one = np.uint32(0x0F0F0F0F), np.uint32(0x03030303), np.uint32(0x01010101)
    if type_id == qt.MXFP4:
        for b in range(K // 32):
            o, t = b * 17, b * 8
            for w in range(4):
                x = u32_at(src, o + 1 + 4 * w)
                uw[t + w] = x & lo4
                uw[t + 4 + w] = (x >> np.uint32(4)) & lo4
        return
    if type_id == qt.Q8_0:  # (bytes at a time: this loop the compiler vectorizes)
        for b in range(K // 32):
            for j in range(32):
                u[32 * b + j] = src[34 * b + 2 + j] ^ np.uint8(0x80)
        return
    if type_id == qt.Q4_0 or type_id == qt.Q4_1 or type_id == qt.Q5_0 or type_id == qt.Q5_1:
        size = 18 if type_id == qt.Q4_0 else 20 if type_id == qt.Q4_1 else 22 if type_id == qt.Q5_0 else 24
        for b in range(K // 32):
            o, t = b * size, b * 8
            qh = np.uint32(0)
            if type_id == qt.Q5_0 or type_id == qt.Q5_1:
                qh = u32_at(src, o + 2 if type_id == qt.Q5_0 else o + 4)
            qs = o + size - 16
            for w in range(4):
                x = u32_at(src, qs + 4 * w)
                lo = x & lo4
                hi = (x >> np.uint32(4)) & lo4
                if type_id == qt.Q5_0 or type_id == qt.Q5_1:  # bit j of qh is quant j's fifth bit
                    lo |= _bits_to_bytes(qh >> np.uint32(4 * w)) << np.uint32(4)
                    hi |= _bits_to_bytes(qh >> np.uint32(16 + 4 * w)) << np.uint32(4)
                uw[t + w] = lo
                uw[t + 4 + w] = hi
    elif type_id == qt.Q4_K or type_id == qt.Q5_K:
        size = 144 if type_id == qt.Q4_K else 176
        qs = 16 if type_id == qt.Q4_K else 48
        for b in range(K // 256):
            o = b * size
            for j in range(8):
                t = 64 * b + 8 * j
                base = o + qs + 32 * (j >> 1)
                sh = np.uint32(4 * (j & 1))
                for w in range(8):
                    v = (u32_at(src, base + 4 * w) >> sh) & lo4
                    if type_id == qt.Q5_K:
                        v |= ((u32_at(src, o + 16 + 4 * w) >> np.uint32(j)) & one) << np.uint32(4)
                    uw[t + w] = v
    elif type_id == qt.Q2_K or type_id == qt.Q3_K or type_id == qt.Q6_K:
        size = 84 if type_id == qt.Q2_K else 110 if type_id == qt.Q3_K else 210
        for b in range(K // 256):
            o = b * size
            for hh in range(2):
                for kk in range(4):
                    for p in range(2):
                        t = 4 * (16 * b + 8 * hh + 2 * kk + p)  # the 16-element sub-block, in words
                        for w in range(4):
                            i = 16 * p + 4 * w
                            if type_id == qt.Q2_K:
                                v = (u32_at(src, o + 16 + 32 * hh + i) >> np.uint32(2 * kk)) & lo2
                            elif type_id == qt.Q3_K:
                                v = (u32_at(src, o + 32 + 32 * hh + i) >> np.uint32(2 * kk)) & lo2
                                v |= ((u32_at(src, o + i) >> np.uint32(4 * hh + kk)) & one) << np.uint32(2)
                            else:
                                v = (u32_at(src, o + 64 * hh + 32 * (kk & 1) + i) >> np.uint32(4 * (kk >> 1))) & lo4
                                v |= ((u32_at(src, o + 128 + 32 * hh + i) >> np.uint32(2 * kk)) & lo2) << np.uint32(4)
                            uw[t + w] = v


def unpack_static(key, src, u):
    """unpack_row for njit code, the type a StaticType: the inlined copy holds its type's loop only."""
    raise NotImplementedError("unpack_static is called from njit code")


@overload(unpack_static)
def _unpack_static(key, src, u):
    if isinstance(key, StaticTypeType):
        t = key.id
        return lambda key, src, u: unpack_row(t, src, u)


@njit(cache=True, inline="always")
def _u16(src, o):
    return np.uint16(np.int32(src[o]) | (np.int32(src[o + 1]) << 8))


@njit(cache=True, inline="always")
def mxfp4_scale_f16(src, o):
    # src: (row_bytes,) uint8; the MXFP4 block at byte o ([e, qs[16]]) -> the f16 bits of its scale
    # 2**(e - 128) as an f16 d (int32): f16's normals reach 2**-14 .. 2**15, its subnormals 2**-24;
    # 0 for a block of zeros (codes 0 or 8) outside that range, -1 for one that cannot be scaled
    k = np.int32(src[o]) - 128
    if -14 <= k <= 15:
        return (k + 15) << 10
    if -24 <= k < -14:
        return np.int32(1) << (k + 24)
    for j in range(16):
        if src[o + 1 + j] & np.uint8(0x77):  # a nibble with a nonzero magnitude
            return -1
    return 0


@njit(cache=True, inline="always")
def row_scales(type_id, src, s, m, sc):
    # src: (row_bytes,) uint8, one raw row; writes the row's scales as the planes keep them
    # (module doc): s, m: (X,) uint16 f16 bits; sc: (Y,) uint8.  Returns how many of its blocks
    # the layout cannot hold (MXFP4 scales beyond f16's range: the tensor is then not packed)
    if type_id == qt.MXFP4:
        bad = 0
        for b in range(s.shape[0]):
            d = mxfp4_scale_f16(src, 17 * b)
            bad += d < 0
            s[b] = np.uint16(max(d, 0))
        return bad
    if type_id == qt.Q8_0 or type_id == qt.Q4_0 or type_id == qt.Q4_1 or type_id == qt.Q5_0 or type_id == qt.Q5_1:
        size = 34 if type_id == qt.Q8_0 else 18 if type_id == qt.Q4_0 else 20 if type_id == qt.Q4_1 else (
            22 if type_id == qt.Q5_0 else 24)
        for b in range(s.shape[0]):
            s[b] = _u16(src, b * size)
            if type_id == qt.Q4_1 or type_id == qt.Q5_1:
                m[b] = _u16(src, b * size + 2) ^ np.uint16(0x8000)  # -min: the kernel subtracts m
        return 0
    size = 84 if type_id == qt.Q2_K else 110 if type_id == qt.Q3_K else 144 if type_id == qt.Q4_K else (
        176 if type_id == qt.Q5_K else 210)
    for b in range(s.shape[0]):
        o = b * size
        if type_id == qt.Q4_K or type_id == qt.Q5_K:
            s[b] = _u16(src, o)
            m[b] = _u16(src, o + 2)
            for i in range(12):
                sc[12 * b + i] = src[o + 4 + i]
        elif type_id == qt.Q2_K:
            s[b] = _u16(src, o + 80)
            m[b] = _u16(src, o + 82)
            for i in range(16):
                sc[16 * b + i] = src[o + i]
        elif type_id == qt.Q3_K:
            s[b] = _u16(src, o + 108)
            for i in range(16):
                sc[16 * b + i] = np.uint8(q3_scale(src, o + 96, i) & 255)
        else:
            s[b] = _u16(src, o + 208)
            for i in range(16):
                sc[16 * b + i] = src[o + 192 + i]
    return 0


def row_scales_static(key, src, s, m, sc):
    """row_scales for njit code, the type a StaticType (as unpack_static)."""
    raise NotImplementedError("row_scales_static is called from njit code")


@overload(row_scales_static)
def _row_scales_static(key, src, s, m, sc):
    if isinstance(key, StaticTypeType):
        t = key.id
        return lambda key, src, s, m, sc: row_scales(t, src, s, m, sc)


@njit(cache=True, inline="always")
def write_plane(tu, b, group, bits, low, out):
    # tu: (NC, K // 4) uint32, the u = q + offset of a tile's rows, 4 columns a word (little-endian);
    # out: (bytes per block,) uint8, block b of the tile in a plane of `bits` bits holding bits low..
    # of each u (module doc).  A group's 4 columns of a row are one word in and one word out, so
    # the bytes move 4 at a time (low + bits <= 8: no bit crosses into a neighbouring byte).
    per = 8 // bits
    mask = np.uint32(((1 << bits) - 1) * 0x01010101)
    n_groups = group // 4
    ow = out.view(np.uint32)
    w0 = b * group // 4
    for pg in range(ow.shape[0] // NC):
        for r in range(NC):
            v = np.uint32(0)
            for k in range(per):
                j4 = pg * per + k
                if j4 < n_groups:
                    v |= ((tu[r, w0 + j4] >> np.uint32(low)) & mask) << np.uint32(bits * k)
            ow[pg * NC + r] = v


def write_planes_static(key, tu, tile, b, lo, hi):
    """Block b of tile `tile` of the lo (and hi) plane from tu (write_plane), with the bit widths
    and group of key's layout constants in the inlined copies."""
    raise NotImplementedError("write_planes_static is called from njit code")


@overload(write_planes_static)
def _write_planes_static(key, tu, tile, b, lo, hi):
    if not isinstance(key, StaticTypeType):
        return None
    L = LAYOUTS[key.id]
    group, lo_bits, hi_bits = L.group, L.lo_bits, L.hi_bits

    def impl(key, tu, tile, b, lo, hi):
        write_plane(tu, b, group, lo_bits, 0, lo[tile, b])
        if hi_bits:
            write_plane(tu, b, group, hi_bits, lo_bits, hi[tile, b])
    return impl


@njit(cache=True, parallel=True)
def pack_rows(key, has_m, has_sc, raw, lo, hi, s, m, sc, rq, rs, rm, rsc):
    # key: the rows' StaticType; raw: (N, row_bytes) uint8; lo, hi, s, m, sc: the planes of
    # ceil(N / NC) tiles (module doc; hi, m, sc are placeholders unless the layout has a high
    # plane, has_m, has_sc); scratch, one tile's rows per parallel chunk: rq: (n_chunks, NC, K)
    # uint8 quants u; rs, rm: (n_chunks, NC, X) uint16; rsc: (n_chunks, NC, Y) uint8
    # Returns how many blocks the layout cannot hold (row_scales): if any, the planes are not usable.
    NT = lo.shape[0]
    n_chunks = rq.shape[0]
    bad = np.zeros(n_chunks, np.int64)  # per chunk (a sum across prange's chunks trips numba's parfors)
    for c in prange(n_chunks):
        bad[c] = pack_tiles(key, has_m, has_sc, raw, c * NT // n_chunks, (c + 1) * NT // n_chunks, lo, hi, s, m, sc,
                            rq[c], rs[c], rm[c], rsc[c])
    return bad.sum()


@njit(cache=True)
def pack_tiles(key, has_m, has_sc, raw, tile0, tile1, lo, hi, s, m, sc, tq, ts, tm, tsc):
    # pack_rows's work on tiles tile0..tile1 (one parallel chunk), with that chunk's scratch tq, ts,
    # tm, tsc.  Its own function, not the parallel loop's body: numba compiles a loop body twice
    # (typing the loop, then its gufunc), and this one holds a type's whole unpacking
    N = raw.shape[0]
    nb = lo.shape[1]
    unfit = 0
    for tile in range(tile0, tile1):
        for r in range(NC):
            row = tile * NC + r
            if row < N:
                unpack_static(key, raw[row], tq[r])
                unfit += row_scales_static(key, raw[row], ts[r], tm[r], tsc[r])
            else:  # padding rows: zero weights, zero scales
                tq[r, :] = 0
                ts[r, :] = 0
                tm[r, :] = 0
                tsc[r, :] = 0
        tu = tq.view(np.uint32)
        for b in range(nb):
            write_planes_static(key, tu, tile, b, lo, hi)
        for x in range(s.shape[1]):
            for r in range(NC):
                s[tile, x, r] = ts[r, x]
                if has_m:
                    m[tile, x, r] = tm[r, x]
        if has_sc:
            for y in range(sc.shape[1]):
                for r in range(NC):
                    sc[tile, y, r] = tsc[r, y]
    return unfit


def stackable(ws) -> bool:
    """Whether QTensors can be packed as one matrix, their rows stacked: one repackable type, one
    row length, and every part but the last a whole number of tiles (so each part's outputs
    start at a known column).  From the shapes alone (pack_stacked finds values the layout
    cannot hold as it packs)."""
    return (
        ws[0].type_id in LAYOUTS
        and len({(w.type_id, w.shape[-1]) for w in ws}) == 1
        and all(w.raw.shape[0] % NC == 0 for w in ws[:-1])
    )


def use_int_kernel() -> bool:
    """Whether weights packed now run on the integer kernel (target.INT_KERNEL): where the CPU
    has one, unless the environment sets INFER_PORTABLE_KERNEL=1 (to run or test the portable
    kernel on such a CPU)."""
    return INT_KERNEL and os.environ.get("INFER_PORTABLE_KERNEL", "") in ("", "0")


def packed_shapes(ws) -> list[tuple[tuple[int, ...], type]]:
    """The (shape, dtype) of lo, hi, s, m and sc of pack_stacked(ws) (ws stackable)."""
    L, K = LAYOUTS[ws[0].type_id], ws[0].shape[-1]
    nt = sum(-(-w.raw.shape[0] // NC) for w in ws)
    nb, nsb = K // L.group, K // 256
    legacy = L.scales == SC_F16
    xs = nb if legacy else nsb  # s, m entries per row
    ys = 1 if legacy else 12 * nsb if L.scales == SC_K4 else nb  # sc entries per row
    return [((nt, nb, L.lo_bytes), np.uint8), ((nt, nb, L.hi_bytes) if L.hi_bits else (0, 0, 0), np.uint8),
            ((nt, xs, NC), np.uint16), ((nt, xs, NC) if L.has_min else (0, 0, 0), np.uint16),
            ((0, 0, 0) if legacy else (nt, ys, NC), np.uint8)]


def pack_stacked(ws, int_kernel: bool | None = None, release: bool = False, alloc=huge_empty) -> PackedWeight | None:
    """QTensors (N_i, K) packed as one (sum N_i, K) matrix (see stackable), or None if they cannot be:
    shapes that do not stack (decided before anything is allocated), or values the layout cannot
    hold (MXFP4 scales beyond f16's range, found as they are packed: a warning, and what was packed
    is dropped).  int_kernel: which kernel runs it; None picks use_int_kernel()'s.  True needs
    target.INT_KERNEL.  release: drop each chunk's pages of a mapped file once packed
    (quant.tensor.release_mapped), so a tensor and its packed copy are never resident together.
    alloc(shape, dtype): where the planes go (np.empty-like; by default huge pages where the OS has
    them, see hugepages.py)."""
    ws = tuple(ws)
    if not stackable(ws):
        return None
    int_kernel = use_int_kernel() if int_kernel is None else bool(int_kernel)
    if int_kernel and not INT_KERNEL:
        raise ValueError("the integer kernel needs a CPU with AVX-512 VNNI, AVX-512BW or AVX2")
    type_id = ws[0].type_id
    L, K = LAYOUTS[type_id], ws[0].shape[-1]
    nts = [-(-w.raw.shape[0] // NC) for w in ws]
    legacy = L.scales == SC_F16
    # what every decode step streams
    lo, hi, s, m, sc = (alloc(shape, dtype) for shape, dtype in packed_shapes(ws))
    xs, ys = s.shape[1], (sc.shape[1] if not legacy else 1)
    n_chunks = min(16, max(nts))
    rq = np.empty((n_chunks, NC, K), np.uint8)
    rs = np.zeros((n_chunks, NC, xs), np.uint16)
    rm = np.zeros((n_chunks, NC, xs), np.uint16)
    rsc = np.zeros((n_chunks, NC, ys), np.uint8)
    a = unfit = 0
    for w, n in zip(ws, nts):
        for c0 in range(0, n, CHUNK_TILES):  # a chunk at a time, its pages of the file released after
            c1 = min(n, c0 + CHUNK_TILES)
            part = lambda arr, present: arr[a + c0:a + c1] if present else arr
            rows = w.raw[c0 * NC:c1 * NC]
            populate_mapped(rows)
            unfit += pack_rows(static_type(type_id), L.has_min, not legacy, rows,
                               lo[a + c0:a + c1], part(hi, L.hi_bits > 0), s[a + c0:a + c1], part(m, L.has_min),
                               part(sc, not legacy), rq, rs, rm, rsc)
            if release:
                release_mapped(rows)
        a += n
    if unfit:
        warnings.warn(f"an MXFP4 weight ({' x '.join(map(str, ws[0].shape))}) has blocks scaled beyond f16's range "
                      "(2**-24 .. 2**15): it runs on the slower reference path", RuntimeWarning, stacklevel=2)
        return None
    return PackedWeight(type_id, sum(w.raw.shape[0] for w in ws), K, L, lo, hi, s, m, sc, ws, ACT_ROUNDING[type_id],
                        int_kernel)


@dataclass(frozen=True, eq=False)
class PackedExperts:
    """A mixture's experts for one product, packed alike: each plane of PackedWeight with a leading
    expert axis (lo: (E, NT, K//G, lo_bytes), ...), so one compiled loop can run any expert
    (moe.experts_ffn, which takes `planes` and `info`).  weights[e] is expert e as a PackedWeight
    of views into these."""

    weights: tuple
    lo: np.ndarray
    hi: np.ndarray
    s: np.ndarray
    m: np.ndarray
    sc: np.ndarray

    @property
    def planes(self) -> tuple:
        return self.lo, self.hi, self.s, self.m, self.sc

    @property
    def info(self) -> tuple:
        """(StaticType, activation rounding, rows, lo_bits, hi_bits, group), as experts_ffn takes them."""
        w, L = self.weights[0], self.weights[0].layout
        return static_type(w.type_id), w.act, w.n, L.lo_bits, L.hi_bits, L.group

    @staticmethod
    def shapes(groups) -> list[tuple[tuple[int, ...], type]] | None:
        """The planes' (shape, dtype) for groups (per expert, the QTensors stacked as its matrix),
        or None where the experts cannot be packed alike."""
        if not all(stackable(ws) for ws in groups):
            return None
        first = packed_shapes(groups[0])
        if any(packed_shapes(ws) != first or ws[0].type_id != groups[0][0].type_id for ws in groups):
            return None
        return [((len(groups),) + shape, dtype) for shape, dtype in first]

    @classmethod
    def pack(cls, groups, alloc=huge_empty, release: bool = False) -> "PackedExperts | None":
        """Every expert packed (pack_stacked) into the planes' expert slices, or None as shapes()
        (decided before anything is allocated), or where an expert's values do not fit the layout
        (found as it is packed: pack_stacked)."""
        shapes = cls.shapes(groups)
        if shapes is None:
            return None
        planes = [alloc(shape, dtype) for shape, dtype in shapes]
        weights = []
        for e, ws in enumerate(groups):
            views = iter([p[e] for p in planes])
            w = pack_stacked(ws, release=release, alloc=lambda shape, dtype: next(views))
            if w is None:
                return None
            weights.append(w)
        return cls(tuple(weights), *planes)
