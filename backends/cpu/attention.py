"""Causal (optionally sliding-window) grouped-query attention over a paged KV cache, and the
step before it that writes the cache.

The cache is a pool of fixed-size blocks; each sequence's block table says which block holds
its positions b*bs .. b*bs+bs-1, and the kernel reads keys and values through it in place (no
gather into a contiguous copy).  Keys and values are kept as llama.cpp keeps them for the same
cache types (kv_pool.py): f16 bits (uint16) or q8_0 blocks (uint8), each read here in the way
llama.cpp computes with it:
- f16 K: Q rounded to f16, q·k in float32 (llama.cpp's f16 vec_dot);
- q8_0 K: Q quantized to q8_0 as llama.cpp quantizes activations, and q·k per block as the
  integer dot of the quants times both scales (llama.cpp's q8_0 x q8_0 vec_dot);
- f16 V: the softmax weights rounded to f16 before the weighted sum (llama.cpp multiplies f16 V
  by f16 weights without flash attention, which a quantized V cannot use);
- q8_0 V: each row dequantized and summed with float32 weights (its flash-attention path, the
  one llama.cpp runs a quantized V cache through).
The readers and writers dispatch on the rows' dtype at compile time (numba overloads).  For f16,
the two inner loops are explicit LLVM vector code (numba intrinsics), which widen f16 to float32
on the fly (vcvtph2ps on x86, see target.py):
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
from numba.extending import intrinsic, overload

from infer.quant.kquants import F16_TO_F32, f32_to_f16

from .activations import ACT_Q8_0, quantize_row
from .kv_pool import Q8_0_BLOCK as Q8, Q8_0_BYTES as Q8_BYTES
from .ops import fwht, heads_post, round_f16
from .target import VECTOR_WIDTH, half_to_float, splat
from .vexp import softmax_exp


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
    # Four keys at a time share each load of q and overlap their sums; each key's sum is formed
    # alone, in the same order whatever the keys around it.
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
        i64 = lambda v: ir.Constant(_I64, v)

        def qvec(u):
            qp = builder.bitcast(builder.gep(qa.data, [builder.add(qo_, u)]), _VF.as_pointer())
            return builder.load(qp, align=4)

        def keys(j0, nk):  # s[j0 + c] for c < nk
            rows = [builder.add(builder.mul(builder.add(lo_, builder.add(j0, i64(c))), builder.mul(H, D)), builder.mul(kh_, D))
                    for c in range(nk)]
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * W)) for _ in range(2)] for _ in range(nk)]

            def step(h, u):  # key c's sum h += q[u:u+W] * k[row+u:row+u+W]
                qv = qvec(u)
                for c in range(nk):
                    kv = _load_f16(builder, ka.data, builder.add(rows[c], u))
                    builder.store(fma(qv, kv, builder.load(acc[c][h])), acc[c][h])

            with cgutils.for_range(builder, npair) as vl:  # two sums in flight per key
                u = builder.mul(vl.index, i64(2 * W))
                step(0, u)
                step(1, builder.add(u, i64(W)))
            odd = builder.icmp_unsigned("!=", builder.mul(npair, i64(2 * W)), D)
            with builder.if_then(odd):  # D = (2 * npair + 1) * W
                step(0, builder.mul(npair, i64(2 * W)))
            for c in range(nk):
                v = builder.fadd(builder.load(acc[c][0]), builder.load(acc[c][1]))
                width = W
                while width > 1:  # horizontal sum: halve the vector until one lane is left
                    width //= 2
                    lanes = [width + i if i < width else i for i in range(W)]
                    hi = builder.shuffle_vector(v, ir.Constant(_VF, ir.Undefined), ir.Constant(ir.VectorType(_I32, W), lanes))
                    v = builder.fadd(v, hi)
                builder.store(builder.extract_element(v, ir.Constant(_I32, 0)), builder.gep(sa.data, [builder.add(j0, i64(c))]))

        n4 = builder.udiv(n_, i64(4))
        with cgutils.for_range(builder, n4) as loop:
            keys(builder.mul(loop.index, i64(4)), 4)
        with cgutils.for_range(builder, builder.sub(n_, builder.mul(n4, i64(4)))) as loop:
            keys(builder.add(builder.mul(n4, i64(4)), loop.index), 1)
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
        # two sums: even keys into one, odd keys into the other, added at the end (two FMA chains
        # in flight, not one: each FMA waits for the last otherwise)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * W)) for _ in range(4)] for _ in range(2)]
        with builder.if_then(acc_in):
            for u in range(4):
                builder.store(builder.load(outp[u], align=4), accs[0][u])
        base = builder.add(builder.mul(kh_, Dv), i0_)

        def add_key(j, acc):
            row = builder.add(builder.mul(builder.add(lo_, j), builder.mul(H, Dv)), base)
            ws = splat(builder, builder.load(builder.gep(sa.data, [j])))
            for u in range(4):
                vv = _load_f16(builder, va.data, builder.add(row, ir.Constant(_I64, u * W)))
                builder.store(fma(vv, ws, builder.load(acc[u])), acc[u])

        n2 = builder.udiv(n_, ir.Constant(_I64, 2))
        with cgutils.for_range(builder, n2) as loop:
            j = builder.mul(loop.index, ir.Constant(_I64, 2))
            add_key(j, accs[0])
            add_key(builder.add(j, ir.Constant(_I64, 1)), accs[1])
        with builder.if_then(builder.icmp_unsigned("!=", builder.mul(n2, ir.Constant(_I64, 2)), n_)):
            add_key(builder.sub(n_, ir.Constant(_I64, 1)), accs[0])
        for u in range(4):
            builder.store(builder.fadd(builder.load(accs[0][u]), builder.load(accs[1][u])), outp[u], align=4)
        return context.get_dummy_value()

    return sig, codegen


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
def _f16_at(row, o):
    # the f16 scale stored little-endian at bytes o, o+1 of a q8_0 row, as float32
    return F16_TO_F32[np.uint16(row[o]) | (np.uint16(row[o + 1]) << np.uint16(8))]


def qk(q, qo, qd, qdo, k, kh, r0, m, s):
    """s[j] = q[qo:qo+D] · K row r0+j of head kh, for j < m. q: 1-D f32 (prepare_q); qd: 1-D f32, the
    q8_0 scale of q[qo + 32b:] at qd[qdo + 2b]; k: (S, Hkv, row) f16 bits or q8_0 blocks."""


@overload(qk, jit_options={"fastmath": True})
def _qk(q, qo, qd, qdo, k, kh, r0, m, s):
    if k.dtype == types.uint16:
        def f16(q, qo, qd, qdo, k, kh, r0, m, s):
            D = k.shape[2]
            if D % W == 0:
                _qk_rows(q, qo, k, kh, r0, m, s)
                return
            for j in range(m):
                acc = np.float32(0.0)
                for i in range(D):
                    acc += q[qo + i] * F16_TO_F32[k[r0 + j, kh, i]]
                s[j] = acc
        return f16

    def q8_0(q, qo, qd, qdo, k, kh, r0, m, s):
        ki = k.view(np.int8)
        for j in range(m):
            row = k[r0 + j, kh]
            qrow = ki[r0 + j, kh]
            acc = np.float32(0.0)
            for b in range(k.shape[2] // Q8_BYTES):
                o = b * Q8_BYTES
                isum = np.float32(0.0)  # a sum of products of integers below 2**24: exact in any order
                for i in range(Q8):
                    isum += q[qo + b * Q8 + i] * np.float32(qrow[o + 2 + i])
                acc += _f16_at(row, o) * qd[qdo + 2 * b] * isum
            s[j] = acc
    return q8_0


def weigh_values(v, kh, r0, m, s, so, out):
    """out (Dv,) f32 += sum over j < m of s[so+j] * V row r0+j of head kh (v: (S, Hkv, row) f16 bits
    or q8_0 blocks); the sums carry on from one call to the next exactly as in one run."""


@overload(weigh_values, jit_options={"fastmath": True})
def _weigh_values(v, kh, r0, m, s, so, out):
    if v.dtype == types.uint16:
        def f16(v, kh, r0, m, s, so, out):
            Dv = v.shape[2]
            nv = Dv - Dv % VSPAN
            sj = s[so:]
            for i0 in range(0, nv, VSPAN):
                _weighted_rows(v, kh, r0, m, i0, sj, out, i0, True)
            for i in range(nv, Dv):
                acc = out[i]
                for j in range(m):
                    acc += sj[j] * F16_TO_F32[v[r0 + j, kh, i]]
                out[i] = acc
        return f16

    def q8_0(v, kh, r0, m, s, so, out):
        vi = v.view(np.int8)
        for j in range(m):
            w = s[so + j]
            row = v[r0 + j, kh]
            qrow = vi[r0 + j, kh]
            for b in range(v.shape[2] // Q8_BYTES):
                o = b * Q8_BYTES
                d = _f16_at(row, o)
                for i in range(Q8):  # llama.cpp dequantizes the row, then adds weight * row
                    out[b * Q8 + i] += w * (d * np.float32(qrow[o + 2 + i]))
    return q8_0


def round_weights(s, v):
    """The softmax weights s as the product with the cache's V takes them: f16 V, rounded to f16."""


