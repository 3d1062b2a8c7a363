"""Causal (optionally sliding-window or chunked) grouped-query attention over a paged KV cache (written by
kv_write.py), or an encoder's non-causal attention (every key of the query's sequence, optionally
within a symmetric window).

The cache is a pool of fixed-size blocks; each sequence's block table says which block holds
its positions b*bs .. b*bs+bs-1, and the kernel reads keys and values through it in place (no
gather into a contiguous copy).  Keys and values are kept as llama.cpp keeps them for the same
cache types (kv_pool.py): f16 bits (uint16) or q8_0 blocks (uint8), each read here in the way
llama.cpp computes with it:
- f16 K: Q rounded to f16, q·k in float32 summed in the order of llama.cpp's own product: its
  f16 vec_dot for a token alone in its batch (decode), llamafile's tinyBLAS for a prompt's tokens
  (_make_qk): on x86 the scores are llama.cpp's bit for bit (checked against its AVX-512 build;
  its ARM builds sum f16 in f16);
- q8_0 K: Q quantized to q8_0 as llama.cpp quantizes activations, and q·k per block as the
  integer dot of the quants times both scales (llama.cpp's q8_0 x q8_0 vec_dot);
- f16 V: the softmax weights rounded to f16 before the weighted sum (llama.cpp multiplies f16 V
  by f16 weights without flash attention, which a quantized V cannot use);
- q8_0 V: each row dequantized and summed with float32 weights (its flash-attention path, the
  one llama.cpp runs a quantized V cache through).
The readers dispatch on the rows' dtype at compile time (numba overloads).  For f16, the two
inner loops are explicit LLVM vector code (numba intrinsics), which widen f16 to float32 on the
fly (vcvtph2ps on x86, see target.py), for up to HEADS query heads of one KV head at a time
(grouped-query attention: each key and value vector is loaded and widened once for all of them):
- q·k for a run of keys: one horizontal sum per key and head;
- the weighted sum of a run of value rows: the sums stay in registers across the rows (a loop
  in numba would load and store them for every row).
The value dimensions past the last whole vector take a plain loop.
The intrinsics live in this module with the kernel that inlines them: numba's on-disk cache of
a function is keyed on its own file only.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from infer.quant.halves import F16_TO_F32

from .elementwise import fwht, round_f16
from .kv_pool import Q8_0_BLOCK as Q8
from .kv_pool import Q8_0_BYTES as Q8_BYTES
from .target import CHUNKS_PER_THREAD, VECTOR_WIDTH, half_to_float, halving_sum, splat
from .vexp import fma32, softmax_exp

W = VECTOR_WIDTH  # float32 lanes per vector
_VF = ir.VectorType(ir.FloatType(), W)
_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _check(*arrs):
    return all(isinstance(a, types.Array) and a.dtype == dt and a.ndim == nd and a.layout == "C" for a, dt, nd in arrs)


def _load_f16(builder, data, off):
    # W f16 values (uint16 bits) at element off of data, widened to float32
    p = builder.bitcast(builder.gep(data, [off]), ir.VectorType(ir.IntType(16), W).as_pointer())
    return half_to_float(builder, builder.load(p, align=2))


def _load_f16_1(builder, data, off):
    # the f16 value (uint16 bits) at element off of data, widened to float32
    bits = builder.insert_element(ir.Constant(ir.VectorType(ir.IntType(16), 1), ir.Undefined),
                                  builder.load(builder.gep(data, [off])), ir.Constant(_I32, 0))
    return builder.extract_element(half_to_float(builder, bits), ir.Constant(_I32, 0))


def _fma(builder):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), f"llvm.fma.v{W}f32")
    return lambda a, b, c: builder.call(fn, [a, b, c])


HEADS = 4  # most query heads one call of the f16 kernels serves (their sums all in registers)


def _hsum(builder, v, pairwise: bool):
    """The lanes of a float vector summed as ggml's x86 reductions add them: halving (lane i plus
    lane i + n/2 until one is left: _mm512_reduce_add_ps, and tinyBLAS's 8-lane hsum), or, for
    ggml's 8-lane GGML_F32x8_REDUCE (pairwise), the halves added and then two _mm_hadd_ps
    (neighbours: (t0 + t1) + (t2 + t3))."""
    n = v.type.count
    undef = ir.Constant(v.type, ir.Undefined)
    if pairwise and n == 8:
        lo = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7]))
        t = builder.fadd(lo, hi)
        e = lambda i: builder.extract_element(t, ir.Constant(_I32, i))
        return builder.fadd(builder.fadd(e(0), e(1)), builder.fadd(e(2), e(3)))
    return halving_sum(builder, v)


def _make_qk(NH: int, NK: int, single: bool):
    """The intrinsic qk_rows(q, qo, qstride, k, kh, lo, n, s, so, sstride):
    s[so + g*sstride + j] = q[qo + g*qstride : +D] · k[lo+j, kh, :] for g < NH, j < n.
    q: 1-D f32; k: (S, Hkv, D) uint16 f16 bits (D % W == 0 unless single); s: 1-D f32.
    NK keys at a time: each key vector is loaded and widened once for the NH query heads of its
    group (grouped-query attention), each query vector once for the NK keys.  Each (head, key) sum
    is formed alone, in the order of the product llama.cpp's CPU backend runs (each sum the same
    whatever NH, NK and the keys around it):
    - single (a query token alone in its batch: decode): ggml_vec_dot_f16, four chains of
      W-lane FMAs (vector u into chain u % 4), added (0 + 2, 1 + 3, then those) and reduced
      (_hsum); the elements past the last whole four vectors are added one by one in float64;
    - else (a prompt's tokens: ggml hands products of two or more tokens to llamafile's
      tinyBLAS, which takes head sizes that are a multiple of W): one chain of W-lane FMAs,
      reduced by halving."""
    chains = 4 if single else 1

    @intrinsic
    def qk_rows(typingctx, q, qo, qstride, k, kh, lo, n, s, so, sstride):
        if not _check((q, types.float32, 1), (k, types.uint16, 3), (s, types.float32, 1)):
            return None
        sig = types.void(q, qo, qstride, k, kh, lo, n, s, so, sstride)

        def codegen(context, builder, signature, args):
            st = signature.args
            qa, ka, sa = (context.make_array(st[i])(context, builder, args[i]) for i in (0, 3, 7))
            qo_, qs_, kh_, lo_, n_, so_, ss_ = (context.cast(builder, args[i], st[i], types.int64)
                                                for i in (1, 2, 4, 5, 6, 8, 9))
            H, D = cgutils.unpack_tuple(builder, ka.shape, 3)[1:]
            fma = _fma(builder)
            i64 = lambda v: ir.Constant(_I64, v)
            nstep = builder.udiv(D, i64(chains * W))  # whole steps of `chains` vectors
            qbase = [builder.add(qo_, builder.mul(qs_, i64(g))) for g in range(NH)]
            sbase = [builder.add(so_, builder.mul(ss_, i64(g))) for g in range(NH)]

            def keys(j0, nk):  # s[.. + j0 + c] for c < nk
                rows = [builder.add(builder.mul(builder.add(lo_, builder.add(j0, i64(c))), builder.mul(H, D)),
                                    builder.mul(kh_, D)) for c in range(nk)]
                acc = [[[cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * W)) for _ in range(chains)]
                        for _ in range(NH)] for _ in range(nk)]

                def q_at(g, u):
                    qp = builder.bitcast(builder.gep(qa.data, [builder.add(qbase[g], u)]), _VF.as_pointer())
                    return builder.load(qp, align=4)

                with cgutils.for_range(builder, nstep) as vl:
                    for h in range(chains):  # chain h of every (key, head): += q[u:u+W] * k[row+u:row+u+W]
                        u = builder.add(builder.mul(vl.index, i64(chains * W)), i64(h * W))
                        kvs = [_load_f16(builder, ka.data, builder.add(rows[c], u)) for c in range(nk)]
                        for g in range(NH):
                            qv = q_at(g, u)
                            for c in range(nk):
                                builder.store(fma(qv, kvs[c], builder.load(acc[c][g][h])), acc[c][g][h])
                tail = builder.mul(nstep, i64(chains * W))
                for c in range(nk):
                    for g in range(NH):
                        v = [builder.load(a) for a in acc[c][g]]
                        if chains == 4:
                            v = builder.fadd(builder.fadd(v[0], v[2]), builder.fadd(v[1], v[3]))
                        else:
                            v = v[0]
                        sp = builder.gep(sa.data, [builder.add(sbase[g], builder.add(j0, i64(c)))])
                        total = _hsum(builder, v, pairwise=chains == 4)
                        builder.store(total, sp)
                        if chains == 4:  # ggml's leftovers: float products added in float64
                            dsum = cgutils.alloca_once_value(builder, builder.fpext(total, ir.DoubleType()))
                            with cgutils.for_range(builder, builder.sub(D, tail)) as tl:
                                e = builder.add(tail, tl.index)
                                qe = builder.load(builder.gep(qa.data, [builder.add(qbase[g], e)]))
                                ke = _load_f16_1(builder, ka.data, builder.add(rows[c], e))
                                prod = builder.fpext(builder.fmul(qe, ke), ir.DoubleType())
                                builder.store(builder.fadd(builder.load(dsum), prod), dsum)
                            builder.store(builder.fptrunc(builder.load(dsum), ir.FloatType()), sp)

            nb = builder.udiv(n_, i64(NK))
            with cgutils.for_range(builder, nb) as loop:
                keys(builder.mul(loop.index, i64(NK)), NK)
            with cgutils.for_range(builder, builder.sub(n_, builder.mul(nb, i64(NK)))) as loop:
                keys(builder.add(builder.mul(nb, i64(NK)), loop.index), 1)
            return context.get_dummy_value()

        return sig, codegen

    return qk_rows


def _make_weighted(NH: int, NV: int):
    """The intrinsic weighted_rows(v, kh, lo, n, i0, s, so, sstride, out, o0, ostride): for g < NH,
    out[o0 + g*ostride + i0 : +NV*W] += sum over j < n of s[so + g*sstride + j] * v[lo+j, kh, i0 : +NV*W].
    v: (S, Hkv, Dv) uint16 f16 bits; s, out: 1-D f32.  Each value vector is loaded and widened once
    for the NH heads.  Every output element sums alike whatever NH and NV: two chains, even keys
    into one (which starts from out), odd keys into the other (two FMA chains in flight, not one),
    added at the end; a call starts from what out holds, so a run of keys split into calls (the
    cache's blocks) sums in an order fixed by where the splits fall."""

    @intrinsic
    def weighted_rows(typingctx, v, kh, lo, n, i0, s, so, sstride, out, o0, ostride):
        if not _check((v, types.uint16, 3), (s, types.float32, 1), (out, types.float32, 1)):
            return None
        sig = types.void(v, kh, lo, n, i0, s, so, sstride, out, o0, ostride)

        def codegen(context, builder, signature, args):
            st = signature.args
            va, sa, oa = (context.make_array(st[i])(context, builder, args[i]) for i in (0, 5, 8))
            kh_, lo_, n_, i0_, so_, ss_, o0_, os_ = (context.cast(builder, args[i], st[i], types.int64)
                                                      for i in (1, 2, 3, 4, 6, 7, 9, 10))
            H, Dv = cgutils.unpack_tuple(builder, va.shape, 3)[1:]
            fma = _fma(builder)
            i64 = lambda x: ir.Constant(_I64, x)
            outp = [[builder.bitcast(builder.gep(oa.data, [builder.add(builder.add(o0_, builder.mul(os_, i64(g))),
                                                                        builder.add(i0_, i64(u * W)))]), _VF.as_pointer())
                     for u in range(NV)] for g in range(NH)]
            sbase = [builder.add(so_, builder.mul(ss_, i64(g))) for g in range(NH)]
            accs = [[[cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * W)) for _ in range(NV)]
                     for _ in range(NH)] for _ in range(2)]
            for g in range(NH):
                for u in range(NV):
                    builder.store(builder.load(outp[g][u], align=4), accs[0][g][u])
            base = builder.add(builder.mul(kh_, Dv), i0_)

            def add_key(j, acc):
                row = builder.add(builder.mul(builder.add(lo_, j), builder.mul(H, Dv)), base)
                vvs = [_load_f16(builder, va.data, builder.add(row, i64(u * W))) for u in range(NV)]
                for g in range(NH):
                    ws = splat(builder, builder.load(builder.gep(sa.data, [builder.add(sbase[g], j)])))
                    for u in range(NV):
                        builder.store(fma(vvs[u], ws, builder.load(acc[g][u])), acc[g][u])

            n2 = builder.udiv(n_, i64(2))
            with cgutils.for_range(builder, n2) as loop:
                j = builder.mul(loop.index, i64(2))
                add_key(j, accs[0])
                add_key(builder.add(j, i64(1)), accs[1])
            with builder.if_then(builder.icmp_unsigned("!=", builder.mul(n2, i64(2)), n_)):
                add_key(builder.sub(n_, i64(1)), accs[0])
            for g in range(NH):
                for u in range(NV):
                    builder.store(builder.fadd(builder.load(accs[0][g][u]), builder.load(accs[1][g][u])),
                                  outp[g][u], align=4)
            return context.get_dummy_value()

        return sig, codegen

    return weighted_rows


