"""Causal (optionally sliding-window) grouped-query attention over a paged f16 KV cache.

The cache is a pool of fixed-size blocks; each sequence's block table says which block holds
its positions b*bs .. b*bs+bs-1, and the kernel reads keys and values through it in place (no
gather into a contiguous copy).  Keys and values are f16 bits (uint16), as llama.cpp keeps
them: half the memory and half the bytes a decode step reads.  The two inner loops are explicit LLVM vector code
(numba intrinsics), which widen f16 to float32 on the fly (vcvtph2ps on x86, see target.py):
- q·k for a run of keys: the query stays in registers, one horizontal sum per key;
- the weighted sum of a run of value rows: the sums stay in registers across the rows (a loop
  in numba would load and store them for every row).
Head sizes that are not a multiple of the vector width take plain loops (same results).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from infer.quant.kquants import F16_TO_F32

from .ops import round_f16
from .target import VECTOR_WIDTH, half_to_float, splat


W = VECTOR_WIDTH  # float32 lanes per vector
VSPAN = 4 * W  # value dimensions one _weighted_rows call covers
_VF = ir.VectorType(ir.FloatType(), W)
_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _check(*arrs):
    return all(isinstance(a, types.Array) and a.dtype == dt and a.ndim == nd and a.layout == "C" for a, dt, nd in arrs)


def _load_f16(builder, data, off):
    # W f16 values (uint16 bits) at element off of data, widened to float32
    p = builder.bitcast(builder.gep(data, [off]), ir.VectorType(ir.IntType(16), W).as_pointer())
    return half_to_float(builder, builder.load(p, align=2))


def _fma(builder):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), f"llvm.fma.v{W}f32")
    return lambda a, b, c: builder.call(fn, [a, b, c])


@intrinsic
def _qk_rows(typingctx, q, qo, k, kh, lo, n, s):
    # s[j] = q[qo:qo+D] · k[lo+j, kh, :] for j < n; q: 1-D f32; k: (S, Hkv, D) uint16 f16 bits, D % W == 0
    if not _check((q, types.float32, 1), (k, types.uint16, 3), (s, types.float32, 1)):
        return None
    sig = types.void(q, qo, k, kh, lo, n, s)

    def codegen(context, builder, signature, args):
        st = signature.args
        qa, ka, sa = (context.make_array(st[i])(context, builder, args[i]) for i in (0, 2, 6))
        qo_, kh_, lo_, n_ = (context.cast(builder, args[i], st[i], types.int64) for i in (1, 3, 4, 5))
        H, D = cgutils.unpack_tuple(builder, ka.shape, 3)[1:]
        fma = _fma(builder)
        npair = builder.udiv(D, ir.Constant(_I64, 2 * W))
        acc = [cgutils.alloca_once(builder, _VF) for _ in range(2)]

        def step(a, u, row):  # a += q[u:u+W] * k[row+u:row+u+W]
            qp = builder.bitcast(builder.gep(qa.data, [builder.add(qo_, u)]), _VF.as_pointer())
            kv = _load_f16(builder, ka.data, builder.add(row, u))
            builder.store(fma(builder.load(qp, align=4), kv, builder.load(a)), a)

        with cgutils.for_range(builder, n_) as loop:
            j = loop.index
            row = builder.add(builder.mul(builder.add(lo_, j), builder.mul(H, D)), builder.mul(kh_, D))
            for a in acc:
                builder.store(ir.Constant(_VF, [0.0] * W), a)
            with cgutils.for_range(builder, npair) as vl:  # two sums in flight
                u = builder.mul(vl.index, ir.Constant(_I64, 2 * W))
                step(acc[0], u, row)
                step(acc[1], builder.add(u, ir.Constant(_I64, W)), row)
            odd = builder.icmp_unsigned("!=", builder.mul(npair, ir.Constant(_I64, 2 * W)), D)
            with builder.if_then(odd):  # D = (2 * npair + 1) * W
                step(acc[0], builder.mul(npair, ir.Constant(_I64, 2 * W)), row)
            v = builder.fadd(builder.load(acc[0]), builder.load(acc[1]))
            width = W
            while width > 1:  # horizontal sum: halve the vector until one lane is left
                width //= 2
                lanes = [width + i if i < width else i for i in range(W)]
                hi = builder.shuffle_vector(v, ir.Constant(_VF, ir.Undefined), ir.Constant(ir.VectorType(_I32, W), lanes))
                v = builder.fadd(v, hi)
            builder.store(builder.extract_element(v, ir.Constant(_I32, 0)), builder.gep(sa.data, [j]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _weighted_rows(typingctx, v, kh, lo, n, i0, s, out, o0, accumulate):
    # out[o0:o0+VSPAN] (+)= sum over j < n of s[j] * v[lo+j, kh, i0:i0+VSPAN], added to what out
    # holds if accumulate: the sums carry on from one block to the next exactly as in one run
    # v: (S, Hkv, Dv) uint16 f16 bits; s: (>= n,) f32; out: 1-D f32
    if not _check((v, types.uint16, 3), (s, types.float32, 1), (out, types.float32, 1)):
        return None
    sig = types.void(v, kh, lo, n, i0, s, out, o0, accumulate)

    def codegen(context, builder, signature, args):
        st = signature.args
        va, sa, oa = (context.make_array(st[i])(context, builder, args[i]) for i in (0, 5, 6))
        kh_, lo_, n_, i0_, o0_ = (context.cast(builder, args[i], st[i], types.int64) for i in (1, 2, 3, 4, 7))
        acc_in = context.cast(builder, args[8], st[8], types.boolean)
        H, Dv = cgutils.unpack_tuple(builder, va.shape, 3)[1:]
        fma = _fma(builder)
        outp = [builder.bitcast(builder.gep(oa.data, [builder.add(o0_, ir.Constant(_I64, u * W))]), _VF.as_pointer())
                for u in range(4)]
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * W)) for _ in range(4)]
        with builder.if_then(acc_in):
            for u in range(4):
                builder.store(builder.load(outp[u], align=4), accs[u])
        base = builder.add(builder.mul(kh_, Dv), i0_)
        with cgutils.for_range(builder, n_) as loop:
            j = loop.index
            row = builder.add(builder.mul(builder.add(lo_, j), builder.mul(H, Dv)), base)
            ws = splat(builder, builder.load(builder.gep(sa.data, [j])))
            for u in range(4):
                vv = _load_f16(builder, va.data, builder.add(row, ir.Constant(_I64, u * W)))
                builder.store(fma(vv, ws, builder.load(accs[u])), accs[u])
        for u in range(4):
            builder.store(builder.load(accs[u]), outp[u], align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, fastmath=True, parallel=True)
def attention(q, k_pool, v_pool, tables, tok_seq, q_pos, bs, window, scale, softcap, out, scores):
    # q: (T, Hq, D) f32, rounded to f16 values like K and V; scale multiplies q·k
    # k_pool: (n_blocks*bs, Hkv, D), v_pool: (n_blocks*bs, Hkv, Dv) uint16 f16 bits, this layer's blocks
    # tables: (S, max_blocks) int32: block b of sequence s holds its positions b*bs .. b*bs+bs-1
    # tok_seq: (T,) int32 row of tables for each query; q_pos: (T,) int32 its position;
    #   keys 0..q_pos[t] of that sequence are visible (causal)
    # window: 0 or the sliding window (key p visible iff q_pos - p < window)
    # out: (T, Hq, Dv) f32; scores: (n_chunks, >= longest sequence) f32 scratch, a row per parallel chunk
    T, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    Dv = v_pool.shape[2]
    group = Hq // Hkv
    n_work = T * Hq
    n_chunks = min(scores.shape[0], n_work)
    qflat = q.reshape(T * Hq * D)
    nv = Dv - Dv % VSPAN
    for c in prange(n_chunks):
        s = scores[c]
        # work items dealt round-robin: later queries see more keys, so contiguous runs would not balance
        for w in range(c, n_work, n_chunks):
            t = w // Hq
            h = w % Hq
            kh = h // group
            table = tables[tok_seq[t]]
            hi = q_pos[t]
            lo = 0
            if window > 0 and hi - window + 1 > 0:
                lo = hi - window + 1
            n = hi + 1 - lo
            sw = s[:n]  # sw[j]: key lo + j
            for b in range(lo // bs, hi // bs + 1):
                p0 = max(lo, b * bs)
                m = min(hi, b * bs + bs - 1) + 1 - p0
                r0 = table[b] * bs + p0 - b * bs  # pool row of position p0
                if D % W == 0:
                    _qk_rows(qflat, (t * Hq + h) * D, k_pool, kh, r0, m, s[p0 - lo:])
                else:
                    for j in range(m):
                        acc = np.float32(0.0)
                        for i in range(D):
                            acc += q[t, h, i] * F16_TO_F32[k_pool[r0 + j, kh, i]]
                        sw[p0 - lo + j] = acc
            mx = np.float32(-np.inf)
            for j in range(n):
                a = sw[j] * scale
                if softcap > 0:
                    a = softcap * np.float32(math.tanh(a / softcap))
                sw[j] = a
                mx = max(mx, a)
            total = np.float32(0.0)
            for j in range(n):
                e = np.float32(math.exp(sw[j] - mx))
                sw[j] = e
                total += e
            inv = np.float32(1.0) / total
            for j in range(n):
                sw[j] *= inv
            round_f16(sw)  # llama.cpp multiplies V (f16) by the weights rounded to f16
            o = out[t, h]
            for i in range(Dv):
                o[i] = 0.0
            for b in range(lo // bs, hi // bs + 1):
                p0 = max(lo, b * bs)
                m = min(hi, b * bs + bs - 1) + 1 - p0
                r0 = table[b] * bs + p0 - b * bs
                for i0 in range(0, nv, VSPAN):
                    _weighted_rows(v_pool, kh, r0, m, i0, s[p0 - lo:], o, i0, True)
                for i in range(nv, Dv):
                    acc = o[i]
                    for j in range(m):
                        acc += s[p0 - lo + j] * F16_TO_F32[v_pool[r0 + j, kh, i]]
                    o[i] = acc
