"""LFM2's gated short convolution (llama.cpp's build_shortconv_block after in_proj): B * x, a
depthwise causal convolution of width L over each sequence's inputs, C times its output; and the
update of each sequence's state (its last L - 1 inputs B * x). A pure kernel over caller-provided
arrays, so a decode step allocates nothing.

Which inputs precede a token is read off its position: the input at position q is the batch's row
of the same sequence when q is at or after that sequence's first position in the batch (p0), the
state's row q - p0 + L - 1 when 0 <= q < p0, and zero before position 0 (llama.cpp's zeroed state
of a new sequence). So a slot needs no reset: a sequence that starts at position 0 (a new one, or
a preempted one recomputed from its tokens) ignores whatever its slot held.
"""
from __future__ import annotations

from numba import njit, prange

from .vexp import fma32


@njit(cache=True)
def seq_spans(tok_seq, positions, first, count):
    # tok_seq, positions: (T,) int32; first, count: (>= S,) int32 out: each sequence's first batch row and
    # its number of tokens. A sequence's tokens must be consecutive rows at consecutive positions (the
    # engine's batches are), else its inputs could not be found by position.
    S = first.shape[0]
    for s in range(S):
        count[s] = 0
    for t in range(tok_seq.shape[0]):
        s = tok_seq[t]
        if count[s] == 0:
            first[s] = t
        elif t != first[s] + count[s] or positions[t] != positions[first[s]] + count[s]:
            raise ValueError("shortconv: a sequence's tokens must be consecutive rows at consecutive positions")
        count[s] += 1


@njit(cache=True, inline="always")
def causal_conv_row(inputs, state, slot, f, p, p0, kernel, out):
    # One token's depthwise causal convolution (ggml_ssm_conv), at position p of a sequence whose
    # first batch row f is at position p0: out (C,) f32 = per channel a float32 sum over the window,
    # oldest input first, each step one fused multiply-add as the compiler contracts ggml's
    # `sumf += s * c`. The input at position q: the batch's row (inputs (T, >= C) f32) at or after
    # p0, the state's row (state (n_slots, L - 1, C) f32, slot's) before it, zero before position 0.
    # kernel: (L, C) f32 the weights, oldest input first. (shortconv here; delta_net.py's and
    # mamba.py's convolutions)
    L, C = kernel.shape
    for c in range(C):
        out[c] = 0.0
    for i in range(L):
        q = p - (L - 1) + i
        if q < 0:
            continue  # adds 0 * w: the sum is unchanged
        if q >= p0:
            src = inputs[f + q - p0]
        else:
            src = state[slot, q - p0 + L - 1]
        w = kernel[i]
        for c in range(C):
            out[c] = fma32(src[c], w[c], out[c])


@njit(cache=True, parallel=True)
def shortconv(bcx, kernel, state, slots, tok_seq, positions, first, count, bx, y):
    # bcx: (T, 3D) f32 in_proj's output, B | C | x
    # kernel: (L, D) f32 the depthwise weights, oldest input first (the GGUF's (D, L) transposed)
    # state: (n_slots, L - 1, D) f32 this layer's states, read and then updated in place
    # slots: (S,) int32 the state slot of each table row's sequence
    # tok_seq, positions: (T,) int32 each token's table row and position
    # first, count: (>= S,) int32 scratch (seq_spans)
    # bx: (T, D) f32 scratch: B * x
    # y: (T, D) f32 out: C * conv(B * x)
    T, D = bcx.shape[0], y.shape[1]
    seq_spans(tok_seq, positions, first, count)
    for t in prange(T):
        for c in range(D):
            bx[t, c] = bcx[t, c] * bcx[t, 2 * D + c]
    for t in prange(T):
        s = tok_seq[t]
        p, f = positions[t], first[s]
        p0 = positions[f]
        slot = slots[s]
        causal_conv_row(bx, state, slot, f, p, p0, kernel, y[t])
        for c in range(D):
            y[t, c] *= bcx[t, D + c]
    # each sequence's state becomes its last L - 1 inputs
    for s in prange(slots.shape[0]):
        if count[s]:
            keep_last_inputs(bx, first[s], positions[first[s]], count[s], state[slots[s]])


@njit(cache=True)
def keep_last_inputs(src, f, p0, n, state):
    # A causal convolution's state after a batch: state (L - 1, C) f32, one sequence's inputs before
    # the batch, oldest first, becomes its last L - 1 inputs; src (T, >= C) f32 holds the batch's
    # inputs, the sequence's n at positions p0.. in rows f..; zero before position 0. Rows move
    # towards the front, so reading row r + n before it is overwritten is safe in ascending r.
    # (shortconv here, delta_net.py's and mamba.py's convolutions)
    L1, C = state.shape
    end = p0 + n
    for r in range(L1):
        q = end - L1 + r
        if q >= p0:
            for c in range(C):
                state[r, c] = src[f + q - p0, c]
        elif q >= 0:
            for c in range(C):
                state[r, c] = state[r + n, c]
        else:
            for c in range(C):
                state[r, c] = 0.0