@overload(round_weights)
def _round_weights(s, v):
    if v.dtype == types.uint16:
        return lambda s, v: round_f16(s)
    return lambda s, v: None


@njit(cache=True)
def qkv_post(qkv, bq, bk, bv, q_norm, k_norm, eps, cos_t, sin_t, neox, q_scale, q, qd, k_pool, v_pool, slots,
             kf, vf, dxb, bsum, rot_k, rot_v):
    # What follows the Q/K/V products, in one call: biases, Q/K norms, RoPE, the Q prescale,
    # the rotation of Q and K by rot_k and of V by rot_v (0: none; kv_pool.rotation), Q prepared for
    # the products with K (prepare_q) and K, V written to the cache (kv_store).
    # qkv: (T, Nq+Nk+Nv) f32, the three products side by side; bq, bk, bv: (N,) or (0,) biases
    # q_norm, k_norm: (hd,) per head, (H*hd,) / (Hkv*hd,) over the whole projection, or (0,) (heads_post)
    # cos_t, sin_t: (T, n_rot/2) f32 from rope_cache
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
        heads_post(row[:Nq], bq, q_norm, eps, cos_t[t], sin_t[t], True, neox, q_scale, q[t])
        heads_post(row[Nq:Nq + Nk], bk, k_norm, eps, cos_t[t], sin_t[t], True, neox, np.float32(1.0), kf)
        heads_post(row[Nq + Nk:Nq + Nk + Nv], bv, bv[:0], eps, cos_t[t], sin_t[t], False, neox, np.float32(1.0), vf)
        if rot_k > 0:
            fwht(q[t].reshape(Nq), rot_k)
            fwht(kb, rot_k)
        if rot_v > 0:
            fwht(vb, rot_v)
        prepare_q(q[t].reshape(Nq), qd[t], bsum, k_pool)
        kv_store(kb, dxb, bsum, k_pool[slots[t]].reshape(-1))
        kv_store(vb, dxb, bsum, v_pool[slots[t]].reshape(-1))


