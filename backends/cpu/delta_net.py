"""Qwen3.5's gated delta net after its input products (llama.cpp's build_layer_attn_linear from
the causal convolution to the gated norm), as ggml's CPU backend computes it: one pure kernel over
caller-provided arrays, so a decode step allocates nothing.

1. The depthwise causal convolution of width L over Q|K|V (ggml_ssm_conv, a float32 sum per
   channel, oldest input first), then SiLU (ggml_vec_silu_f32); the inputs before a sequence's
   first token in the batch come from its "conv" state, and before position 0 are zero (so a slot
   needs no reset: shortconv.py's rule).
2. Q and K L2-normalized per key head (llama.cpp's build_gdn_l2_norm: rms_norm with eps / S, then
   times 1 / sqrt(S)).
3. The gated delta rule (ggml_compute_forward_gated_delta_net, which llama.cpp's CPU backend runs
   for prompts and single tokens alike: the fused op), per value head h with key head h % H_k
   (Qwen3.5's tiling; Qwen3-Next's grouping: h // (H_v / H_k)), over
   the state M (S x S, M[j, i]: value component j, key component i): M *= exp(g); d = (v - M k) *
   beta; M += d k^T; o = M q / sqrt(S). g = softplus(alpha + dt_bias) * A, beta = sigmoid(beta).
   A sequence that starts at position 0 starts from a zero state.
   Bit for bit as ggml's AVX-512 build (checked against its gated_delta_net: tests/test_delta_net.py):
   each row of M is scaled (ggml_vec_scale_f32), dotted with k (ggml_vec_dot_f32: the whole steps
   of 64 in four 16-lane chains of fused multiply-adds, reduced as GGML_F32x16_REDUCE, then the
   rest one fused step at a time), updated by fused multiply-adds (ggml_vec_mad_f32) and dotted
   with q. Rows are independent, so delta_rows takes a row through all four at once while it is in
   cache (ggml: each over all of M in turn), four rows at a time sharing k's and q's loads; explicit
   16-lane LLVM vector code as mamba.py's scan_rows (a numba loop chains its sums one at a time).
4. RMSNorm of each head's output times the norm weight, times SiLU(z) (build_norm_gated).
The intrinsics live in this module with the kernels that inline them (numba's on-disk cache of a
function is keyed on its own file only).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .elementwise import rms_scale
from .shortconv import causal_conv_row, keep_last_inputs, seq_spans
from .target import c_float32_args, f32x16_reduce, splat
from .vexp import expf_row

_SILU_WIDTH = 16  # ggml_vec_silu_f32's vector (AVX-512): the tail of a row past its last whole 16 takes expf
_LANES = 16  # ggml_vec_dot_f32's vector (AVX-512's GGML_F32_EPR) ...
_STEP = 4 * _LANES  # ... four of them a step (GGML_F32_STEP)
_ONE = np.float32(1.0)
_F32, _I64 = ir.FloatType(), ir.IntType(64)
_V = ir.VectorType(_F32, _LANES)


@njit(cache=True, inline="always", error_model="numpy")
def silu_row(x, e, out):
    # x, e, out: (n,) f32; out = silu(x) as ggml_vec_silu_f32 (e: scratch, exp(-x)); out may be x
    n = x.shape[0]
    V = n - n % _SILU_WIDTH
    expf_row(x[:V], True, np.float32(0.0), e[:V])
    for i in range(V):
        out[i] = x[i] / (_ONE + e[i])
    for i in range(V, n):
        v = x[i]
        out[i] = v / (_ONE + np.float32(math.exp(-v)))


def _make_delta_rows(R: int):
    """The intrinsic delta_rows(st, so, xc, qo, ko, vo, decay, beta, scale, y, yo): one token's delta
    rule on R rows of a value head's state, row r the S = st.shape[-1] values M_r at flat offset
    so + r S of st: M_r *= decay; d = (v_r - M_r . k) beta with v_r = xc[vo + r] (flat);
    M_r += k d; y[yo + r] = (M_r . q) scale; k and q the S values at flat offsets ko and qo of xc.
    st, xc, y: C-contiguous float32 arrays; decay, beta, scale: float32. Explicit 16-lane vector
    code: the sums stay in registers in ggml's chains, and k's and q's vectors are loaded once for
    the R rows."""

    def codegen(context, builder, signature, args):
        st, xc, yt = signature.args[0], signature.args[2], signature.args[9]
        sa = context.make_array(st)(context, builder, args[0])
        xa = context.make_array(xc)(context, builder, args[2])
        ya = context.make_array(yt)(context, builder, args[9])
        so, qo, ko, vo, yo = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 3, 4, 5, 10))
        decay, beta, scale = args[6], args[7], args[8]
        N = cgutils.unpack_tuple(builder, sa.shape, st.ndim)[-1]
        i64 = lambda v: ir.Constant(_I64, v)
        fma_v = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V] * 3), f"llvm.fma.v{_LANES}f32")
        fma_1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
        rows = [builder.add(so, builder.mul(N, i64(r))) for r in range(R)]
        n_step = builder.udiv(N, i64(_STEP))
        tail = builder.mul(n_step, i64(_STEP))

        def vec(arr, base, off):
            return builder.bitcast(builder.gep(arr.data, [builder.add(base, off)]), _V.as_pointer())

        def at(arr, off):
            return builder.gep(arr.data, [off])

        def zeros():  # each row's four chains, zeroed where this call runs (the allocas are the function's)
            return [[cgutils.alloca_once_value(builder, ir.Constant(_V, [0.0] * _LANES)) for _ in range(_STEP // _LANES)]
                    for _ in range(R)]

        def row_sums(acc, other, update):
            """Per row: its whole steps' chains reduced as ggml's, then the rest of the row one fused step at a
            time; update(r, p) gives row r's new value at pointer p (and stores it)."""
            totals = []
            for r in range(R):
                total = cgutils.alloca_once_value(builder, f32x16_reduce(builder, [builder.load(a) for a in acc[r]]))
                with cgutils.for_range(builder, builder.sub(N, tail)) as loop:
                    j = builder.add(tail, loop.index)
                    m = update(r, at(sa, builder.add(rows[r], j)), builder.load(at(xa, builder.add(ko, j))))
                    builder.store(builder.call(fma_1, [m, builder.load(at(xa, builder.add(other, j))), builder.load(total)]),
                                  total)
                totals.append(builder.load(total))
            return totals

        # M_r *= decay and M_r . k (ggml_vec_scale_f32, then ggml_vec_dot_f32)
        decay_v = splat(builder, decay, _LANES)
        acc = zeros()
        with cgutils.for_range(builder, n_step) as loop:
            for c in range(_STEP // _LANES):  # chain c takes vector c of each step (GGML_F32_ARR)
                off = builder.add(builder.mul(loop.index, i64(_STEP)), i64(c * _LANES))
                kv = builder.load(vec(xa, ko, off), align=4)
                for r in range(R):
                    p = vec(sa, rows[r], off)
                    m = builder.fmul(builder.load(p, align=4), decay_v)
                    builder.store(m, p, align=4)
                    builder.store(builder.call(fma_v, [m, kv, builder.load(acc[r][c])]), acc[r][c])

        def scaled(r, p, k):
            m = builder.fmul(builder.load(p), decay)
            builder.store(m, p)
            return m

        dots = row_sums(acc, ko, scaled)
        # d_r = (v_r - M_r . k) beta
        d = [builder.fmul(builder.fsub(builder.load(at(xa, builder.add(vo, i64(r)))), dots[r]), beta) for r in range(R)]
        d_v = [splat(builder, v, _LANES) for v in d]
        # M_r += k d_r and M_r . q (ggml_vec_mad_f32, then ggml_vec_dot_f32)
        acc = zeros()
        with cgutils.for_range(builder, n_step) as loop:
            for c in range(_STEP // _LANES):
                off = builder.add(builder.mul(loop.index, i64(_STEP)), i64(c * _LANES))
                kv = builder.load(vec(xa, ko, off), align=4)
                qv = builder.load(vec(xa, qo, off), align=4)
                for r in range(R):
                    p = vec(sa, rows[r], off)
                    m = builder.call(fma_v, [kv, d_v[r], builder.load(p, align=4)])
                    builder.store(m, p, align=4)
                    builder.store(builder.call(fma_v, [m, qv, builder.load(acc[r][c])]), acc[r][c])

        def updated(r, p, k):
            m = builder.call(fma_1, [k, d[r], builder.load(p)])
            builder.store(m, p)
            return m

        for r, total in enumerate(row_sums(acc, qo, updated)):
            builder.store(builder.fmul(total, scale), at(ya, builder.add(yo, i64(r))))
        return context.get_dummy_value()

    @intrinsic
    def delta_rows(typingctx, st, so, xc, qo, ko, vo, decay, beta, scale, y, yo):
        if not c_float32_args((st, xc, y), (decay, beta, scale), (so, qo, ko, vo, yo)):
            return None
        return types.void(st, so, xc, qo, ko, vo, decay, beta, scale, y, yo), codegen

    return delta_rows


_ROWS = 4  # state rows delta_rows4 takes at a time: k's and q's loads shared, its 16 sums in AVX-512's 32 registers
delta_rows4 = _make_delta_rows(_ROWS)
delta_rows1 = _make_delta_rows(1)


@njit(cache=True, parallel=True, error_model="numpy")
def delta_rule(xc, gb, n_k_heads, k_repeat, state, slots, positions, first, count, y):
    # ggml_gated_delta_net in parallel over (sequence, value head), each sequence's tokens in order,
    # bit for bit as ggml's AVX-512 build (delta_rows; the module docstring)
    # xc: (T, 2 Hk S + Hv S) f32 Q|K|V of each token (Q and K L2-normalized), C-contiguous
    # gb: (T, 2 Hv) f32 each token's beta per value head, then its log decay g (a view)
    # n_k_heads: Hk; k_repeat: value head h reads key head (h // k_repeat) % Hk (delta_net's)
    # state: (n_slots, Hv, S, S) f32 C-contiguous, M[j, i] (value j, key i), read then updated in place
    # slots: (S_seq,) int32; positions: (T,) int32; first, count: (>= S_seq,) int32 each sequence's
    #   rows (shortconv.seq_spans)
    # y: (T, Hv S) f32 C-contiguous, out: M q / sqrt(S)
    Hv, S = state.shape[1], state.shape[2]
    Hk = n_k_heads
    width, inner, key_dim = xc.shape[1], Hv * S, Hk * S
    scale = _ONE / np.float32(math.sqrt(np.float32(S)))
    whole = S - S % _ROWS
    for sh in prange(slots.shape[0] * Hv):
        s, h = sh // Hv, sh % Hv
        n = count[s]
        if n == 0:
            continue
        f = first[s]
        base = (slots[s] * Hv + h) * S * S  # the head's state, flat
        if positions[f] == 0:
            M = state[slots[s], h]
            for j in range(S):
                for i in range(S):
                    M[j, i] = 0.0
        kh = (h // k_repeat) % Hk
        for t in range(f, f + n):
            qo = t * width + kh * S
            ko = qo + key_dim
            vo = t * width + 2 * key_dim + h * S
            yo = t * inner + h * S
            decay = np.float32(math.exp(gb[t, Hv + h]))
            beta = gb[t, h]
            for j in range(0, whole, _ROWS):
                delta_rows4(state, base + j * S, xc, qo, ko, vo + j, decay, beta, scale, y, yo + j)
            for j in range(whole, S):
                delta_rows1(state, base + j * S, xc, qo, ko, vo + j, decay, beta, scale, y, yo + j)



@njit(cache=True, parallel=True, error_model="numpy")
def delta_net(proj, conv_w, dt_bias, ssm_a, norm_w, eps, n_k_heads, k_repeat, conv_state, state, slots, tok_seq, positions,
              first, count, xc, e, y):
    # proj: (T, C + I + 2 Hv) f32 the input products side by side: Q|K|V (C = 2 Hk S + I), z (I = Hv S),
    #   beta's and alpha's logits (Hv each)
    # conv_w: (L, C) f32 the convolution's kernel, oldest input first (the GGUF's (C, L) transposed)
    # dt_bias, ssm_a: (Hv,) f32; norm_w: (S,) f32; eps: f32 the model's RMS epsilon; n_k_heads: Hk
    # k_repeat: value head h reads key head (h // k_repeat) % Hk: 1 where the V heads are tiled over
    #   the key heads (Qwen3.5), Hv / Hk where they are grouped by key head (Qwen3-Next)
    # conv_state: (n_slots, L - 1, C) f32 this layer's last inputs of each slot, read then updated in place
    # state: (n_slots, Hv, S, S) f32 this layer's delta-rule matrices, read then updated in place
    # slots: (S_seq,) int32 the state slot of each table row's sequence
    # tok_seq, positions: (T,) int32 each token's table row and position
    # first, count: (>= S_seq,) int32 scratch (shortconv.seq_spans)
    # xc: (T, C) f32 scratch: the convolution's output, Q and K normalized in place
    # e: (T, C) f32 scratch (SiLU's exponentials; each token's beta and g)
    # y: (T, I) f32 out: the gated norm of each head's output
    T, C = proj.shape[0], conv_w.shape[1]
    Hv, S = state.shape[1], state.shape[2]
    Hk = n_k_heads
    inner = Hv * S
    seq_spans(tok_seq, positions, first, count)
    # 1. convolution and SiLU
    for t in prange(T):
        s = tok_seq[t]
        p, f = positions[t], first[s]
        p0 = positions[f]
        slot = slots[s]
        row = xc[t]
        causal_conv_row(proj, conv_state, slot, f, p, p0, conv_w, row)
        silu_row(row, e[t], row)
        # 2. Q and K L2-normalized per key head
        eps_l2 = np.float32(eps / np.float32(S))
        inv = np.float32(1.0) / np.float32(math.sqrt(np.float32(S)))
        for hh in range(2 * Hk):
            x = row[hh * S:(hh + 1) * S]
            scale = rms_scale(x, eps_l2)
            for i in range(S):
                x[i] = np.float32(x[i] * scale) * inv
    # the convolution's state: each sequence's last L - 1 inputs
    n_seq = slots.shape[0]
    for s in prange(n_seq):
        if count[s]:
            keep_last_inputs(proj, first[s], positions[first[s]], count[s], conv_state[slots[s]])
    # 3. beta and the log decay g of each token's value heads (e's columns from I on: C > I + 2 Hv,
    # and the gated norm below reads only the first I), then the delta rule
    gb = e[:, inner:inner + 2 * Hv]
    for th in prange(T * Hv):
        t = th // Hv
        h = th % Hv
        b = proj[t, C + inner + h]
        gb[t, h] = _ONE / (_ONE + np.float32(math.exp(-b)))
        ab = np.float32(proj[t, C + inner + Hv + h] + dt_bias[h])
        sp = ab if ab > np.float32(20.0) else np.float32(math.log(_ONE + np.float32(math.exp(ab))))
        gb[t, Hv + h] = np.float32(sp * ssm_a[h])
    delta_rule(xc, gb, Hk, k_repeat, state, slots, positions, first, count, y)
    # 4. RMSNorm per head times the weight, times SiLU(z) (z's rows of S as ggml's silu takes
    # them: whole 16s the vector way, the tail by expf); e's row t is spent, its h-th S columns
    # hold exp(-z) of head h (C > I, so they exist)
    V = S - S % _SILU_WIDTH
    for th in prange(T * Hv):
        t = th // Hv
        h = th % Hv
        o = y[t, h * S:(h + 1) * S]
        z = proj[t, C + h * S:C + (h + 1) * S]
        ez = e[t, h * S:(h + 1) * S]
        expf_row(z[:V], True, np.float32(0.0), ez[:V])
        for j in range(V, S):
            ez[j] = np.float32(math.exp(-z[j]))
        scale = rms_scale(o, eps)
        for j in range(S):
            o[j] = np.float32(o[j] * scale) * norm_w[j] * (z[j] / (_ONE + ez[j]))
