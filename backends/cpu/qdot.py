"""Products of activations with packed weights, the way llama.cpp forms them.

llama.cpp quantizes the activations to 8 bits (Q8_0: a scale per 32, Q8_K: per 256; see
activations.py) and takes an integer dot product per weight block, scaled once by both scales;
for the K-quants it first sums each super-block's sub-block dots times their small integer
scales (and the sub-block mins times the activation sums) in int32, then scales once per
super-block.  We do the same: the block dot is exact (small unsigned weight quants times 8-bit
activation quants; every product and partial sum is an integer below 2**24, so exact in any
order and in float32 as well as int32) and so are the int32 super-block sums, so the only
rounding is in the scaling and in the sum over blocks, and every kernel below, every batch size
and every way of splitting a prompt give the same floats.

The weights stay at the file's bits per weight (LAYOUTS, packed by repack.py): each quant is
stored as u = q + offset >= 0 in a low plane of 2, 4 or 8 bits and, for 5- and 6-bit types, a
high plane of 1 or 2 bits; the kernels take the planes apart in registers.  A block's quants lie
in groups of 4 columns: for each group, the NC rows of a tile follow each other with their 4
quants side by side, so one 64-byte vector holds 16 rows x 4 columns.  A plane of `bits` bits
holds 8 // bits consecutive groups in each byte (group k of a byte at bit bits * k).  Scales stay
as the file has them: f16 per block for the legacy types; for the K-quants the f16 super-block
scale (and min) per row plus the small integer sub-block scales (Q4_K and Q5_K: llama.cpp's 12
packed bytes), unpacked in the kernel once per super-block.

The kernels are explicit LLVM vector code (numba intrinsics: generic LLVM operations but for the
x86 dot instructions), over a register tile of TT tokens x ROWS rows:
- integer, with AVX-512 VNNI (target.VNNI): vpdpbusd multiplies 4 unsigned weight bytes by 4
  signed activation bytes and adds them into an int32 lane; starting each lane at -offset * (the
  block's sum of activation quants) leaves exactly the signed block dot;
- integer, with AVX2 or AVX-512BW (target.MADD): the same sums from vpmaddubsw and vpmaddwd;
- portable: the quants widened to float32 and multiplied by the 4 activations of their group,
  the 4 column lanes of each row added at the end of the block (exact integers), the offset term
  added; the same integer, then the same scaling operations in the same order.
All take the same layout; which one runs is chosen per weight when it is packed (repack.py).
Batches of a type's Layout.expand_from tokens or more first expand each tile to bytes
(expand_tile) and run all their tokens over that: the unpacking is paid once per tile instead of
once per 4 tokens, for a pass over the whole weight that pays only on long batches.

The intrinsics live in this module on purpose: numba's on-disk cache of a function is keyed on
its own file only, so code generated for it from another module would go stale unnoticed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from infer.quant import types as qt
from infer.quant.static_type import StaticTypeType

from .activations import ACT_Q8_K, pair_sums, quantize_rows
from .target import INT_KERNEL, VECTOR_WIDTH, VNNI, VNNI_BYTES, half_to_float, splat

NC = 64  # rows per tile: 4 vectors of 16 lanes, enough independent work per column to hide latency
TT_MAX = 4  # most tokens one pass of either kernel takes (the rows of the acc scratch)

# How a layout's block scales are stored (see the module doc).
SC_F16 = 0  # s: f16 scale per block; m: f16 of -min per block
SC_K6 = 1  # s: f16 d per super-block; sc: signed 8-bit scale per sub-block (Q3_K, Q6_K): d * sc
SC_K2 = 2  # s, m: f16 d, dmin per super-block; sc: per sub-block byte, d * (lo 4 bits), dmin * (hi 4 bits)
SC_K4 = 3  # s, m: f16 d, dmin per super-block; sc: 12 bytes per super-block, unpacked as ggml's get_scale_min_k4


@dataclass(frozen=True)
class Layout:
    """How one GGML type's blocks are packed: weight = scale * (u - offset) - min."""

    group: int  # G: elements per block scale (sub-block for the K-quants)
    lo_bits: int  # low plane: 2, 4 or 8 bits per quant
    hi_bits: int  # high plane: 0, 1 or 2 bits per quant (u's bits above lo_bits)
    offset: int  # u = q + offset, so that u >= 0
    scales: int  # SC_*
    has_min: bool
    # MXFP4: the 4-bit planes keep its e2m1 codes; the kernels map each to u = value + 12 (its
    # values are the integers 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) after taking the nibble apart
    e2m1: bool = False
    # batches of this many tokens or more run on tiles expanded to bytes (expand_tile; 0: never)
    expand_from: int = 0

    @property
    def lo_bytes(self) -> int:  # bytes of one block of one tile in the low plane
        return _plane_bytes(self.group, self.lo_bits)

    @property
    def hi_bytes(self) -> int:
        return _plane_bytes(self.group, self.hi_bits)


