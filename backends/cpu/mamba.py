"""Mamba-2's mixer after its in-projection (llama.cpp's build_mamba2_layer from the causal
convolution to the grouped norm; granitehybrid's recurrent layers), as ggml's CPU backend computes
it: one pure kernel over caller-provided arrays, so a decode step allocates nothing.

The in-projection gives per token z (I = H * P: H heads of P), xBC (C = I + 2 G N: x, then B and
C of G groups of N) and dt (H).
1. The depthwise causal convolution of width L over xBC (ggml_ssm_conv, a float32 sum per
   channel, oldest input first), plus its bias, then SiLU (ggml_vec_silu_f32); the inputs before a
   sequence's first token in the batch come from its "conv" state, and before position 0 are zero
   (so a slot needs no reset: shortconv.py's rule).
2. The selective scan (ggml_ssm_scan with a scalar A per head), per head h of group
   h // (H / G), over its (P, N) state: dt' = softplus(dt + dt_bias), dA = exp(dt' A);
   s = s dA + B (x dt'); y = s . C. A sequence that starts at position 0 starts from a zero state.
   Bit for bit as ggml's AVX-512 build (checked against its ssm_scan: tests/test_mamba.py): the
   compiler fuses the update into fma(s, dA, B * x dt'), in the vector loop and the scalar tail
   alike; y's sum over N runs the whole steps of 64 in four 16-lane chains of fused multiply-adds
   (GGML_F32_STEP), the chains added (0 + 2, 1 + 3, then those) and their lanes halved down to one
   (GGML_F32x16_REDUCE), then the rest of N one fused step at a time. Those chains are explicit
   16-lane LLVM vector code (scan_rows, four state rows at a time sharing B's and C's loads; a numba
   loop kept them in memory, an order of magnitude slower), on any CPU's vector width alike.
   The intrinsics live in this module with the kernel that inlines them (numba's on-disk cache of a
   function is keyed on its own file only).
3. y + x D (ggml_mul, then ggml_add), times SiLU(z) (ggml_swiglu_split over rows of P), then
   RMSNorm over each of the G groups of I / G times the norm weight (the grouped norm).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .delta_net import silu_row
from .elementwise import rms_scale
from .shortconv import causal_conv_row, keep_last_inputs, seq_spans
from .target import c_float32_args, f32x16_reduce, splat
from .vexp import expf_row

_SILU_WIDTH = 16  # ggml_vec_swiglu_f32's vector (AVX-512): a row's tail past its last whole 16 takes expf
_LANES = 16  # ggml_ssm_scan's vector (AVX-512's GGML_F32_EPR) ...
_STEP = 4 * _LANES  # ... four of them a step (GGML_F32_STEP)
_ONE = np.float32(1.0)
_F32, _I64 = ir.FloatType(), ir.IntType(64)
_V = ir.VectorType(_F32, _LANES)


@njit(cache=True, parallel=True, error_model="numpy")
def mamba2(proj, conv_w, conv_b, dt_bias, ssm_a, ssm_d, norm_w, eps, n_group, conv_state, state, slots, tok_seq,
           positions, first, count, xc, e, y):
    # proj: (T, I + C + H) f32 the in-projection: z (I = H P), xBC (C = I + 2 G N), dt (H)
    # conv_w: (L, C) f32 the convolution's kernel, oldest input first (the GGUF's (C, L) transposed)
    # conv_b: (C,) f32; dt_bias, ssm_a, ssm_d: (H,) f32; norm_w: (I,) f32 the grouped norm's weight
    # eps: f32 the model's RMS epsilon; n_group: G
    # conv_state: (n_slots, L - 1, C) f32 this layer's last xBC inputs of each slot, read then updated in place
    # state: (n_slots, H, P, N) f32 this layer's scan states, read then updated in place
    # slots: (S_seq,) int32 the state slot of each table row's sequence
    # tok_seq, positions: (T,) int32 each token's table row and position
    # first, count: (>= S_seq,) int32 scratch (shortconv.seq_spans)
    # xc: (T, C) f32 scratch: the convolution's output after SiLU
    # e: (T, C) f32 scratch (SiLU's exponentials)
    # y: (T, I) f32 out: the gated, normed scan output
    T, C = proj.shape[0], conv_w.shape[1]
    H, P = state.shape[1], state.shape[2]
    G = n_group
    inner = H * P
    seq_spans(tok_seq, positions, first, count)
    # 1. convolution, bias and SiLU
    xbc = proj[:, inner:inner + C]
    for t in prange(T):
        s = tok_seq[t]
        p, f = positions[t], first[s]
        p0 = positions[f]
        slot = slots[s]
        row = xc[t]
        causal_conv_row(xbc, conv_state, slot, f, p, p0, conv_w, row)
        for c in range(C):
            row[c] = row[c] + conv_b[c]
        silu_row(row, e[t], row)
    # the convolution's state: each sequence's last L - 1 inputs
    n_seq = slots.shape[0]
    for s in prange(n_seq):
        if count[s]:
            keep_last_inputs(xbc, first[s], positions[first[s]], count[s], conv_state[slots[s]])
    # 2. the scan (and y + x D)
    ssm_scan(xc, proj[:, inner + C:], dt_bias, ssm_a, ssm_d, G, state, slots, positions, first, count, y)
    # 3. times SiLU(z) per head's row of P (whole 16s the vector way, the tail by expf; e's row t
    # is spent, its first I columns take exp(-z)), then the grouped RMSNorm times its weight
    V = P - P % _SILU_WIDTH
    width = inner // G
    for t in prange(T):
        z = proj[t, :inner]
        ez = e[t, :inner]
        for h in range(H):
            expf_row(z[h * P:h * P + V], True, np.float32(0.0), ez[h * P:h * P + V])
            for j in range(h * P + V, (h + 1) * P):
                ez[j] = np.float32(math.exp(-z[j]))
        o = y[t]
        for j in range(inner):
            o[j] = (z[j] / (_ONE + ez[j])) * o[j]
        for gg in range(G):
            og = o[gg * width:(gg + 1) * width]
            scale = rms_scale(og, eps)
            for j in range(width):
                og[j] = np.float32(og[j] * scale) * norm_w[gg * width + j]


def _make_scan_rows(R: int):
    """The intrinsic scan_rows(st, so, xc, xo, bo, co, dA, sp, d, y, yo): R rows of a head's state,
    row r the N = st.shape[-1] values at flat offset so + r N of st, for x_r = xc[xo + r] (flat):
    s = fma(s, dA, B (x_r sp)) in place, y[yo + r] = (the sum of s C) + x_r d, with B and C the N
    values at flat offsets bo and co of xc. st, xc, y: C-contiguous float32 arrays; dA, sp, d:
    float32. Explicit 16-lane vector code: the sums stay in registers as ggml's (a numba loop would
    keep them in memory), and B's and C's vectors are loaded once for the R rows."""

    def codegen(context, builder, signature, args):
        st, _, xc = signature.args[:3]
        yt = signature.args[9]
        sa = context.make_array(st)(context, builder, args[0])
        xa = context.make_array(xc)(context, builder, args[2])
        ya = context.make_array(yt)(context, builder, args[9])
        so, xo, bo, co, yo = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 3, 4, 5, 10))
        dA, sp, d = args[6], args[7], args[8]
        N = cgutils.unpack_tuple(builder, sa.shape, st.ndim)[-1]
        i64 = lambda v: ir.Constant(_I64, v)
        fma_v = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V] * 3), f"llvm.fma.v{_LANES}f32")
        fma_1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
        rows = [builder.add(so, builder.mul(N, i64(r))) for r in range(R)]
        x = [builder.load(builder.gep(xa.data, [builder.add(xo, i64(r))])) for r in range(R)]
        x_dt = [builder.fmul(v, sp) for v in x]
        dA_v, x_dt_v = splat(builder, dA, _LANES), [splat(builder, v, _LANES) for v in x_dt]
        acc = [[cgutils.alloca_once_value(builder, ir.Constant(_V, [0.0] * _LANES)) for _ in range(_STEP // _LANES)]
               for _ in range(R)]

        def vec(arr, base, off):
            return builder.bitcast(builder.gep(arr.data, [builder.add(base, off)]), _V.as_pointer())

        n_step = builder.udiv(N, i64(_STEP))
        with cgutils.for_range(builder, n_step) as loop:
            for k in range(_STEP // _LANES):  # chain k takes vector k of each step (GGML_F32_ARR)
                off = builder.add(builder.mul(loop.index, i64(_STEP)), i64(k * _LANES))
                b = builder.load(vec(xa, bo, off), align=4)
                c = builder.load(vec(xa, co, off), align=4)
                for r in range(R):
                    p = vec(sa, rows[r], off)
                    v = builder.call(fma_v, [builder.load(p, align=4), dA_v, builder.fmul(b, x_dt_v[r])])
                    builder.store(v, p, align=4)
                    builder.store(builder.call(fma_v, [v, c, builder.load(acc[r][k])]), acc[r][k])
        tail = builder.mul(n_step, i64(_STEP))
        for r in range(R):
            a = [builder.load(p) for p in acc[r]]
            # GGML_F32x16_REDUCE: chains 0 + 2 and 1 + 3, then those, then the lanes
            # (_mm512_reduce_add_ps); no whole step: all lanes +0.0, so the sum starts from 0.0f all the same
            total = cgutils.alloca_once_value(builder, f32x16_reduce(builder, a))
            with cgutils.for_range(builder, builder.sub(N, tail)) as loop:  # the rest one fused step at a time
                j = builder.add(tail, loop.index)
                p = builder.gep(sa.data, [builder.add(rows[r], j)])
                b = builder.load(builder.gep(xa.data, [builder.add(bo, j)]))
                c = builder.load(builder.gep(xa.data, [builder.add(co, j)]))
                v = builder.call(fma_1, [builder.load(p), dA, builder.fmul(b, x_dt[r])])
                builder.store(v, p)
                builder.store(builder.call(fma_1, [v, c, builder.load(total)]), total)
            out = builder.fadd(builder.load(total), builder.fmul(x[r], d))
            builder.store(out, builder.gep(ya.data, [builder.add(yo, i64(r))]))
        return context.get_dummy_value()

    @intrinsic
    def scan_rows(typingctx, st, so, xc, xo, bo, co, dA, sp, d, y, yo):
        if not c_float32_args((st, xc, y), (dA, sp, d), (so, xo, bo, co, yo)):
            return None
        return types.void(st, so, xc, xo, bo, co, dA, sp, d, y, yo), codegen

    return scan_rows


_ROWS = 4  # state rows scan_rows4 takes at a time: B's and C's loads shared, its 16 sums in AVX-512's 32 registers
scan_rows4 = _make_scan_rows(_ROWS)
scan_rows1 = _make_scan_rows(1)


@njit(cache=True, parallel=True, error_model="numpy")
def ssm_scan(xc, dt, dt_bias, ssm_a, ssm_d, n_group, state, slots, positions, first, count, y):
    # ggml_ssm_scan (Mamba-2: a scalar A per head) plus x D, in parallel over (sequence, head), each
    # sequence's tokens in order, bit for bit as ggml's AVX-512 build (scan_rows; the module docstring)
    # xc: (T, I + 2 G N) f32 x | B | C of each token, C-contiguous; dt: (T, H) f32 (a view)
    # dt_bias, ssm_a, ssm_d: (H,) f32; n_group: G
    # state: (n_slots, H, P, N) f32 C-contiguous, read then updated in place; slots: (S_seq,) int32
    # positions: (T,) int32; first, count: (>= S_seq,) int32 each sequence's rows (shortconv.seq_spans)
    # y: (T, H P) f32 C-contiguous, out
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    G = n_group
    inner = H * P
    width = xc.shape[1]
    per_group = H // G
    for sh in prange(slots.shape[0] * H):
        s, h = sh // H, sh % H
        n = count[s]
        if n == 0:
            continue
        f = first[s]
        base = (slots[s] * H + h) * P * N  # the head's state, flat
        if positions[f] == 0:
            st = state[slots[s], h]
            for i in range(P):
                for j in range(N):
                    st[i, j] = 0.0
        g = h // per_group
        for t in range(f, f + n):
            bo = t * width + inner + g * N
            co = bo + G * N
            d = np.float32(dt[t, h] + dt_bias[h])
            sp = d if d > np.float32(20.0) else np.float32(math.log(_ONE + np.float32(math.exp(d))))
            dA = np.float32(math.exp(np.float32(sp * ssm_a[h])))
            xo = t * width + h * P
            yo = t * inner + h * P
            for i in range(0, P - P % _ROWS, _ROWS):
                scan_rows4(state, base + i * N, xc, xo + i, bo, co, dA, sp, ssm_d[h], y, yo + i)
            for i in range(P - P % _ROWS, P):
                scan_rows1(state, base + i * N, xc, xo + i, bo, co, dA, sp, ssm_d[h], y, yo + i)
