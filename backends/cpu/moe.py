"""Mixture-of-experts kernels: the router's choice and weights (softmax or sigmoid gating, with
DeepSeek-V3's selection bias where a layer has one), the batch's tokens grouped by
expert, and the weighted sum, each with the arithmetic of llama.cpp's build_moe_ffn.

The experts' products run between these on the grouped rows, one product per expert used by the
batch, so a prefill or a batch of decode streams reads each used expert once: experts_ffn runs
them all in one compiled loop where every expert is packed alike (repack.PackedExperts), else
primitives.py does it expert by expert (a few tens of microseconds of calls per expert, which
a batch of decode streams, touching ~50 experts per layer, would pay on every layer).
Every row's result is computed as it would be alone: the products are row-independent, the
grouping only changes which rows share a call.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .glu import glu
from .qdot import matmul_packed


@njit(cache=True)
def _softmax(x, out):
    # x, out: (n,) f32 (may alias): ggml_soft_max, exp(x - max) summed in double, times the f32 of 1/sum
    mx = x[0]
    for e in range(1, x.shape[0]):
        mx = max(mx, x[e])
    total = 0.0
    for e in range(x.shape[0]):
        out[e] = np.float32(math.exp(np.float32(x[e] - mx)))
        total += out[e]
    inv = np.float32(1.0 / total)
    for e in range(x.shape[0]):
        out[e] = out[e] * inv


# The router's gating (Architecture.moe_gating), as route takes it (llama.cpp's
# LLAMA_EXPERT_GATING_FUNC_TYPE_*): a softmax over all experts; the top logits, then a softmax over
# those alone (gpt-oss); a sigmoid of each logit (LFM2-MoE); the top logits, weighted by their
# sigmoids (llama4: llama.cpp chooses by the logits, where saturated sigmoids could tie)
GATING = {"softmax": 0, "softmax_weight": 1, "sigmoid": 2, "sigmoid_logits": 3}


@njit(cache=True)
def route(logits, k, norm, scale, gating, select_bias, sel, w, p):
    # logits: (T, E) f32, the router's product (its bias added); p: (E,) f32 scratch
    # gating: GATING's code; select_bias: (E,) f32 added to the probabilities for the choice only
    # (llama.cpp's exp_probs_b, DeepSeek-V3's selection bias), or (0,)
    # sel: (T, k) int32 out, the k experts of each token, highest first (ggml_argsort_top_k)
    # w: (T, k) f32 out: their probabilities (softmax over all experts, or sigmoid), or for
    # SOFTMAX_WEIGHT the softmax of their k logits alone; renormalized to sum 1 if norm (ggml: the
    # f32 sum clamped at 2^-14, then divided), then times scale unless it is 1 (ggml_scale: GLM's
    # routed_scaling_factor)
    T, E = logits.shape
    biased = select_bias.shape[0] > 0
    for t in range(T):
        if gating == 1:
            p[:] = logits[t]
        elif gating >= 2:
            for e in range(E):  # ggml_vec_sigmoid_f32
                p[e] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-logits[t, e])))
        else:
            _softmax(logits[t], p)
        for j in range(k):
            best = -1
            best_score = np.float32(0.0)
            for e in range(E):
                taken = False
                for i in range(j):
                    if sel[t, i] == e:
                        taken = True
                if taken:
                    continue
                if gating == 3:
                    score = logits[t, e]
                elif biased:
                    score = p[e] + select_bias[e]  # f32, as ggml_add's
                else:
                    score = p[e]
                if best < 0 or score > best_score:
                    best, best_score = e, score
            sel[t, j] = best
            w[t, j] = p[best]
        if gating == 1:
            _softmax(w[t], w[t])
        if norm:
            s = 0.0
            for j in range(k):
                s += w[t, j]
            sf = max(np.float32(s), np.float32(6.103515625e-5))
            for j in range(k):
                w[t, j] = w[t, j] / sf
        if scale != 1.0:
            for j in range(k):
                w[t, j] = w[t, j] * np.float32(scale)


@njit(cache=True)
def group(sel, starts, order, fill):
    # sel: (T, k) int32 experts; starts: (E + 1,) int32 out; order: (T * k,) int32 out: the slots
    # t * k + j routed to expert e are order[starts[e]:starts[e + 1]], tokens in order; fill: (E,) int32 scratch
    T, k = sel.shape
    E = starts.shape[0] - 1
    starts[:] = 0
    for t in range(T):
        for j in range(k):
            starts[sel[t, j] + 1] += 1
    for e in range(E):
        starts[e + 1] += starts[e]
    fill[:] = starts[:E]
    for t in range(T):
        for j in range(k):
            e = sel[t, j]
            order[fill[e]] = t * k + j
            fill[e] += 1


@njit(cache=True)
def gather_tokens(h, slots, k, out):
    # h: (T, D) f32; slots: (n,) int32 of t * k + j; out: (>= n, D) f32, row i = h[slots[i] // k]
    for i in range(slots.shape[0]):
        out[i] = h[slots[i] // k]


@njit(cache=True)
def scatter_slots(y, slots, out):
    # y: (>= n, D) f32 an expert's outputs; out: (T * k, D) f32, row slots[i] = y[i]
    for i in range(slots.shape[0]):
        out[slots[i]] = y[i]


@njit(cache=True)
def combine(y, w, out):
    # y: (T * k, D) f32, slot t * k + j: expert j's output for token t; w: (T, k) f32;
    # out: (T, D) f32 = ((y0 * w0 + y1 * w1) + y2 * w2) + ..., each product rounded first
    # (llama.cpp: ggml_mul by the weights, then the slots added in order)
    T, k = w.shape
    for t in range(T):
        for i in range(out.shape[1]):
            acc = y[t * k, i] * w[t, 0]
            for j in range(1, k):
                acc = acc + y[t * k + j, i] * w[t, j]
            out[t, i] = acc


@njit(cache=True)
def weigh_inputs(h, w, out):
    # h: (T, D) f32; w: (T, k) f32; out: (T * k, D) f32, slot t * k + j = h[t] * w[t, j]: each chosen
    # expert's input (llama4's weight before the FFN: ggml_mul of the repeated rows by the weights)
    T, k = w.shape
    for t in range(T):
        for j in range(k):
            out[t * k + j] = h[t] * w[t, j]


@njit(cache=True)
def add_row(y, b):
    # y: (n, N) f32 += b: (N,) f32 on every row; b (0,): nothing (an expert without biases)
    if b.shape[0]:
        for i in range(y.shape[0]):
            for j in range(y.shape[1]):
                y[i, j] += b[j]


@njit(cache=True)
def experts_ffn(h, order, starts, k, act_kind, g, g_info, d, d_info, gu_bias, down_bias, xq, dxb, bsum, acc, expanded,
                x, gu, act, y, slots):
    # h: (T, D) f32 the FFN input; order, starts: the grouping (group); k: experts per token
    # act_kind: the gate activation (glu.glu); gu_bias: (E, 2F) f32 gate|up biases, down_bias: (E, D), or (0, 0)
    # g, d: (lo, hi, s, m, sc) planes of the gate_up and down PackedExperts, expert axis first;
    # g_info, d_info: (StaticType, activation rounding, rows N, lo_bits, hi_bits, group) of each
    # xq, dxb, bsum, acc, expanded: matmul_packed's scratch (MatmulWorkspace)
    # x: (>= T, D), gu: (>= T, 2F), act: (>= T, F), y: (>= T, D) f32 scratch for one expert's rows
    # slots: (T * k, D) f32 out, slot t * k + j: the output of token t's j-th expert
    # Each used expert as primitives.py would run it: gather, gate_up, GLU, down, scatter.
    E = starts.shape[0] - 1
    F = act.shape[1]
    for e in range(E):
        n = starts[e + 1] - starts[e]
        if n == 0:
            continue
        sl = order[starts[e]:starts[e + 1]]
        gather_tokens(h, sl, k, x)
        matmul_packed(g_info[0], g_info[1], x[:n], g[0][e], g[1][e], g[2][e], g[3][e], g[4][e], g_info[2], xq, dxb,
                      bsum, gu[:n], 0, acc, g_info[3], g_info[4], g_info[5], expanded)
        if gu_bias.shape[0]:
            add_row(gu[:n], gu_bias[e])
        glu(gu[:n], F, act_kind, act[:n])
        matmul_packed(d_info[0], d_info[1], act[:n], d[0][e], d[1][e], d[2][e], d[3][e], d[4][e], d_info[2], xq, dxb,
                      bsum, y[:n], 0, acc, d_info[3], d_info[4], d_info[5], expanded)
        if down_bias.shape[0]:
            add_row(y[:n], down_bias[e])
        scatter_slots(y[:n], sl, slots)


@njit(cache=True)
def add_gated(o, y, g):
    # o: (T, D) f32 += y * sigmoid(g): y (T, D) f32 the shared expert's output, g (T, 1) f32 its
    # gate's logit (ggml: sigmoid as 1 / (1 + expf(-x)), the product rounded, then the add)
    for t in range(o.shape[0]):
        s = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-g[t, 0])))
        for i in range(o.shape[1]):
            o[t, i] = o[t, i] + np.float32(y[t, i] * s)
