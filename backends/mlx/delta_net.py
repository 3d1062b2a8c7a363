"""Qwen3.5's gated delta net after its input products, in MLX: the cpu backend's
backends/cpu/delta_net.py (llama.cpp's build_layer_attn_linear from the causal convolution to the
gated norm), the same semantics.

1. The depthwise causal convolution of width L over Q|K|V (shortconv.py's causal_conv over the
   batch's ConvPlan: the inputs before a sequence's first token in the batch from its "conv"
   state, zero before position 0), then SiLU.
2. Q and K L2-normalized per key head (llama.cpp's build_gdn_l2_norm: x / sqrt(sum x^2 + eps)),
   Q also scaled by 1 / sqrt(S) (as ggml's build_delta_net_autoregressive scales it); each value
   head h reads key head h % H_k (Qwen3.5: ggml's tiling, Q and K repeated H_v / H_k times along
   the heads), or h // (H_v / H_k) where the value heads are grouped by key head (Qwen3-Next:
   llama.cpp's repeat-interleave; the cpu backend's k_repeat).
3. The gated delta rule per value head over the state M (S x S, M[j, i]: value component j, key
   component i): M *= exp(g); d = (v - M k) * beta; M += d k^T; o = M q, with
   g = softplus(alpha + dt_bias) * A and beta = sigmoid(beta). A sequence that starts at
   position 0 starts from a zero state, whatever its slot held.
4. RMSNorm of each head's output times the norm weight, times SiLU(z) (build_norm_gated).

The rule is sequential in a sequence's tokens: the batch's sequences step through it together
(DeltaPlan), a token of each per step, so a decode batch is one step over all its sequences (a
gather of their states, a few elementwise ops and sums, a scatter back), and a prompt of n tokens
is n steps of the same ops. Sums are elementwise products reduced over the last axis, which MLX's
CPU build accumulates in order for each row whatever else is in the batch: a row's result does
not depend on the batch (tested).
"""
from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from infer.backends.batch import Batch

from .shortconv import ConvPlan, causal_conv


class DeltaPlan:
    """The host-side order of one batch's delta-rule steps (the same for every layer; the Mamba-2
    scan, mamba.py, steps through the batch in the same order).

    The batch's sequences sorted by their token count, most first, so the sequences still
    stepping at step t are the first n_t of them; rows (or None: token order already) puts the
    batch's tokens in step order, step t's n_t tokens at offset off_t; perm (or None) puts the
    outputs, produced in step order, back in token order; slots / slot_list: each sequence's
    state slot, in that sorted order (for the gather, and the slice updates that write it back)."""

    def __init__(self, batch: Batch):
        tok_seq, pos = batch.tok_seq, batch.positions
        # ConvPlan (built first, on the same batch) has checked that a sequence's tokens are
        # consecutive rows at consecutive positions
        seqs, first, count = np.unique(tok_seq, return_index=True, return_counts=True)
        order = np.argsort(-count, kind="stable")
        seqs, first, count = seqs[order], first[order], count[order]
        # slots: (S,) int32 each sequence's state slot; fresh: (S,) bool, starts at position 0 (None: none does)
        self.slots = mx.array(batch.state_slots[seqs].astype(np.int32))
        self.slot_list = [int(s) for s in batch.state_slots[seqs]]
        fresh = pos[first] == 0
        self.fresh = mx.array(fresh) if fresh.any() else None
        self.n_seqs = len(seqs)
        self.steps: list[tuple[int, int]] = []  # (n_t, off_t)
        rows, off = [], 0
        for t in range(int(count.max())):
            n = int((count > t).sum())
            self.steps.append((n, off))
            rows.append(first[:n] + t)
            off += n
        cat = np.concatenate(rows)
        same = np.array_equal(cat, np.arange(len(cat)))
        self.rows = None if same else mx.array(cat.astype(np.int32))
        self.perm = None if same else mx.array(np.argsort(cat).astype(np.int32))


def _silu(x: mx.array) -> mx.array:
    return x / (1.0 + mx.exp(-x))


