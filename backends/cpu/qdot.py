"""Products of activations with repacked (int8 + block scale) weights, the way llama.cpp forms them.

llama.cpp quantizes the activations to 8 bits (Q8_0: a scale per 32, Q8_K: per 256) and takes
an integer dot product per weight block, scaled once by both scales.  We do the same: the block
dot is exact (int8 weights times integer activation quants, converted to float32: every product
and partial sum is an integer below 2**24, so exact in any order), so the only rounding is in
the scaling and in the sum over blocks.  Decode and prefill use the same arithmetic, so logits do
not depend on how the prompt was split into forward calls.

The kernels run over tiles of NC weight rows (see repack.py) in parallel.  The inner loop is
written as explicit LLVM vector code (a numba intrinsic): plain numba loops over a tile do get
vectorized, but every block then pays for run-time overlap checks between the arrays (LLVM
cannot know numba arrays do not alias) and the partial sums go through memory.  Here a register
tile of TT tokens x VC vectors of W rows accumulates one block, then is scaled and added to the
running sums.  Only generic LLVM vector operations are used, so the code compiles for any
target; W follows the widest float vector (16 with AVX-512, else 8; see target.py), which only
affects speed.  Prefill takes four tokens per pass, so each converted weight vector serves four FMAs.

With AVX-512 VNNI (weights packed in its layout, see repack.py) the block dot is an integer dot
instead: vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them into an int32
lane, 64 products per instruction against 16 per float FMA.  Its unsigned operand holds the
weights plus 128 and its signed one the activation quants (int8), so the int32 sum is the dot
plus 128 * (the block's sum of activation quants); starting the accumulator at minus that term
leaves exactly the integer the float kernel forms, and the scaling that follows is the same
operations in the same order, so the results are bit-identical (tests/test_matmul.py checks
it).  Converting the weights costs nothing there, so that kernel also serves single tokens.

The intrinsics live in this module on purpose: numba's on-disk cache of a function is keyed on
its own file only, so code generated for it from another module would go stale unnoticed.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .ops import f16_round
from .repack import ACT_Q8_0, NC
from .target import VECTOR_WIDTH, VNNI, VNNI_BYTES, half_to_float, splat

PAR_QUANT_MIN = 8  # from this many tokens on, quantize the activations in parallel
TT_MAX = 4  # most tokens one pass of either kernel takes (the rows of the acc scratch)


W = VECTOR_WIDTH  # float32 lanes per vector
VC = 4  # vectors per register tile: 4*W rows
ROWS = VC * W  # rows one call covers
assert NC % ROWS == 0

I8, I32, I64, F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
VF = ir.VectorType(F32, W)
VI8 = ir.VectorType(I8, W)


class _Arr:
    """Data pointer and shape of a C-contiguous numba array argument."""

    def __init__(self, context, builder, ty, val):
        a = context.make_array(ty)(context, builder, val)
        self.data = a.data
        self.shape = cgutils.unpack_tuple(builder, a.shape, ty.ndim)


def _scale_kind(s, m, operands, dxb, bsum, a):
    """Typing check shared by the dot_rows intrinsics: None unless every array is C-contiguous
    with the expected dtype and rank; else whether the scales s, m are f16 bits (uint16)."""
    sdt = s.dtype if isinstance(s, types.Array) and s.dtype in (types.float32, types.uint16) else None
    for arr, dt, nd in (*operands, (s, sdt, 3), (m, sdt, 3), (dxb, types.float32, 2),
                        (bsum, types.float32, 2), (a, types.float32, 2)):
        if not (isinstance(arr, types.Array) and arr.dtype == dt and arr.ndim == nd and arr.layout == "C"):
            return None
    return sdt == types.uint16


def _scale_loader(builder, half):
    """load(arr, off): W scales at element off of s or m, as float32 (f16 bits are widened:
    vcvtph2ps on x86)."""
    def load(arr, off):
        if half:
            p = builder.bitcast(builder.gep(arr.data, [off]), ir.VectorType(ir.IntType(16), W).as_pointer())
            return half_to_float(builder, builder.load(p, align=2))
        return builder.load(builder.bitcast(builder.gep(arr.data, [off]), VF.as_pointer()), align=4)
    return load


def _make_dot_rows(TT: int):
    def dot_rows(typingctx, q, tile, r0, s, m, has_min, xq, t0, dxb, bsum, a):
        # q: (NT, nb, G, NC) int8; s, m: (NT | 1, nb, NC) f32, or uint16 holding f16 bits
        # xq: (T, K) f32; dxb, bsum: (T, K//16) f32
        # a: (TT, NC) f32.  Writes a[tt, r0:r0+ROWS] = row r0.. of tile `tile` times token t0+tt.
        half = _scale_kind(s, m, ((q, types.int8, 4), (xq, types.float32, 2)), dxb, bsum, a)
        if half is None:
            return None
        sig = types.void(q, tile, r0, s, m, has_min, xq, t0, dxb, bsum, a)

        def codegen(context, builder, signature, args):
            st = signature.args
            qa, sa, ma, xa, da, ba, aa = (_Arr(context, builder, st[i], args[i]) for i in (0, 3, 4, 6, 8, 9, 10))
            tile_, r0_, t0_ = (context.cast(builder, args[i], st[i], types.int64) for i in (1, 2, 7))
            hm = context.cast(builder, args[5], st[5], types.boolean)
            nb, G, NC = qa.shape[1], qa.shape[2], qa.shape[3]
            K = xa.shape[1]
            K16 = da.shape[1]
            mul, add = builder.mul, builder.add
            fma_fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF, VF, VF]), f"llvm.fma.v{W}f32")
            fma = lambda x, y, z: builder.call(fma_fn, [x, y, z])
            c64 = lambda v: ir.Constant(I64, v)

            load_scales = _scale_loader(builder, half)
            # element offsets of this tile's rows r0.. in q (bytes) and in s/m
            q_base = add(mul(mul(tile_, nb), mul(G, NC)), r0_)
            s_base = add(mul(mul(tile_, nb), NC), r0_)
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * W)) for _ in range(VC)] for _ in range(TT)]

            cacc = [[cgutils.alloca_once(builder, VF) for _ in range(VC)] for _ in range(TT)]

            def block_loop(g):
                # the whole K for one block size g (16 or 32)
                with cgutils.for_range(builder, nb) as loop:
                    b = loop.index
                    for row in cacc:
                        for p in row:
                            builder.store(ir.Constant(VF, [0.0] * W), p)
                    qb = add(q_base, mul(b, mul(G, NC)))
                    xb = mul(b, G)
                    # A real loop over the block's columns (trip count G, opaque to LLVM): fully
                    # unrolled, the scheduler hoists every conversion and spills them all.
                    with cgutils.for_range(builder, G) as jl:
                        j = jl.index
                        qj = add(qb, mul(j, NC))
                        w = []
                        for v in range(VC):
                            p = builder.bitcast(builder.gep(qa.data, [add(qj, c64(v * W))]), VI8.as_pointer())
                            w.append(builder.sitofp(builder.sext(builder.load(p, align=1), ir.VectorType(I32, W)), VF))
                        for tt in range(TT):
                            xi = add(mul(add(t0_, c64(tt)), K), add(xb, j))
                            xs = splat(builder, builder.load(builder.gep(xa.data, [xi])))
                            for v in range(VC):
                                builder.store(fma(w[v], xs, builder.load(cacc[tt][v])), cacc[tt][v])
                    c = [[builder.load(p) for p in row] for row in cacc]
                    sb = add(s_base, mul(b, NC))
                    sub = c64(g // 16)
                    for tt in range(TT):
                        di = add(mul(add(t0_, c64(tt)), K16), mul(b, sub))
                        dx = splat(builder, builder.load(builder.gep(da.data, [di])))
                        bs = builder.load(builder.gep(ba.data, [di]))
                        if g == 32:
                            bs = builder.fadd(bs, builder.load(builder.gep(ba.data, [add(di, c64(1))])))
                        nbs = splat(builder, builder.fneg(bs))
                        for v in range(VC):
                            off = add(sb, c64(v * W))
                            sv = load_scales(sa, off)
                            # as llama.cpp: one FMA of the exact block dot with the product of the two scales
                            a = fma(c[tt][v], builder.fmul(sv, dx), builder.load(acc[tt][v]))
                            # weights with mins: - m * (sum of the block's activation quants)
                            mv = load_scales(ma, builder.select(hm, off, c64(v * W)))
                            a = builder.select(hm, fma(builder.fmul(mv, dx), nbs, a), a)
                            builder.store(a, acc[tt][v])

            is32 = builder.icmp_signed("==", G, c64(32))
            with builder.if_else(is32) as (then, otherwise):
                with then:
                    block_loop(32)
                with otherwise:
                    block_loop(16)
            for tt in range(TT):
                for v in range(VC):
                    ai = add(mul(c64(tt), aa.shape[1]), add(r0_, c64(v * W)))
                    p = builder.bitcast(builder.gep(aa.data, [ai]), VF.as_pointer())
                    builder.store(builder.load(acc[tt][v]), p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dot_rows


# VNNI register tile: TT tokens x 4 int32 vectors of 16 rows (16 accumulators at TT = 4; the
# float running sums spill to the stack, touched once per block).  Measured best of 2..8 x 2..4.
VC_VNNI = 4
ROWS_VNNI = VC_VNNI * 16
assert NC % ROWS_VNNI == 0 and (not VNNI or ROWS_VNNI == ROWS)  # one matmul loop steps both kernels
VI32 = ir.VectorType(I32, 16)
VB = ir.VectorType(I8, 64) if VNNI_BYTES else VI32  # vpdpbusd's byte operands, as this LLVM declares them


def _make_dot_rows_vnni(TT: int):
    def dot_rows_vnni(typingctx, q, tile, r0, s, m, has_min, xi, t0, dxb, bsum, a):
        # q: (NT, nb, G//4, NC, 4) uint8, q + 128; s, m: (NT | 1, nb, NC) f32, or uint16 holding f16 bits
        # xi: (T, K) int8 activation quants; dxb, bsum: (T, K//16) f32
        # a: (>= TT, NC) f32.  Writes a[tt, r0:r0+ROWS_VNNI] = row r0.. of tile `tile` times token t0+tt,
        # bit-identical to dot_rows.
        half = _scale_kind(s, m, ((q, types.uint8, 5), (xi, types.int8, 2)), dxb, bsum, a)
        if half is None:
            return None
        sig = types.void(q, tile, r0, s, m, has_min, xi, t0, dxb, bsum, a)

        def codegen(context, builder, signature, args):
            st = signature.args
            qa, sa, ma, xa, da, ba, aa = (_Arr(context, builder, st[i], args[i]) for i in (0, 3, 4, 6, 8, 9, 10))
            tile_, r0_, t0_ = (context.cast(builder, args[i], st[i], types.int64) for i in (1, 2, 7))
            hm = context.cast(builder, args[5], st[5], types.boolean)
            nb, G4, NC = qa.shape[1], qa.shape[2], qa.shape[3]
            K = xa.shape[1]
            K16 = da.shape[1]
            mul, add = builder.mul, builder.add
            fma_fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF, VF, VF]), "llvm.fma.v16f32")
            fma = lambda x, y, z: builder.call(fma_fn, [x, y, z])
            dp_fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VI32, [VI32, VB, VB]),
                                                   "llvm.x86.avx512.vpdpbusd.512")
            c64 = lambda v: ir.Constant(I64, v)

            def splat_i32(x):
                v = builder.insert_element(ir.Constant(VI32, ir.Undefined), x, ir.Constant(I32, 0))
                return builder.shuffle_vector(v, ir.Constant(VI32, ir.Undefined), ir.Constant(VI32, [0] * 16))

            load_scales = _scale_loader(builder, half)
            # byte offset of this tile's rows r0.. in q (4 bytes per row per 4 columns); element offset in s/m
            q_base = add(mul(mul(tile_, nb), mul(mul(G4, NC), c64(4))), mul(r0_, c64(4)))
            s_base = add(mul(mul(tile_, nb), NC), r0_)
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * 16)) for _ in range(VC_VNNI)]
                   for _ in range(TT)]
            iacc = [[cgutils.alloca_once(builder, VI32) for _ in range(VC_VNNI)] for _ in range(TT)]

            def block_loop(g, mins):
                # the whole K for one block size g (16 or 32), with or without mins
                with cgutils.for_range(builder, nb) as loop:
                    b = loop.index
                    sub = c64(g // 16)
                    dxs, bss = [], []
                    for tt in range(TT):
                        di = add(mul(add(t0_, c64(tt)), K16), mul(b, sub))
                        dxs.append(splat(builder, builder.load(builder.gep(da.data, [di]))))
                        bs = builder.load(builder.gep(ba.data, [di]))
                        if g == 32:
                            bs = builder.fadd(bs, builder.load(builder.gep(ba.data, [add(di, c64(1))])))
                        bss.append(bs)
                        # the weights carry +128: start from -128 * (sum of the block's activation
                        # quants) so the int32 sums come out as the exact dot (bs is an exact integer)
                        init = splat_i32(builder.mul(builder.fptosi(bs, I32), ir.Constant(I32, -128)))
                        for p in iacc[tt]:
                            builder.store(init, p)
                    qb = add(q_base, mul(b, mul(c64(g), NC)))
                    xb = mul(b, c64(g))
                    # the block's groups of 4 columns (LLVM unrolls it: nothing to hoist here)
                    with cgutils.for_range(builder, c64(g // 4)) as jl:
                        j4 = jl.index
                        qj = add(qb, mul(j4, mul(NC, c64(4))))
                        w = []
                        for v in range(VC_VNNI):
                            p = builder.bitcast(builder.gep(qa.data, [add(qj, c64(v * 64))]), VB.as_pointer())
                            w.append(builder.load(p, align=1))
                        for tt in range(TT):
                            xi = add(mul(add(t0_, c64(tt)), K), add(xb, mul(j4, c64(4))))
                            x4 = builder.load(builder.bitcast(builder.gep(xa.data, [xi]), I32.as_pointer()), align=1)
                            xs = builder.bitcast(splat_i32(x4), VB)
                            for v in range(VC_VNNI):
                                # u8 weights (2nd operand) times s8 activations (3rd), 4 at a time
                                builder.store(builder.call(dp_fn, [builder.load(iacc[tt][v]), w[v], xs]), iacc[tt][v])
                    sb = add(s_base, mul(b, NC))
                    for tt in range(TT):
                        dx = dxs[tt]
                        nbs = splat(builder, builder.fneg(bss[tt]))
                        for v in range(VC_VNNI):
                            c = builder.sitofp(builder.load(iacc[tt][v]), VF)  # exact: |c| < 2**24
                            off = add(sb, c64(v * 16))
                            sv = load_scales(sa, off)
                            # the same operations, in the same order, as dot_rows
                            a = fma(c, builder.fmul(sv, dx), builder.load(acc[tt][v]))
                            if mins:
                                a = fma(builder.fmul(load_scales(ma, off), dx), nbs, a)
                            builder.store(a, acc[tt][v])

            is32 = builder.icmp_signed("==", G4, c64(8))
            with builder.if_else(is32) as (then, otherwise):
                for blk, g in ((then, 32), (otherwise, 16)):
                    with blk:
                        with builder.if_else(hm) as (with_min, without):
                            with with_min:
                                block_loop(g, True)
                            with without:
                                block_loop(g, False)
            for tt in range(TT):
                for v in range(VC_VNNI):
                    ai = add(mul(c64(tt), aa.shape[1]), add(r0_, c64(v * 16)))
                    p = builder.bitcast(builder.gep(aa.data, [ai]), VF.as_pointer())
                    builder.store(builder.load(acc[tt][v]), p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dot_rows_vnni


def _make_dot(TT: int):
    # One intrinsic for both weight layouts: the float kernel's typer or the VNNI kernel's accepts
    # the arguments (each returns None for the other layout), so one matmul serves both.
    flt, vnni = _make_dot_rows(TT), _make_dot_rows_vnni(TT)

    @intrinsic
    def dot(typingctx, q, tile, r0, s, m, has_min, xq, t0, dxb, bsum, a):
        args = (q, tile, r0, s, m, has_min, xq, t0, dxb, bsum, a)
        return flt(typingctx, *args) or vnni(typingctx, *args)

    return dot


dot_rows_1 = _make_dot(1)  # decode: one token (memory-bound either way)
dot_rows_4 = _make_dot(4)  # batches: four tokens share each loaded weight vector


@njit(cache=True)
def quantize_row(mode, x, xq, dxb, bsum):
    # x: (K,) f32 C-contiguous; mode: ACT_Q8_0 or ACT_Q8_K
    # xq: (K,) f32 or int8 (for the VNNI kernel), the integer quants llama.cpp forms for its dot
    #   products (all in [-127, 127])
    # dxb: (K//16,) f32, the scale of each 16-element sub-block; bsum: (K//16,) f32, its sum of quants
    # matmul.round_activations(mode, x) == xq * dxb (repeated over each sub-block), exactly.
    # No fastmath: the scale's division and the rounding must be exactly llama.cpp's.
    K = x.shape[0]
    bits = x.view(np.uint32)
    bs = 32 if mode == ACT_Q8_0 else 256
    for b0 in range(0, K, bs):
        # max |x| as the max of the magnitude bits: an integer reduction, which vectorizes
        m = np.uint32(0)
        for k in range(b0, b0 + bs):
            m = max(m, bits[k] & np.uint32(0x7FFFFFFF))
        d = np.float32(0.0)
        if m == 0:
            for k in range(b0, b0 + bs):
                xq[k] = 0.0
        elif mode == ACT_Q8_0:
            amax = abs(x[b0])
            for k in range(b0, b0 + bs):  # the value with those bits (x itself, so no bitcast needed)
                if bits[k] & np.uint32(0x7FFFFFFF) == m:
                    amax = abs(x[k])
                    break
            # scale stored as f16, quants from the unrounded inverse
            d = f16_round(amax / np.float32(127.0))
            iscale = np.float32(127.0) / amax
            for k in range(b0, b0 + bs):
                xq[k] = np.float32(np.rint(x[k] * iscale))
        else:
            vmax = x[b0]
            for k in range(b0, b0 + bs):  # the first element of largest magnitude, with its sign
                if bits[k] & np.uint32(0x7FFFFFFF) == m:
                    vmax = x[k]
                    break
            # Q8_K: the signed maximum maps to -127, float32 scale
            iscale = np.float32(-127.0) / vmax
            d = np.float32(1.0) / iscale
            for k in range(b0, b0 + bs):
                xq[k] = min(np.float32(127.0), np.float32(np.rint(iscale * x[k])))
        for j in range(b0 // 16, (b0 + bs) // 16):
            dxb[j] = d
            acc = np.float32(0.0)
            for k in range(16 * j, 16 * j + 16):
                acc += np.float32(xq[k])
            bsum[j] = acc


@njit(cache=True, parallel=True)
def quantize_rows(mode, x, xq, dxb, bsum):
    # quantize_row for every row: x (T, K) f32; xq (T, K) f32 or int8; dxb, bsum (T, K//16) f32
    T = x.shape[0]
    if T >= PAR_QUANT_MIN:
        for t in prange(T):
            quantize_row(mode, x[t], xq[t], dxb[t], bsum[t])
    else:  # a parallel region costs more than quantizing a few rows
        for t in range(T):
            quantize_row(mode, x[t], xq[t], dxb[t], bsum[t])


@njit(cache=True, parallel=True)
def matmul_packed(mode, x, q, s, m, has_min, N, xq_buf, dxb_buf, bsum_buf, out, col0, acc):
    # out[:, col0:col0+N] = x @ W.T with x quantized by `mode` (ACT_Q8_0 or ACT_Q8_K, the weight
    # type's activation rounding)
    # x: (T, K) f32; q: (NT, nb, G, NC) int8, or in the VNNI layout (NT, nb, G//4, NC, 4) uint8 (q + 128);
    #   s: (NT, nb, NC) f32 or uint16 f16 bits, m: (NT or 1, nb, NC) like s: a PackedWeight of N <= NT*NC rows
    # xq_buf: (>= T*K,) f32 (int8 for the VNNI layout), dxb_buf, bsum_buf: (>= T*K/16,) f32 scratch for
    #   the quantized activations
    # out: (T, >= col0+N) f32; acc: (n_chunks, 4, NC) f32 scratch, one per parallel chunk
    NT, nc = q.shape[0], q.shape[3]
    T, K = x.shape
    xq = xq_buf[:T * K].reshape(T, K)
    dxb = dxb_buf[:T * K // 16].reshape(T, K // 16)
    bsum = bsum_buf[:T * K // 16].reshape(T, K // 16)
    quantize_rows(mode, x, xq, dxb, bsum)
    n_chunks = min(acc.shape[0], NT)
    for c in prange(n_chunks):
        a = acc[c]
        # tiles split evenly: the threads take equal runs of chunks, so equal chunks balance them
        for tile in range(c * NT // n_chunks, (c + 1) * NT // n_chunks):
            r0 = tile * nc
            nr = min(nc, N - r0)
            t = 0
            while t + 4 <= T:  # four tokens per pass: each weight vector converted once, used four times
                for v in range(0, nc, ROWS):
                    dot_rows_4(q, tile, v, s, m, has_min, xq, t, dxb, bsum, a)
                for i in range(4):
                    for r in range(nr):
                        out[t + i, col0 + r0 + r] = a[i, r]
                t += 4
            while t < T:
                for v in range(0, nc, ROWS):
                    dot_rows_1(q, tile, v, s, m, has_min, xq, t, dxb, bsum, a)
                for r in range(nr):
                    out[t, col0 + r0 + r] = a[0, r]
                t += 1
