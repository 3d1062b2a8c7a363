"""Mamba-2's mixer after its in-projection in MLX (granitehybrid's recurrent layers): the cpu
backend's backends/cpu/mamba.py (llama.cpp's build_mamba2_layer from the causal convolution to
the grouped norm), the same semantics.

The in-projection gives per token z (I = H * P: H heads of P), xBC (C = I + 2 G N: x, then B and
C of G groups of N) and dt (H).
1. The depthwise causal convolution of width L over xBC (shortconv.py's causal_conv over the
   batch's ConvPlan: the inputs before a sequence's first token in the batch from its "conv"
   state, zero before position 0), plus its bias, then SiLU.
2. The selective scan per head h of group h // (H / G) over its (P, N) state:
   dt' = softplus(dt + dt_bias), dA = exp(dt' A); s = s dA + (x dt') B^T; y = s C. A sequence
   that starts at position 0 starts from a zero state, whatever its slot held.
3. y + x D, times SiLU(z), then RMSNorm over each of the G groups of I / G times the norm weight.

The scan is sequential in a sequence's tokens: the batch's sequences step through it together
(delta_net.py's DeltaPlan, a token of each sequence per step), so a decode batch is one step (a
gather of the states, a few elementwise ops and one sum over N, a scatter back) and a prompt of n
tokens is n steps of the same ops; a token's result is the same however its prompt is split, and
whatever else is in the batch (MLX's CPU build reduces each row alike: delta_net.py).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from .delta_net import DeltaPlan
from .shortconv import ConvPlan, causal_conv


def _silu(x: mx.array) -> mx.array:
    return x / (1.0 + mx.exp(-x))


def mamba2(proj: mx.array, ly: Any, n_group: int, eps: float, conv_state: mx.array, state: mx.array,
           conv_plan: ConvPlan, plan: DeltaPlan) -> mx.array:
    """proj: (T, I + C + H) f32 the in-projection z | xBC | dt; ly: the layer (ssm_conv (L, C) f32
    oldest input first, ssm_conv_b (C,), ssm_dt, ssm_a, ssm_d (H,), ssm_norm (I,)); n_group: G;
    conv_state: (n_slots (L - 1), C) f32 and state: (n_slots, H, P, N) f32, this layer's states
    (MlxStatePool), the batch sequences' slots replaced in place (lazily). Returns y (T, I) f32."""
    T = proj.shape[0]
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    G, inner = n_group, H * P
    C = inner + 2 * G * N
    # 1. the convolution, its bias and SiLU
    xc = _silu(causal_conv(proj[:, inner:inner + C], ly.ssm_conv, conv_state, conv_plan) + ly.ssm_conv_b)
    x = xc[:, :inner].reshape(T, H, P)
    # each head's group's B and C: (T, H, N), head h reads group h // (H / G)
    B = mx.repeat(xc[:, inner:inner + G * N].reshape(T, G, N), H // G, axis=1)
    Cm = mx.repeat(xc[:, inner + G * N:].reshape(T, G, N), H // G, axis=1)
    d = proj[:, inner + C:] + ly.ssm_dt  # (T, H)
    sp = mx.where(d > 20.0, d, mx.log(1.0 + mx.exp(d)))  # softplus, as ggml's (linear past 20)
    dA = mx.exp(sp * ly.ssm_a)  # (T, H)
    x_dt = x * sp[..., None]  # (T, H, P)
    if plan.rows is not None:
        dA, x_dt, B, Cm = (a[plan.rows] for a in (dA, x_dt, B, Cm))
    dA = dA[..., None, None]  # (T, H, 1, 1)
    B, Cm = B[:, :, None, :], Cm[:, :, None, :]  # (T, H, 1, N): along each row i of a head's state
    x_dt = x_dt[..., None]  # (T, H, P, 1)
    # 2. the scan, a token of each sequence per step
    s = state[plan.slots]  # (S, H, P, N)
    if plan.fresh is not None:
        s = mx.where(plan.fresh[:, None, None, None], mx.zeros_like(s), s)
    outs = []
    for n, off in plan.steps:
        sl = slice(off, off + n)
        st = s if n == plan.n_seqs else s[:n]
        st = st * dA[sl] + x_dt[sl] * B[sl]
        outs.append((st * Cm[sl]).sum(-1))  # (n, H, P)
        s = st if n == plan.n_seqs else mx.concatenate([st, s[n:]])
    # written back slot by slot (a slice update: delta_net.py measured MLX's scatter far slower)
    for i, slot in enumerate(plan.slot_list):
        state[slot] = s[i]
    y = outs[0] if len(outs) == 1 else mx.concatenate(outs)
    if plan.perm is not None:
        y = y[plan.perm]
    # 3. y + x D, times SiLU(z), the grouped RMSNorm times its weight
    y = (y + x * ly.ssm_d[:, None]).reshape(T, inner) * _silu(proj[:, :inner])
    return mx.fast.rms_norm(y.reshape(T, G, inner // G), None, eps).reshape(T, inner) * ly.ssm_norm