# value vectors per weighted call for 1..HEADS heads: two sums in registers for each of them and
# each head, at most half the vector registers (16 of AVX-512's 32; 8 of AVX2's 16 and of NEON's 16
# pairs), the loads shared as widely as that allows
_NV = (4, 4, 2, 2) if W == 16 else (4, 2, 1, 1)
_WV1, _WV2, _WV3, _WV4 = (_make_weighted(h, _NV[h - 1]) for h in range(1, HEADS + 1))
_WV1v, _WV2v, _WV3v, _WV4v = (_make_weighted(h, 1) for h in range(1, HEADS + 1))
# keys per qk call for 1..HEADS heads, by the same register budget: a prompt's tokens keep one sum
# per (key, head), a decode token four (ggml_vec_dot_f16's chains)
_NK = (8, 4, 2, 2) if W == 16 else (4, 2, 1, 1)
_NK1 = (4, 2, 1, 1) if W == 16 else (2, 1, 1, 1)
_QK1, _QK2, _QK3, _QK4 = (_make_qk(h, _NK[h - 1], False) for h in range(1, HEADS + 1))
_QK1s, _QK2s, _QK3s, _QK4s = (_make_qk(h, _NK1[h - 1], True) for h in range(1, HEADS + 1))


@njit(cache=True, inline="always")
def _qk_f16(q, qo, D, k, kh, r0, m, s, so, ss, ng, single):
    # _make_qk's product for ng heads (q rows D apart), HEADS at a time; single: the query token is
    # alone in its batch (decode), as llama.cpp's order of sums depends on it
    g = 0
    while g < ng:
        nh = min(HEADS, ng - g)
        qg, sg = qo + g * D, so + g * ss
        if single:
            if nh == 4:
                _QK4s(q, qg, D, k, kh, r0, m, s, sg, ss)
            elif nh == 3:
                _QK3s(q, qg, D, k, kh, r0, m, s, sg, ss)
            elif nh == 2:
                _QK2s(q, qg, D, k, kh, r0, m, s, sg, ss)
            else:
                _QK1s(q, qg, D, k, kh, r0, m, s, sg, ss)
        elif nh == 4:
            _QK4(q, qg, D, k, kh, r0, m, s, sg, ss)
        elif nh == 3:
            _QK3(q, qg, D, k, kh, r0, m, s, sg, ss)
        elif nh == 2:
            _QK2(q, qg, D, k, kh, r0, m, s, sg, ss)
        else:
            _QK1(q, qg, D, k, kh, r0, m, s, sg, ss)
        g += nh


