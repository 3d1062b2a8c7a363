"""LFM2's gated short convolution in MLX (the cpu backend's backends/cpu/shortconv.py, the same
semantics): B * x, a depthwise causal convolution of width L over each sequence's inputs, C times
its output, and each sequence's state (its last L - 1 inputs B * x) updated in place.

Which input precedes a token is decided on the host, once per batch (ConvPlan), as index arrays
into one source of rows: the batch's inputs (rows 0 .. T-1: B * x here, Q|K|V for the gated
delta nets' convolution, delta_net.py), then each batch sequence's L - 1
state rows as they were before the batch, then a zero row. The input at position q of a token's
sequence is its batch row when q is at or after the sequence's first position in the batch (p0),
its state row q - p0 + L - 1 when 0 <= q < p0, and zero before position 0 (llama.cpp's zeroed
state of a new sequence), so a slot needs no reset. The convolution is then one gather and L
multiply-adds, the update one gather and one scatter.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from infer.backends.batch import Batch


class ConvPlan:
    """The host-side indices of one batch's causal convolutions (the same for every layer)."""

    def __init__(self, batch: Batch, L: int):
        tok_seq, pos = batch.tok_seq, batch.positions.astype(np.int64)
        T, R = len(tok_seq), L - 1
        seqs, first, count = np.unique(tok_seq, return_index=True, return_counts=True)
        j = np.searchsorted(seqs, tok_seq)  # each token's sequence, 0 .. S-1 in the batch
        f, p0 = first[j], pos[first[j]]
        # a sequence's tokens must be consecutive rows at consecutive positions (the engine's
        # batches are), else its inputs could not be found by position
        off = np.arange(T) - f
        if (off >= count[j]).any() or (pos != p0 + off).any():
            raise ValueError("shortconv: a sequence's tokens must be consecutive rows at consecutive positions")
        S = len(seqs)
        zero = T + S * R
        state_row = T + j[:, None] * R  # where the token's sequence's state rows start in the source

        def source(q, base, p0, f):
            # q: positions of inputs; the source row of each (batch row, state row or zero)
            return np.where(q >= p0, f + q - p0, np.where(q >= 0, base + q - p0 + R, zero))

        # window: (T, L) int32, the source rows of each token's L inputs, oldest first
        q = pos[:, None] - R + np.arange(L)[None, :]
        self.window = mx.array(source(q, state_row, p0[:, None], f[:, None]).astype(np.int32))
        # the state rows each batch sequence reads: (S * R,) int32 into a layer's flat state
        slots = batch.state_slots[seqs].astype(np.int64)
        rows = (slots[:, None] * R + np.arange(R)[None, :]).reshape(-1)
        self.state_rows = mx.array(rows.astype(np.int32))
        # update: (S * R,) int32, the source row of each sequence's new state row r: its input at
        # position end - R + r (end: one past its last token); written to state_rows
        s_p0 = pos[first]
        end = s_p0 + count
        q = end[:, None] - R + np.arange(R)[None, :]
        base = (T + np.arange(S) * R)[:, None]
        self.update = mx.array(source(q, base, s_p0[:, None], first[:, None]).reshape(-1).astype(np.int32))
        self.L = L


def causal_conv(inputs: mx.array, kernel: mx.array, state: mx.array, plan: ConvPlan) -> mx.array:
    """The depthwise causal convolution of each sequence's inputs (ggml_ssm_conv), shared by LFM2's
    short convolutions and Qwen3.5's gated delta nets (delta_net.py). inputs: (T, C) f32 the
    batch's; kernel: (L, C) f32, oldest input first; state: (n_slots (L - 1), C) f32 one layer's
    states (MlxStatePool.conv), its batch sequences' rows replaced in place by their last L - 1
    inputs (lazily: the gather below reads the old rows). Returns (T, C)."""
    C = inputs.shape[1]
    src = mx.concatenate([inputs, state[plan.state_rows], mx.zeros((1, C), mx.float32)])
    win = src[plan.window]  # (T, L, C)
    # oldest input first, one multiply-add per step: ggml_ssm_conv's order of summation
    y = win[:, 0] * kernel[0]
    for i in range(1, plan.L):
        y = y + win[:, i] * kernel[i]
    state[plan.state_rows] = src[plan.update]
    return y


def shortconv(bcx: mx.array, kernel: mx.array, state: mx.array, plan: ConvPlan) -> mx.array:
    """bcx: (T, 3D) f32 in_proj's output, B | C | x; kernel: (L, D) f32, oldest input first;
    state: (n_slots (L - 1), D) f32 one layer's states, updated in place (causal_conv). Returns
    y (T, D) = C * conv(B * x)."""
    D = bcx.shape[1] // 3
    return causal_conv(bcx[:, :D] * bcx[:, 2 * D:], kernel, state, plan) * bcx[:, D:2 * D]