@njit(cache=True, parallel=True)  # no fastmath: numba would compile softmax_exp with it (vexp.py)
def attention(q, qd, k_pool, v_pool, tables, tok_seq, q_pos, bs, window, scale, softcap, sinks, rot_v, out, scores):
    # q: (T, Hq, D) f32 and qd: (T, Hq*D // 16) f32 as qkv_post left them (prepare_q); scale multiplies q·k
    # k_pool: (n_blocks*bs, Hkv, K row), v_pool: (n_blocks*bs, Hkv, V row): this layer's blocks (kv_pool.py)
    # tables: (S, max_blocks) int32: block b of sequence s holds its positions b*bs .. b*bs+bs-1
    # tok_seq: (T,) int32 row of tables for each query; q_pos: (T,) int32 its position;
    #   keys 0..q_pos[t] of that sequence are visible (causal)
    # window: 0 or the sliding window (key p visible iff q_pos - p < window)
    # sinks: (Hq,) f32 or (0,): a logit per head that joins the softmax without a value (gpt-oss;
    #   ggml_soft_max_ext's sinks: in the max and, as exp(sink - max), in the sum)
    # rot_v: 0 or the size of the rotation V was stored with (qkv_post), undone on each output head
    # out: (T, Hq, Dv) f32; scores: (n_chunks, >= longest sequence) f32 scratch, a row per parallel chunk
    T, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    Dv = out.shape[2]
    group = Hq // Hkv
    n_work = T * Hq
    n_chunks = min(scores.shape[0], n_work)
    qflat = q.reshape(T * Hq * D)
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
                qk(qflat, (t * Hq + h) * D, qd[t], h * D // 16, k_pool, kh, r0, m, s[p0 - lo:])
            mx = np.float32(-np.inf)
            for j in range(n):
                a = sw[j] * scale
                if softcap > 0:
                    a = softcap * np.float32(math.tanh(a / softcap))
                sw[j] = a
                mx = max(mx, a)
            if sinks.shape[0]:
                mx = max(mx, sinks[h])
            total = softmax_exp(sw, mx)  # ggml_vec_soft_max_f32: its vector exp, the sum in float64
            if sinks.shape[0]:
                total += np.float64(np.float32(math.exp(sinks[h] - mx)))
            inv = np.float32(1.0 / total)
            for j in range(n):
                sw[j] *= inv
            round_weights(sw, v_pool)
            o = out[t, h]
            for i in range(Dv):
                o[i] = 0.0
            for b in range(lo // bs, hi // bs + 1):
                p0 = max(lo, b * bs)
                m = min(hi, b * bs + bs - 1) + 1 - p0
                r0 = table[b] * bs + p0 - b * bs
                weigh_values(v_pool, kh, r0, m, s, p0 - lo, o)
            if rot_v > 0:
                fwht(o, rot_v)