@njit(cache=True, inline="always")
def _weighted_f16(v, kh, r0, m, s, so, ss, out, o0, Dv, ng, nvec):
    # _make_weighted's sum for ng heads (outputs Dv apart) over the first nvec * W value dimensions
    g = 0
    while g < ng:
        nh = min(HEADS, ng - g)
        sg, og = so + g * ss, o0 + g * Dv
        span = _NV[nh - 1] * W
        i0 = 0
        while i0 + span <= nvec * W:
            if nh == 4:
                _WV4(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            elif nh == 3:
                _WV3(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            elif nh == 2:
                _WV2(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            else:
                _WV1(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            i0 += span
        while i0 < nvec * W:  # the vectors left, one at a time (the same sums)
            if nh == 4:
                _WV4v(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            elif nh == 3:
                _WV3v(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            elif nh == 2:
                _WV2v(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            else:
                _WV1v(v, kh, r0, m, i0, s, sg, ss, out, og, Dv)
            i0 += W
        g += nh


@njit(cache=True)
def _f16_at(row, o):
    # the f16 scale stored little-endian at bytes o, o+1 of a q8_0 row, as float32
    return F16_TO_F32[np.uint16(row[o]) | (np.uint16(row[o + 1]) << np.uint16(8))]


def qk(q, qo, ng, qd, qdo, k, kh, r0, m, s, so, ss, single):
    """s[so + g*ss + j] = q[qo + g*D : +D] · K row r0+j of head kh, for g < ng (query heads of one
    KV head, D apart in q) and j < m. q: 1-D f32 (prepare_q); qd: 1-D f32, the q8_0 scale of
    q[qo + 32b:] at qd[qdo + 2b]; k: (S, Hkv, row) f16 bits or q8_0 blocks; s: 1-D f32; single:
    the query token is alone in its batch (the order of an f16 K's sums, _make_qk)."""


@overload(qk)
def _qk(q, qo, ng, qd, qdo, k, kh, r0, m, s, so, ss, single):
    if k.dtype == types.uint16:
        def f16(q, qo, ng, qd, qdo, k, kh, r0, m, s, so, ss, single):
            D = k.shape[2]
            # tinyBLAS refuses a head size that is not a multiple of its vector: ggml_vec_dot_f16 then
            _qk_f16(q, qo, D, k, kh, r0, m, s, so, ss, ng, single or D % W != 0)
        return f16

    def q8_0(q, qo, ng, qd, qdo, k, kh, r0, m, s, so, ss, single):
        ki = k.view(np.int8)
        D = k.shape[2] // Q8_BYTES * Q8
        for g in range(ng):
            qg, dg = qo + g * D, qdo + g * D // 16
            for j in range(m):
                row = k[r0 + j, kh]
                qrow = ki[r0 + j, kh]
                acc = np.float32(0.0)
                for b in range(k.shape[2] // Q8_BYTES):
                    o = b * Q8_BYTES
                    isum = np.float32(0.0)  # a sum of products of integers below 2**24: exact in any order
                    for i in range(Q8):
                        isum += q[qg + b * Q8 + i] * np.float32(qrow[o + 2 + i])
                    acc += _f16_at(row, o) * qd[dg + 2 * b] * isum
                s[so + g * ss + j] = acc
    return q8_0


def weigh_values(v, kh, r0, m, s, so, ss, out, o0, ng, Dv):
    """For g < ng: out[o0 + g*Dv : +Dv] += sum over j < m of s[so + g*ss + j] * the first Dv
    values of row r0+j of head kh (v: (S, Hkv, row) f16 bits or q8_0 blocks, a row of Dv or more:
    MLA's V is the leading latent of each K row; s, out: 1-D f32); each call adds to what out holds."""


@overload(weigh_values)
def _weigh_values(v, kh, r0, m, s, so, ss, out, o0, ng, Dv):
    if v.dtype == types.uint16:
        def f16(v, kh, r0, m, s, so, ss, out, o0, ng, Dv):
            nvec = Dv // W
            _weighted_f16(v, kh, r0, m, s, so, ss, out, o0, Dv, ng, nvec)
            for g in range(ng):
                for i in range(nvec * W, Dv):
                    acc = out[o0 + g * Dv + i]
                    for j in range(m):
                        acc = fma32(F16_TO_F32[v[r0 + j, kh, i]], s[so + g * ss + j], acc)
                    out[o0 + g * Dv + i] = acc
        return f16

    def q8_0(v, kh, r0, m, s, so, ss, out, o0, ng, Dv):
        vi = v.view(np.int8)
        for g in range(ng):
            for j in range(m):
                w = s[so + g * ss + j]
                row = v[r0 + j, kh]
                qrow = vi[r0 + j, kh]
                for b in range(Dv // Q8):
                    o = b * Q8_BYTES
                    d = _f16_at(row, o)
                    for i in range(Q8):  # llama.cpp dequantizes the row, then adds row * weight (an FMA)
                        k = o0 + g * Dv + b * Q8 + i
                        out[k] = fma32(d * np.float32(qrow[o + 2 + i]), w, out[k])
    return q8_0


def round_weights(s, v):
    """The softmax weights s as the product with the cache's V takes them: f16 V, rounded to f16."""


@overload(round_weights)
def _round_weights(s, v):
    if v.dtype == types.uint16:
        return lambda s, v: round_f16(s)
    return lambda s, v: None


@njit(cache=True, inline="always")
def _max(x):
    # the largest of x (n,) f32 (n >= 1): eight running maxima, not one chain of dependent compares
    # (a maximum is the same in any order)
    n = x.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = x[0]
    j = 0
    while j + 8 <= n:
        y = x[j:j + 8]
        m0, m1, m2, m3 = max(m0, y[0]), max(m1, y[1]), max(m2, y[2]), max(m3, y[3])
        m4, m5, m6, m7 = max(m4, y[4]), max(m5, y[5]), max(m6, y[6]), max(m7, y[7])
        j += 8
    for i in range(j, n):
        m0 = max(m0, x[i])
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(cache=True, inline="always")
def _softmax(sw, scale, softcap, sink, slope, q_pos, lo, v_pool):
    # One head's scores sw (n,) f32 -> its softmax weights in place, as ggml_soft_max_ext forms them:
    # scaled, plus ALiBi's slope * -|q_pos - p| for key p = lo + j (slope: (1,) or (0,), none),
    # soft-capped (softcap > 0), exp(x - max) by ggml's vector exp with the sum in float64;
    # sink: (1,) or (0,), a logit in the max and the sum without a value; then rounded as the
    # product with V takes them (round_weights).  Inlined into the parallel loop, whose flags it
    # takes: no fastmath (softmax_exp's sum has ggml's order)
    n = sw.shape[0]
    for j in range(n):
        sw[j] *= scale
    if slope.shape[0]:  # ggml: the scaled score plus slope times the mask's -|p_q - p_k|, in float32
        for j in range(n):
            sw[j] += slope[0] * np.float32(-abs(q_pos - (lo + j)))
    if softcap > 0:
        for j in range(n):
            sw[j] = softcap * np.float32(math.tanh(sw[j] / softcap))
    mx = _max(sw)
    if sink.shape[0]:
        mx = max(mx, sink[0])
    total = softmax_exp(sw, mx)  # ggml_vec_soft_max_f32: its vector exp, the sum in float64
    if sink.shape[0]:
        total += np.float64(np.float32(math.exp(sink[0] - mx)))
    inv = np.float32(1.0 / total)
    for j in range(n):
        sw[j] *= inv
    round_weights(sw, v_pool)


@njit(cache=True, parallel=True)  # no fastmath: numba would compile softmax_exp with it (vexp.py)
def attention(q, qd, k_pool, v_pool, tables, tok_seq, q_pos, prompt_end, seq_last, bs, window, chunked, scale, softcap,
              sinks, alibi, rot_v, out, scores):
    # q: (T, Hq, D) f32 and qd: (T, Hq*D // 16) f32 as kv_write.qkv_post left them (prepare_q); scale multiplies q·k
    # k_pool: (n_blocks*bs, Hkv, K row), v_pool: (n_blocks*bs, Hkv, V row): this layer's blocks (kv_pool.py);
    #   a V row may be wider than out's Dv, which is read from its front (MLA: v_pool is k_pool)
    # tables: (S, max_blocks) int32: block b of sequence s holds its positions b*bs .. b*bs+bs-1
    # tok_seq: (T,) int32 row of tables for each query; q_pos: (T,) int32 its position;
    #   keys 0..q_pos[t] of that sequence are visible (causal)
    # prompt_end: (S,) int32 per row of tables: a query at or past it is a generated token, whose
    #   f16 q·k sums in the order llama.cpp gives a token alone in its batch (Batch.prompt_end)
    # seq_last: (0,): causal; or (S,) int32 per row of tables, the last position of its sequence
    #   written by this step: non-causal (an encoder, llama.cpp's causal_attn false), keys
    #   0..seq_last of the sequence are visible, and a window is symmetric (below)
    # window: 0 or the sliding window (key p visible iff q_pos - p < window); chunked: the window is a
    #   chunk instead (llama4: key p visible iff p >= q_pos // window * window, its chunk's start);
    #   non-causal: key p visible iff |q_pos - p| <= window // 2 (LLAMA_SWA_TYPE_SYMMETRIC)
    # sinks: (Hq,) f32 or (0,): a logit per head that joins the softmax without a value (gpt-oss;
    #   ggml_soft_max_ext's sinks: in the max and, as exp(sink - max), in the sum)
    # alibi: (Hq,) f32 or (0,): ALiBi's slope per head (jina-bert-v2), each score plus slope * -|q_pos - p|
    #   after the scale (ggml_soft_max_ext's max_bias; llama.cpp's mask holds -|p_q - p_k|)
    # rot_v: 0 or the size of the rotation V was stored with (kv_write.qkv_post), undone on each output head
    # out: (T, Hq, Dv) f32; scores: (n_chunks, >= Hq/Hkv * longest sequence) f32 scratch, a row per
    #   parallel chunk (the workspace has CHUNKS_PER_THREAD per thread)
    # A work item is one query token and up to Hq/Hkv query heads of one KV head: the heads share
    # each load of a key and a value (grouped-query attention).  Every head's numbers are formed
    # alone, so how many heads an item takes changes no result.
    T, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    Dv = out.shape[2]
    group = Hq // Hkv
    # heads per item: the whole group, split while there are fewer items than threads (decode: one
    # token, few KV heads; scores has CHUNKS_PER_THREAD rows per thread)
    per = group
    while per > 1 and CHUNKS_PER_THREAD * T * Hkv * (-(-group // per)) < scores.shape[0]:
        per = -(-per // 2)
    nsplit = -(-group // per)
    n_work = T * Hkv * nsplit
    n_chunks = min(scores.shape[0], n_work)
    ss = scores.shape[1] // per  # the stride of one head's scores in a chunk's row
    causal = seq_last.shape[0] == 0
    if T and (q_pos.max() >= ss or (not causal and seq_last.max() >= ss)):
        raise ValueError("attention: the scores scratch is too short for these positions")
    qflat = q.reshape(T * Hq * D)
    oflat = out.reshape(T * Hq * Dv)
    for c in prange(n_chunks):
        s = scores[c]
        # work items dealt round-robin: later queries see more keys, so contiguous runs would not balance
        for w in range(c, n_work, n_chunks):
            t = w // (Hkv * nsplit)
            kh = w % (Hkv * nsplit) // nsplit
            h0 = kh * group + w % nsplit * per
            ng = min(per, (kh + 1) * group - h0)
            table = tables[tok_seq[t]]
            hi = q_pos[t]
            single = hi >= prompt_end[tok_seq[t]]
            lo = 0
            if not causal:
                if window > 0:
                    lo = max(0, hi - window // 2)
                    hi = min(seq_last[tok_seq[t]], hi + window // 2)
                else:
                    hi = seq_last[tok_seq[t]]
            elif window > 0 and chunked:
                lo = hi // window * window
            elif window > 0 and hi - window + 1 > 0:
                lo = hi - window + 1
            n = hi + 1 - lo
            for b in range(lo // bs, hi // bs + 1):
                p0 = max(lo, b * bs)
                m = min(hi, b * bs + bs - 1) + 1 - p0
                r0 = table[b] * bs + p0 - b * bs  # pool row of position p0
                qk(qflat, (t * Hq + h0) * D, ng, qd[t], h0 * D // 16, k_pool, kh, r0, m, s, p0 - lo, ss, single)
            for g in range(ng):
                _softmax(s[g * ss:g * ss + n], scale, softcap, sinks[h0 + g:h0 + g + 1], alibi[h0 + g:h0 + g + 1],
                         q_pos[t], lo, v_pool)
            o0 = (t * Hq + h0) * Dv
            oflat[o0:o0 + ng * Dv] = 0.0
            for b in range(lo // bs, hi // bs + 1):
                p0 = max(lo, b * bs)
                m = min(hi, b * bs + bs - 1) + 1 - p0
                r0 = table[b] * bs + p0 - b * bs
                weigh_values(v_pool, kh, r0, m, s, p0 - lo, ss, oflat, o0, ng, Dv)
            if rot_v > 0:
                for g in range(ng):
                    fwht(out[t, h0 + g], rot_v)