def _plane_bytes(group: int, bits: int) -> int:
    """Bytes per block per tile of a plane: NC rows x 4 bytes per byte-group, each byte-group
    holding 8 // bits groups of 4 columns (Q3_K's 4 groups leave half of its 1-bit bytes unused)."""
    return -(-(group // 4) * bits // 8) * NC * 4 if bits else 0


# expand_from, measured (AVX-512 VNNI, 2 threads; 8960 x 1536 products and whole 1.5B models at
# 16-512 tokens): expanding costs a pass over the whole weight per product, and saves the
# unpacking each 4-token pass does in registers, which is cheap for plain nibbles (Q4_*: still
# no gain at 512 tokens in a whole Q4_K_M model) and dearer with a high plane, 2-bit fields or
# MXFP4's codes (Q3_K and MXFP4 gain from 64 tokens); Q4_0/Q4_1 and Q5_0/Q5_1, measured up to
# 256 tokens (no gain there), take Q4_K's and Q5_K's
LAYOUTS = {
    qt.Q4_0: Layout(32, 4, 0, 8, SC_F16, False, expand_from=1024),
    qt.Q4_1: Layout(32, 4, 0, 0, SC_F16, True, expand_from=1024),
    qt.Q5_0: Layout(32, 4, 1, 16, SC_F16, False, expand_from=384),
    qt.Q5_1: Layout(32, 4, 1, 0, SC_F16, True, expand_from=384),
    qt.Q8_0: Layout(32, 8, 0, 128, SC_F16, False),  # bytes already
    qt.Q2_K: Layout(16, 2, 0, 0, SC_K2, True, expand_from=128),
    qt.Q3_K: Layout(16, 2, 1, 4, SC_K6, False, expand_from=64),
    qt.Q4_K: Layout(32, 4, 0, 0, SC_K4, True, expand_from=1024),
    qt.Q5_K: Layout(32, 4, 1, 0, SC_K4, True, expand_from=384),
    qt.Q6_K: Layout(16, 4, 2, 32, SC_K6, False, expand_from=192),
    # its 2**(e - 128) scale as f16 (repack.py)
    qt.MXFP4: Layout(32, 4, 0, 12, SC_F16, False, e2m1=True, expand_from=48),
}

# Prefill expands a tile's quants to bytes once (expand_tile) and runs every token over them:
# the same u, the same scales, read as an 8-bit plane (Q8_0 is one already).
EXPANDED = 256  # type_id + EXPANDED: that type's quants expanded to bytes
BYTE_LAYOUTS = {t + EXPANDED: Layout(L.group, 8, 0, L.offset, L.scales, L.has_min)
                for t, L in LAYOUTS.items() if L.lo_bits < 8}
# each type's expand_from by type id, as the compiled matmul_packed reads it (0: never)
EXPAND_FROM = tuple(LAYOUTS[t].expand_from if t in LAYOUTS else 0 for t in range(max(LAYOUTS) + 1))

W = VECTOR_WIDTH  # float32 lanes per vector
VC = 4  # vectors per call: 4*W rows
ROWS = VC * W  # rows one call covers (both kernels)
assert NC % ROWS == 0 and (not VNNI or ROWS == 64)

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _c64(v):
    return ir.Constant(I64, v)


def _const(ty, n, v):
    return ir.Constant(ir.VectorType(ty, n), [v] * n)


class _Arr:
    """Data pointer and shape of a C-contiguous numba array argument."""

    def __init__(self, context, builder, ty, val):
        a = context.make_array(ty)(context, builder, val)
        self.data = a.data
        self.shape = cgutils.unpack_tuple(builder, a.shape, ty.ndim)


_ARGS = ("key", "type_id", "lo", "hi", "s", "m", "sc", "tile", "qtile", "r0", "xq", "t0", "dxb", "bsum", "bpair", "a")
_ARRAYS = {"lo": (types.uint8, 3), "hi": (types.uint8, 3), "s": (types.uint16, 3), "m": (types.uint16, 3),
           "sc": (types.uint8, 3),
           "dxb": (types.float32, 2), "bsum": (types.float32, 2), "bpair": (types.int32, 2), "a": (types.float32, 2)}


class _Block:
    """IR for what both kernels do alike: a tile's quants and block scales for some rows."""

    def __init__(self, builder, arrs, tile, qtile):
        self.b, self.arrs, self.tile, self.qtile = builder, arrs, tile, qtile

    def _load(self, name, elem_off, n, ty):
        arr = self.arrs[name]
        p = self.b.bitcast(self.b.gep(arr.data, [elem_off]), ir.VectorType(ty, n).as_pointer())
        return self.b.load(p, align=1)

    def _tile_off(self, name, x, row, tile=None):
        """Element offset of [tile, x, row] in a (NT, X, NC) scale array (tile: the scale tile)."""
        b, shape = self.b, self.arrs[name].shape
        return b.add(b.mul(b.add(b.mul(self.tile if tile is None else tile, shape[1]), x), _c64(NC)), row)

    def plane(self, name, block_bytes, b_idx, group_byte, row, n):
        """n bytes (n/4 rows x 4 columns) of one byte-group of a plane of block b_idx."""
        bld, shape = self.b, self.arrs[name].shape
        off = bld.add(bld.mul(bld.add(bld.mul(self.qtile, shape[1]), b_idx), _c64(block_bytes)),
                      bld.add(bld.mul(group_byte, _c64(NC * 4)), bld.mul(row, _c64(4))))
        return self._load(name, off, n, I8)

    def quants(self, L: Layout, cache, b_idx, p, k, row, n):
        """<n x i8> u of group p * (8 // lo_bits) + k for n/4 rows from `row` (p, k: ints;
        cache: the plane vectors loaded so far for this block)."""
        bld = self.b
        key = ("lo", p, row)
        if key not in cache:
            cache[key] = self.plane("lo", L.lo_bytes, b_idx, _c64(p), row, n)
        u = cache[key]
        if L.lo_bits < 8:
            if k:
                u = bld.lshr(u, _const(I8, n, L.lo_bits * k))
            u = bld.and_(u, _const(I8, n, (1 << L.lo_bits) - 1))
        if L.e2m1:
            u = self.e2m1(u, n)
        if L.hi_bits:
            per = 8 // L.hi_bits
            j4 = p * (8 // L.lo_bits) + k
            key = ("hi", j4 // per, row)
            if key not in cache:
                cache[key] = self.plane("hi", L.hi_bytes, b_idx, _c64(j4 // per), row, n)
            h = cache[key]
            if j4 % per:
                h = bld.lshr(h, _const(I8, n, L.hi_bits * (j4 % per)))
            h = bld.shl(bld.and_(h, _const(I8, n, (1 << L.hi_bits) - 1)), _const(I8, n, L.lo_bits))
            u = bld.or_(u, h)
        return u

    def e2m1(self, code, n):
        """<n x i8> MXFP4 codes -> u = value + 12: the magnitude of the low 3 bits is c + (c - 4)+ +
        2 (c - 6)+ (0, 1, 2, 3, 4, 6, 8, 12), the high bit its sign; a few byte operations, no table."""
        bld = self.b
        vt = ir.VectorType(I8, n)
        usub = cgutils.get_or_insert_function(bld.module, ir.FunctionType(vt, [vt, vt]), f"llvm.usub.sat.v{n}i8")
        c = bld.and_(code, _const(I8, n, 7))
        mag = bld.add(bld.add(c, bld.call(usub, [c, _const(I8, n, 4)])),
                      bld.shl(bld.call(usub, [c, _const(I8, n, 6)]), _const(I8, n, 1)))
        negative = bld.icmp_unsigned("!=", bld.and_(code, _const(I8, n, 8)), _const(I8, n, 0))
        return bld.select(negative, bld.sub(_const(I8, n, 12), mag), bld.add(_const(I8, n, 12), mag))

    def scales(self, L: Layout, b_idx, row, n):
        """(scale, min or None) of legacy block b_idx for n rows from `row`, as <n x float>."""
        h2f = lambda name: half_to_float(self.b, self._load(name, self._tile_off(name, b_idx, row), n, I16))
        return h2f("s"), (h2f("m") if L.has_min else None)

    def super_scales(self, L: Layout, sb, row, n):
        """(d, dmin or None) of K-quant super-block sb for n rows from `row`, as <n x float>."""
        h2f = lambda name: half_to_float(self.b, self._load(name, self._tile_off(name, sb, row), n, I16))
        return h2f("s"), (h2f("m") if L.has_min else None)

    def sub_scales(self, L: Layout, sb, j: int, row, n):
        """(scale, min or None) of sub-block j (an int) of K-quant super-block sb for n rows from
        `row`, as the file's small integers in <n x i32>."""
        bld = self.b
        vi = ir.VectorType(I32, n)
        v = lambda c: _const(I8, n, c)
        if L.scales != SC_K4:  # a byte per sub-block: Q3_K/Q6_K signed scales, Q2_K two nibbles
            byte = self._load("sc", self._tile_off("sc", bld.add(bld.mul(sb, _c64(256 // L.group)), _c64(j)), row), n, I8)
            if L.scales == SC_K6:
                return bld.sext(byte, vi), None
            return bld.zext(bld.and_(byte, v(15)), vi), bld.zext(bld.lshr(byte, v(4)), vi)
        # Q4_K/Q5_K: the super-block's 12 scale bytes, unpacked as ggml's get_scale_min_k4
        q = lambda i: self._load("sc", self._tile_off("sc", bld.add(bld.mul(sb, _c64(12)), _c64(i)), row), n, I8)
        top2 = lambda x: bld.shl(bld.lshr(x, v(6)), v(4))  # bits 6-7 of a byte as bits 4-5
        if j < 4:
            sc, mn = bld.and_(q(j), v(63)), bld.and_(q(j + 4), v(63))
        else:
            sc = bld.or_(bld.and_(q(j + 4), v(15)), top2(q(j - 4)))
            mn = bld.or_(bld.lshr(q(j + 4), v(4)), top2(q(j)))
        return bld.zext(sc, vi), bld.zext(mn, vi)


def _make_dot(TT: int):
    """The intrinsic dot(key, type_id, lo, hi, s, m, sc, tile, qtile, r0, xq, t0, dxb, bsum, bpair, a):
    a[tt, r0:r0+ROWS] = rows r0.. of tile `tile` times the activations of token t0+tt, tt < TT;
    the tile's quants are tile `qtile` of lo and hi (0 for a tile expanded on its own, see
    expand_tile), its scales tile `tile` of s, m and sc.  type_id + EXPANDED: the type's quants
    expanded to bytes (BYTE_LAYOUTS).  key: the weight's StaticType; the code holds key.id's
    layouts only (it and its expanded form), type_id picking one of them.

    lo, hi: (NT, nb, bytes per block) uint8 planes (hi (0, 0, 0) when a type has none); s, m:
    (NT, blocks or super-blocks, NC) uint16 f16 bits (m (0, 0, 0) without mins); sc: (NT, X, NC)
    uint8 sub-block scales ((0, 0, 0) for the legacy types); xq: (T, K) int8
    activation quants (the VNNI kernel) or float32 (the portable one); dxb, bsum: (T, K//16) f32
    activation scales and quant sums per 16; bpair: (T, K // (2 * group)) int32, the quant sums per
    sub-block two at a time (pair_sums; read by the VNNI kernel for the K-quants with mins); a: (>=
    TT, NC) f32.
    """
    def dot(typingctx, key, type_id, lo, hi, s, m, sc, tile, qtile, r0, xq, t0, dxb, bsum, bpair, a):
        if not isinstance(key, StaticTypeType):
            return None
        args = dict(zip(_ARGS, (key, type_id, lo, hi, s, m, sc, tile, qtile, r0, xq, t0, dxb, bsum, bpair, a)))
        for name, (dt, nd) in _ARRAYS.items():
            arr = args[name]
            if not (isinstance(arr, types.Array) and arr.dtype == dt and arr.ndim == nd and arr.layout == "C"):
                return None
        if not (isinstance(xq, types.Array) and xq.ndim == 2 and xq.layout == "C"
                and (xq.dtype == types.float32 or (xq.dtype == types.int8 and INT_KERNEL))):
            return None
        kind = ("vnni" if VNNI else "madd") if xq.dtype == types.int8 else "float"
        sig = types.void(key, type_id, lo, hi, s, m, sc, tile, qtile, r0, xq, t0, dxb, bsum, bpair, a)

        def codegen(context, builder, signature, argv):
            st = signature.args
            arrs = {n: _Arr(context, builder, st[i], argv[i]) for i, n in enumerate(_ARGS) if n in _ARRAYS or n == "xq"}
            tid, tile_, qtile_, r0_, t0_ = (context.cast(builder, argv[i], st[i], types.int64) for i in (1, 7, 8, 9, 11))
            _Kernel(builder, arrs, tile_, qtile_, t0_, TT, kind).run(key.id, tid, r0_)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(dot)


class _Kernel:
    """Code generation of one call: ROWS rows from r0, TT tokens from t0, for one type's layouts."""

    def __init__(self, builder, arrs, tile, qtile, t0, TT, kind):
        self.b, self.arrs, self.t0, self.TT, self.kind = builder, arrs, t0, TT, kind
        self.int = kind != "float"
        self.wscale = None  # madd: per row vector, the int16 factors vpmaddwd widens by (None: 1)
        self.blk = _Block(builder, arrs, tile, qtile)
        self.K = arrs["xq"].shape[1]
        self.K16 = arrs["dxb"].shape[1]
        mod = builder.module
        self.fma_fn = {}
        # rows per vector and vectors per pass: the integer kernels W x 4 (all ROWS in one pass
        # over K), the portable one W x 1 (its 4-lane float accumulators take 4 registers a vector)
        self.rw, self.nv = W, (ROWS // W if self.int else 1)
        vi32 = ir.VectorType(I32, W)
        if kind == "vnni":
            vb = ir.VectorType(I8, 64) if VNNI_BYTES else vi32
            self.vb = vb
            self.dp_fn = cgutils.get_or_insert_function(mod, ir.FunctionType(vi32, [vi32, vb, vb]), "llvm.x86.avx512.vpdpbusd.512")
            vw = ir.VectorType(I16, 32) if VNNI_BYTES else vi32  # its word operands, typed as vpdpbusd's
            self.vw = vw
            self.dpw_fn = cgutils.get_or_insert_function(mod, ir.FunctionType(vi32, [vi32, vw, vw]), "llvm.x86.avx512.vpdpwssd.512")
        elif kind == "madd":
            vb, vi16 = ir.VectorType(I8, 4 * W), ir.VectorType(I16, 2 * W)
            ub, wd = (("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512") if W == 16
                      else ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"))
            self.vb = vb
            self.ub_fn = cgutils.get_or_insert_function(mod, ir.FunctionType(vi16, [vb, vb]), ub)
            self.wd_fn = cgutils.get_or_insert_function(mod, ir.FunctionType(vi32, [vi16, vi16]), wd)

    def fma(self, x, y, z):
        n = x.type.count
        if n not in self.fma_fn:
            vf = ir.VectorType(F32, n)
            self.fma_fn[n] = cgutils.get_or_insert_function(self.b.module, ir.FunctionType(vf, [vf, vf, vf]), f"llvm.fma.v{n}f32")
        return self.b.call(self.fma_fn[n], [x, y, z])

    def dot_pairs(self, acc, a, b):
        """acc + a.lo * b.lo + a.hi * b.hi in each int32 lane, its two int16 halves signed (vpdpwssd):
        exact for the K-quant mins (<= 63) times activation sums (|sum| <= 32 * 127)."""
        bld = self.b
        return bld.call(self.dpw_fn, [acc, bld.bitcast(a, self.vw), bld.bitcast(b, self.vw)])

    def run(self, type_id, tid, r0):
        # type_id: the weight's GGML type, whose layouts alone are generated; tid: which of them runs
        bld = self.b
        vf = ir.VectorType(F32, self.rw)
        self.acc = [[cgutils.alloca_once(bld, vf) for _ in range(self.nv)] for _ in range(self.TT)]
        n4 = 4 * self.rw
        self.iacc = [[cgutils.alloca_once(bld, ir.VectorType(I32, self.rw) if self.int else ir.VectorType(F32, n4))
                      for _ in range(self.nv)] for _ in range(self.TT)]
        with cgutils.for_range(bld, _c64(ROWS // (self.rw * self.nv))) as passes:
            rows = [bld.add(r0, bld.add(bld.mul(passes.index, _c64(self.rw * self.nv)), _c64(i * self.rw)))
                    for i in range(self.nv)]
            for row in self.acc:
                for p in row:
                    bld.store(ir.Constant(vf, [0.0] * self.rw), p)
            sw = bld.switch(tid, bld.function.append_basic_block("unknown_type"))
            done = bld.function.append_basic_block("layout_done")
            for t, L in (*LAYOUTS.items(), *BYTE_LAYOUTS.items()):
                if t not in (type_id, type_id + EXPANDED):
                    continue
                case = bld.function.append_basic_block(f"layout_{t}")
                sw.add_case(ir.Constant(I64, t), case)
                bld.position_at_end(case)
                (self.block_loop if L.scales == SC_F16 else self.superblock_loop)(L, rows)
                bld.branch(done)
            bld.position_at_end(sw.default)
            bld.branch(done)
            bld.position_at_end(done)
            aa = self.arrs["a"]
            for tt in range(self.TT):
                for i, row in enumerate(rows):
                    ai = bld.add(bld.mul(_c64(tt), aa.shape[1]), row)
                    p = bld.bitcast(bld.gep(aa.data, [ai]), vf.as_pointer())
                    bld.store(bld.load(self.acc[tt][i]), p, align=4)

    def block_loop(self, L: Layout, rows):
        """The whole K for a legacy layout: per block the exact integer dot, then one FMA with the
        product of the block's and the activations' scales (as llama.cpp), and one for the min
        (Q4_1, Q5_1: the activations are Q8_1, their block sums s already scaled)."""
        bld, blk, TT = self.b, self.blk, self.TT
        with cgutils.for_range(bld, bld.udiv(self.K, _c64(L.group))) as loop:
            b_idx = loop.index
            dxs = [self.act_scale(tt, bld.mul(b_idx, _c64(L.group // 16))) for tt in range(TT)]
            bss = [self.act_sum(tt, b_idx, L) for tt in range(TT)]
            self.block_ints(L, b_idx, rows, bss)
            for i, row in enumerate(rows):
                s, m = blk.scales(L, b_idx, row, self.rw)
                for tt in range(TT):
                    c = bld.sitofp(self.block_dot(tt, i, L, bss[tt]), ir.VectorType(F32, self.rw))
                    a = self.fma(c, bld.fmul(s, dxs[tt]), bld.load(self.acc[tt][i]))
                    if m is not None:  # - min * the block's Q8_1 sum s (quantize_row): llama.cpp's m * s
                        a = self.fma(m, splat(bld, bld.fneg(bss[tt]), self.rw), a)
                    bld.store(a, self.acc[tt][i])

    def superblock_loop(self, L: Layout, rows):
        """The whole K for a K-quant layout, as llama.cpp's ggml_vec_dot_q*_K_q8_K: per super-block
        the sub-blocks' exact integer dots times their integer scales, and their mins times their
        activation sums, each summed in int32 (below 2**31: |dot| <= 31*128*32 with scales <= 63
        for Q4_K/Q5_K, |dot| <= 32*128*16 with |scale| <= 128 for Q6_K), then one FMA each with
        the super-block's d and dmin times the activations' scale (Q8_K: one per super-block).
        The madd kernel scales each sub-block's int16 pair sums as vpmaddwd widens them (as
        llama.cpp does), so its offset term -offset * sum_j scale_j * (activation sum j) is formed
        up front with the min term; the others scale each sub-block's int32 dot."""
        bld, blk, TT, rw = self.b, self.blk, self.TT, self.rw
        nsub, nv = 256 // L.group, len(rows)
        vi, vf = ir.VectorType(I32, rw), ir.VectorType(F32, rw)
        madd = self.kind == "madd"
        sumi = self.iacc if madd else [[cgutils.alloca_once(bld, vi) for _ in rows] for _ in range(TT)]
        # the super-block's sub-block scales, unpacked once (the sub-block loop is not unrolled:
        # unrolled, the 4-token kernel's code outgrows the instruction cache); madd: as int16 pairs
        scbuf = cgutils.alloca_once(bld, ir.ArrayType(ir.VectorType(I16, 2 * rw) if madd else vi, nsub * nv))
        with cgutils.for_range(bld, bld.udiv(self.K, _c64(256))) as loop:
            sb = loop.index
            dxs = [self.act_scale(tt, bld.mul(sb, _c64(16))) for tt in range(TT)]
            bs = [[bld.fptosi(self.act_sum(tt, bld.add(bld.mul(sb, _c64(nsub)), _c64(j)), L), I32) for j in range(nsub)]
                  for tt in range(TT)]
            bsi = [[splat(bld, b, rw) for b in row] for row in bs]
            pairs = self.kind == "vnni" and L.has_min  # the mins' sum by vpdpwssd (see dot_pairs)
            if pairs:  # each token's activation sums of sub-blocks 2p and 2p + 1 (pair_sums)
                bs2 = [[self.act_pair(tt, bld.add(bld.mul(sb, _c64(nsub // 2)), _c64(p))) for p in range(nsub // 2)]
                       for tt in range(TT)]
            for i, row in enumerate(rows):
                _, dmin = blk.super_scales(L, sb, row, rw)
                mins = [ir.Constant(vi, [0] * rw)] * TT
                offs = list(mins)
                mns = []
                for j in range(nsub):
                    sc, mn = blk.sub_scales(L, sb, j, row, rw)
                    p = bld.gep(scbuf, [_c64(0), _c64(j * nv + i)])
                    if madd:  # (sc, sc) in each int32 lane
                        sc16 = bld.and_(sc, ir.Constant(vi, [0xFFFF] * rw))
                        bld.store(bld.bitcast(bld.or_(sc16, bld.shl(sc16, ir.Constant(vi, [16] * rw))), p.type.pointee), p)
                    else:
                        bld.store(sc, p)
                    mns.append(mn)
                    for tt in range(TT):
                        if mn is not None and not pairs:
                            mins[tt] = bld.add(mins[tt], bld.mul(mn, bsi[tt][j]))
                        if madd and L.offset:
                            offs[tt] = bld.add(offs[tt], bld.mul(sc, bsi[tt][j]))
                for p in range(nsub // 2 if pairs else 0):
                    mn2 = bld.or_(mns[2 * p], bld.shl(mns[2 * p + 1], ir.Constant(vi, [16] * rw)))
                    for tt in range(TT):
                        mins[tt] = self.dot_pairs(mins[tt], mn2, bs2[tt][p])
                for tt in range(TT):
                    bld.store(bld.mul(offs[tt], ir.Constant(vi, [-L.offset] * rw)), sumi[tt][i])
                    if dmin is not None:  # - dmin * sum_j min_j * (activation sum j)
                        a = self.fma(bld.sitofp(mins[tt], vf), bld.fneg(bld.fmul(dmin, dxs[tt])), bld.load(self.acc[tt][i]))
                        bld.store(a, self.acc[tt][i])
            with cgutils.for_range(bld, _c64(nsub)) as sub:
                j = sub.index
                b_idx = bld.add(bld.mul(sb, _c64(nsub)), j)
                scs = [bld.load(bld.gep(scbuf, [_c64(0), bld.add(bld.mul(j, _c64(nv)), _c64(i))])) for i in range(nv)]
                if madd:  # each int32 lane's two int16 pair sums times the row's scale
                    self.wscale = scs
                    self.block_ints(L, b_idx, rows, None)
                    self.wscale = None
                else:
                    bss = [self.act_sum(tt, b_idx, L) for tt in range(TT)]
                    self.block_ints(L, b_idx, rows, bss)
                    for i, sc in enumerate(scs):
                        for tt in range(TT):
                            c = self.block_dot(tt, i, L, bss[tt])
                            bld.store(bld.add(bld.load(sumi[tt][i]), bld.mul(c, sc)), sumi[tt][i])
            for i, row in enumerate(rows):
                d, _ = blk.super_scales(L, sb, row, rw)
                for tt in range(TT):
                    c = bld.sitofp(bld.load(sumi[tt][i]), vf)
                    bld.store(self.fma(c, bld.fmul(d, dxs[tt]), bld.load(self.acc[tt][i])), self.acc[tt][i])

    def act_scale(self, tt, k16):
        """Token tt's activation scale of its 16-element sub-block k16, splat over rw lanes."""
        bld, da = self.b, self.arrs["dxb"]
        di = bld.add(bld.mul(bld.add(self.t0, _c64(tt)), self.K16), k16)
        return splat(bld, bld.load(bld.gep(da.data, [di])), self.rw)

    def act_pair(self, tt, p):
        """Token tt's pair p of sub-block activation sums (bpair, see pair_sums), splat over rw lanes."""
        bld, bp = self.b, self.arrs["bpair"]
        di = bld.add(bld.mul(bld.add(self.t0, _c64(tt)), bp.shape[1]), p)
        return splat(bld, bld.load(bld.gep(bp.data, [di])), self.rw)

    def act_sum(self, tt, b_idx, L: Layout):
        """Token tt's sum of activation quants over block b_idx (a float holding an integer)."""
        bld, ba = self.b, self.arrs["bsum"]
        di = bld.add(bld.mul(bld.add(self.t0, _c64(tt)), self.K16), bld.mul(b_idx, _c64(L.group // 16)))
        bs = bld.load(bld.gep(ba.data, [di]))
        if L.group == 32:
            bs = bld.fadd(bs, bld.load(bld.gep(ba.data, [bld.add(di, _c64(1))])))
        return bs

    def block_ints(self, L: Layout, b_idx, rows, bss):
        """Every token's and row's integer dot of block b_idx into iacc (bss: the tokens' act_sum;
        None: add to iacc as it is, scaled by wscale, see superblock_loop)."""
        bld, blk, TT, n = self.b, self.blk, self.TT, 4 * self.rw
        xa = self.arrs["xq"]
        for tt in range(TT if bss is not None else 0):
            for p in self.iacc[tt]:
                if self.int:
                    # u carries +offset: start from -offset * (sum of the block's activation
                    # quants); the madd kernel takes Q8_0's quants signed (see accumulate)
                    off = 0 if self.kind == "madd" and L.offset == 128 else L.offset
                    init = bld.mul(bld.fptosi(bss[tt], I32), ir.Constant(I32, -off))
                    bld.store(splat(bld, init, self.rw), p)
                else:
                    bld.store(ir.Constant(ir.VectorType(F32, n), [0.0] * n), p)
        per = 8 // L.lo_bits
        # the low plane's byte-groups, unrolled: every shift is a constant
        cache = {}
        self.pending = [[None] * len(rows) for _ in range(TT)]  # madd: int16 pair sums not yet widened
        for pi in range(-(-L.group * L.lo_bits // 32)):
            for k in range(min(per, L.group // 4)):
                us = [blk.quants(L, cache, b_idx, pi, k, row, n) for row in rows]
                col = bld.add(bld.mul(b_idx, _c64(L.group)), _c64(4 * (pi * per + k)))
                done = pi * per + k + 1  # groups of this block added so far
                widen = done % self.widen_every(L) == 0 or 4 * done >= L.group
                for tt in range(TT):
                    xi = bld.add(bld.mul(bld.add(self.t0, _c64(tt)), self.K), col)
                    self.accumulate(tt, us, xa, xi, n, L, widen)

    @staticmethod
    def widen_every(L: Layout) -> int:
        """The madd kernel's vpmaddubsw pair sums (int16) of this many groups can be added before
        vpmaddwd widens them: |pair| <= 2 * umax * 127, so n pairs stay below 2**15 while
        n * 2 * umax * 127 < 2**15 (4-bit quants: a whole 32-column block; Q8_0's |q|: 1)."""
        umax = 128 if L.offset == 128 else (1 << (L.lo_bits + L.hi_bits)) - 1
        return max(1, 32767 // (2 * umax * 127))

    def pairs(self, u, xs, L: Layout):
        """<2rw x i16>: vpmaddubsw of u8 quants u and s8 activations xs, adjacent products summed
        (saturating; quants of up to 6 bits cannot saturate: 2 * 63 * 127 < 2**15).  Q8_0's
        u = q + 128 could, so it runs on |q| times xs with q's sign, as llama.cpp does
        (2 * 128 * 127 < 2**15), and its accumulator starts at 0."""
        bld, n = self.b, u.type.count
        if L.offset == 128:
            zero = _const(I8, n, 0)
            q = bld.xor(u, _const(I8, n, 0x80))
            neg = bld.icmp_signed("<", q, zero)
            u = bld.select(neg, bld.sub(zero, q), q)  # |q|, read unsigned (-128 -> 128)
            xs = bld.select(neg, bld.sub(zero, xs), xs)
        return bld.call(self.ub_fn, [u, xs])

    def accumulate(self, tt, us, xa, xi, n, L: Layout, widen: bool):
        """Add one group's 4 columns of quants times token tt's 4 activation quants (madd: into
        int16 pair sums, widened into the int32 sums when widen)."""
        bld = self.b
        if self.int:
            x4 = bld.load(bld.bitcast(bld.gep(xa.data, [xi]), I32.as_pointer()), align=1)
            xs = bld.bitcast(splat(bld, x4, self.rw), self.vb)
            for i, u in enumerate(us):
                if self.kind == "vnni":
                    # u8 weights (2nd operand) times s8 activations (3rd), 4 at a time
                    acc = bld.load(self.iacc[tt][i])
                    bld.store(bld.call(self.dp_fn, [acc, bld.bitcast(u, self.vb), xs]), self.iacc[tt][i])
                    continue
                p = self.pairs(u, xs, L)
                pend = self.pending[tt][i]
                pend = p if pend is None else bld.add(pend, p)
                if widen:
                    scale = _const(I16, n // 2, 1) if self.wscale is None else self.wscale[i]
                    wide = bld.call(self.wd_fn, [pend, scale])
                    bld.store(bld.add(bld.load(self.iacc[tt][i]), wide), self.iacc[tt][i])
                    pend = None
                self.pending[tt][i] = pend
            return
        x4 = bld.load(bld.bitcast(bld.gep(xa.data, [xi]), ir.VectorType(F32, 4).as_pointer()), align=4)
        xp = bld.shuffle_vector(x4, ir.Constant(ir.VectorType(F32, 4), ir.Undefined),
                                ir.Constant(ir.VectorType(I32, n), [c % 4 for c in range(n)]))
        for i, u in enumerate(us):
            uf = bld.uitofp(bld.zext(u, ir.VectorType(I32, n)), ir.VectorType(F32, n))
            bld.store(self.fma(uf, xp, bld.load(self.iacc[tt][i])), self.iacc[tt][i])

    def block_dot(self, tt, i, L: Layout, bs):
        """The block's exact signed integer dot for token tt, rows of vector i, as <rw x i32>."""
        bld, rw = self.b, self.rw
        acc = bld.load(self.iacc[tt][i])
        if self.int:
            return acc
        undef = ir.Constant(acc.type, ir.Undefined)
        lane = lambda k: bld.shuffle_vector(acc, undef, ir.Constant(ir.VectorType(I32, rw), [4 * r + k for r in range(rw)]))
        c = bld.fadd(bld.fadd(lane(0), lane(1)), bld.fadd(lane(2), lane(3)))
        if L.offset:
            c = bld.fadd(c, splat(bld, bld.fmul(bs, ir.Constant(F32, -float(L.offset))), rw))
        return bld.fptosi(c, ir.VectorType(I32, rw))  # exact: |c| < 2**24


dot_rows_1 = _make_dot(1)  # decode: one token (memory-bound either way)
dot_rows_4 = _make_dot(4)  # batches: four tokens share each loaded weight vector


@njit(cache=True, inline="always")
def _expand_plane(src, bits, low, group, out):
    # src: (nb, bytes per block) one tile of a plane; out: (nb * group * NC,) uint8 in the 8-bit
    # layout; ORs bits `low`.. of each u into out (low 0 overwrites)
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    for b in range(src.shape[0]):
        for j4 in range(group // 4):
            i0 = (j4 // per) * NC * 4
            sh = np.uint8(bits * (j4 % per))
            o = (b * group + 4 * j4) * NC
            # slices indexed from 0 by the loop: no negative-index checks, so the loop vectorizes
            sv, ov = src[b, i0:i0 + NC * 4], out[o:o + NC * 4]
            for ri in range(NC * 4):
                v = ((sv[ri] >> sh) & mask) << np.uint8(low)
                ov[ri] = v if low == 0 else ov[ri] | v


@njit(cache=True, inline="always")
def _expand_e2m1(src, group, out):
    # _expand_plane of MXFP4's 4-bit code plane, each code mapped to u = value + 12 as the
    # kernels' e2m1 (_Block.e2m1) maps it: magnitude c + (c - 4)+ + 2 (c - 6)+ of the low 3 bits
    for b in range(src.shape[0]):
        for j4 in range(group // 4):
            i0 = (j4 // 2) * NC * 4
            sh = np.uint8(4 * (j4 % 2))
            o = (b * group + 4 * j4) * NC
            sv, ov = src[b, i0:i0 + NC * 4], out[o:o + NC * 4]
            for ri in range(NC * 4):
                code = np.int32((sv[ri] >> sh) & np.uint8(15))
                c = code & 7
                mag = c + max(c - 4, 0) + 2 * max(c - 6, 0)
                ov[ri] = np.uint8(12 - mag if code & 8 else 12 + mag)


@njit(cache=True)
def expand_tile(lo_bits, hi_bits, group, e2m1, lo_t, hi_t, out):
    # lo_t, hi_t: (nb, bytes per block) one tile's planes (hi_t unused without a high plane);
    # e2m1: the layout's (MXFP4: codes mapped to u); out: (>= nb * group * NC,) uint8, the tile's
    # u as BYTE_LAYOUTS has them
    if e2m1:
        _expand_e2m1(lo_t, group, out)
        return
    if lo_bits == 4:  # constant widths, so each inlined copy is specialized
        _expand_plane(lo_t, 4, 0, group, out)
    else:
        _expand_plane(lo_t, 2, 0, group, out)
    if hi_bits == 1:
        _expand_plane(hi_t, 1, lo_bits, group, out)
    elif hi_bits == 2:
        _expand_plane(hi_t, 2, lo_bits, group, out)


@njit(cache=True, inline="always")
def store_row(src, dst, c0, n):
    # dst[c0:c0+n] = src[:n] (src, dst: 1-D f32).  Through slices indexed from 0, which need no
    # negative-index checks, so the copy is vector stores: one scalar store per output, into a
    # row of `out` not in cache, filled the store buffer and stalled the kernel on every pass
    # (a fifth of a 512-token product's time)
    s, d = src[:n], dst[c0:c0 + n]
    for r in range(n):
        d[r] = s[r]


@njit(cache=True, parallel=True)
def matmul_packed(key, mode, x, lo, hi, s, m, sc, N, xq_buf, dxb_buf, bsum_buf, out, col0, acc, lo_bits,
                  hi_bits, group, expanded):
    # out[:, col0:col0+N] = x @ W.T with x quantized by `mode` (ACT_Q8_0, ACT_Q8_1 or ACT_Q8_K, the
    # weight type's activation rounding)
    # key: the weight's StaticType (one compiled variant per type, holding that type's code only)
    # x: (T, K) f32; lo, hi, s, m, sc: a PackedWeight of N <= NT*NC rows of GGML type key.id
    #   (shapes in _make_dot's doc), its layout's lo_bits, hi_bits and group
    # xq_buf: (>= T*K,) int8 for the integer kernel, f32 for the portable one; dxb_buf: (>= T*K/16,),
    #   bsum_buf: (>= T*K/16 + T*K/32,) f32 scratch for the quantized activations (bsum_buf's
    #   tail: their sums per sub-block in pairs, pair_sums)
    # out: (T, >= col0+N) f32; acc: (n_chunks, 4, NC) f32 scratch, one per parallel chunk;
    # expanded: (n_chunks, 1, 1, >= K*NC) uint8 scratch, one tile's quants expanded to bytes per
    #   parallel chunk (its scales stay in s, m, sc)
    NT = lo.shape[0]
    T, K = x.shape
    xq = xq_buf[:T * K].reshape(T, K)
    dxb = dxb_buf[:T * K // 16].reshape(T, K // 16)
    bsum = bsum_buf[:T * K // 16].reshape(T, K // 16)
    npair = K // (2 * group)
    bpair = bsum_buf[T * K // 16:T * K // 16 + T * npair].view(np.int32).reshape(T, npair)
    quantize_rows(mode, x, xq, dxb, bsum)
    if mode == ACT_Q8_K:
        pair_sums(bsum, group // 16, bpair)
    expand = 0 < EXPAND_FROM[key.id] <= T
    tid = key.id + EXPANDED if expand else key.id
    n_chunks = min(acc.shape[0], NT)
    for c in prange(n_chunks):
        # tiles split evenly: the threads take equal runs of chunks, so equal chunks balance them
        packed_tiles(key, tid, expand, c * NT // n_chunks, (c + 1) * NT // n_chunks, lo, hi, s, m, sc, N, xq,
                     dxb, bsum, bpair, out, col0, acc[c], lo_bits, hi_bits, group, expanded[c])


@njit(cache=True)
def packed_tiles(key, tid, expand, tile0, tile1, lo, hi, s, m, sc, N, xq, dxb, bsum, bpair, out, col0, a,
                 lo_bits, hi_bits, group, ex):
    # matmul_packed's work on tiles tile0..tile1 (one parallel chunk): a, ex: the chunk's acc and
    # expanded scratch.  Its own function, not the parallel loop's body: numba compiles that body
    # into a gufunc where the same kernel calls ran ~20% slower
    T = xq.shape[0]
    qlo = ex if expand else lo
    for tile in range(tile0, tile1):
        qtile = tile
        if expand:
            expand_tile(lo_bits, hi_bits, group, key.id == qt.MXFP4, lo[tile], hi[tile] if hi_bits else lo[tile],
                        qlo[0, 0])
            qtile = 0
        r0 = tile * NC
        nr = min(NC, N - r0)
        t = 0
        while t + 4 <= T:  # four tokens per pass: each weight vector unpacked once, used four times
            for v in range(0, NC, ROWS):
                dot_rows_4(key, tid, qlo, hi, s, m, sc, tile, qtile, v, xq, t, dxb, bsum, bpair, a)
            for i in range(4):
                store_row(a[i], out[t + i], col0 + r0, nr)
            t += 4
        while t < T:
            for v in range(0, NC, ROWS):
                dot_rows_1(key, tid, qlo, hi, s, m, sc, tile, qtile, v, xq, t, dxb, bsum, bpair, a)
            store_row(a[0], out[t], col0 + r0, nr)
            t += 1