def delta_net(proj: mx.array, ly: Any, n_k_heads: int, grouped: bool, eps: float, conv_state: mx.array,
              state: mx.array, conv_plan: ConvPlan, plan: DeltaPlan) -> mx.array:
    """proj: (T, C + I + 2 Hv) f32 the input products side by side: Q|K|V (C = 2 Hk S + I), z
    (I = Hv S), beta's and alpha's logits (Hv each); ly: the layer (ssm_conv (L, C) f32 oldest
    input first, ssm_dt and ssm_a (Hv,), ssm_norm (S,)); conv_state: (n_slots (L - 1), C) f32 and
    state: (n_slots, Hv, S, S) f32, this layer's states (MlxStatePool), the batch sequences' slots
    replaced in place (lazily); grouped: value head h reads key head h // (Hv / Hk) rather than
    h % Hk. Returns y (T, I) f32, each head's gated norm."""
    T = proj.shape[0]
    Hv, S = state.shape[1], state.shape[2]
    Hk, inner = n_k_heads, Hv * S
    C = 2 * Hk * S + inner
    # 1. the convolution and SiLU
    x = _silu(causal_conv(proj[:, :C], ly.ssm_conv, conv_state, conv_plan))
    # 2. Q and K L2-normalized (rms_norm with eps / S, times 1 / sqrt(S)), Q times 1 / sqrt(S) too
    inv = 1.0 / math.sqrt(S)
    q = mx.fast.rms_norm(x[:, :Hk * S].reshape(T, Hk, S), None, eps / S) * (inv * inv)
    k = mx.fast.rms_norm(x[:, Hk * S:2 * Hk * S].reshape(T, Hk, S), None, eps / S) * inv
    if Hv != Hk and grouped:  # value head h reads key head h // (Hv / Hk)
        q, k = mx.repeat(q, Hv // Hk, axis=1), mx.repeat(k, Hv // Hk, axis=1)
    elif Hv != Hk:  # value head h reads key head h % Hk
        q, k = mx.tile(q, (1, Hv // Hk, 1)), mx.tile(k, (1, Hv // Hk, 1))
    v = x[:, 2 * Hk * S:].reshape(T, Hv, S)
    beta = 1.0 / (1.0 + mx.exp(-proj[:, C + inner:C + inner + Hv]))
    ab = proj[:, C + inner + Hv:] + ly.ssm_dt
    decay = mx.exp(mx.where(ab > 20.0, ab, mx.log(1.0 + mx.exp(ab))) * ly.ssm_a)  # (T, Hv)
    k_dot_q = (k * q).sum(-1)  # (T, Hv)
    if plan.rows is not None:
        q, k, v, beta, decay, k_dot_q = (a[plan.rows] for a in (q, k, v, beta, decay, k_dot_q))
    decay = decay[..., None]  # (T, Hv, 1)
    # 3. the delta rule, a token of each sequence per step. With M' = exp(g) M + d k^T, the delta is
    # d = (v - exp(g) M k) beta and the output o = M' q = exp(g) M q + d (k . q): M's products with
    # k and q both from M as it was, then the update, three passes over M. (Products and sums
    # rather than matmuls: MLX's CPU build runs a batch of (S x S) by (S x 2) products several
    # times slower than these elementwise passes, and reduces each row alike whatever the batch.)
    M = state[plan.slots]
    if plan.fresh is not None:
        M = mx.where(plan.fresh[:, None, None, None], mx.zeros_like(M), M)
    outs = []
    for n, off in plan.steps:
        sl = slice(off, off + n)
        Mt = M if n == plan.n_seqs else M[:n]
        g, kt = decay[sl], k[sl][:, :, None, :]  # kt (n, Hv, 1, S): along each row j of M
        d = (v[sl] - g * (Mt * kt).sum(-1)) * beta[sl][..., None]
        outs.append(g * (Mt * q[sl][:, :, None, :]).sum(-1) + d * k_dot_q[sl][..., None])
        Mt = g[..., None] * Mt + d[..., :, None] * kt
        M = Mt if n == plan.n_seqs else mx.concatenate([Mt, M[n:]])
    # written back slot by slot: a slice update copies a slot's matrices, where MLX's CPU scatter
    # (state[slots] = M) takes ~10x longer for the same bytes (measured on 8 slots of 16 x 128 x 128)
    for i, slot in enumerate(plan.slot_list):
        state[slot] = M[i]
    o = outs[0] if len(outs) == 1 else mx.concatenate(outs)
    if plan.perm is not None:
        o = o[plan.perm]
    # 4. each head's RMSNorm times the weight, times SiLU(z)
    z = proj[:, C:C + inner].reshape(T, Hv, S)
    return (mx.fast.rms_norm(o, ly.ssm_norm, eps) * _silu(z)).reshape(T, inner)
