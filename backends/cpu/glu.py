"""The FFN's gated activations, act(gate) * up, with ggml's arithmetic.

SiLU is what llama.cpp's CPU backend runs (ggml_vec_swiglu_f32): its vector SiLU (ggml_v_silu,
x / (1 + ggml_v_expf(-x)), see vexp.py) over every whole 16 of a row, and x / (1 + expf(-x)) on
the rest.  GELU is ggml's f16 table; swiglu_oai is ggml_swiglu_oai's float arithmetic.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from infer.quant.halves import F16_TO_F32, f32_to_f16

from .elementwise import f16_round
from .vexp import expf_row, fma32

_EXP_WIDTH = 16  # ggml_vec_swiglu_f32's vector: the tail of a row past its last whole 16 takes expf
_ONE = np.float32(1.0)


@njit(cache=True, inline="always", error_model="numpy")
def _swiglu_row(gate, up, out):
    # gate, up, out: (F,) f32; out = silu(gate) * up as ggml_vec_swiglu_f32
    # (slices indexed from 0 by the loops: no negative-index checks; IEEE division, error_model
    # "numpy", no zero check: so the loops vectorize)
    F = gate.shape[0]
    V = F - F % _EXP_WIDTH
    e = out[:V]
    expf_row(gate[:V], True, np.float32(0.0), e)  # exp(-g)
    for i in range(V):
        out[i] = gate[i] / (_ONE + e[i]) * up[i]
    for i in range(V, F):
        g = gate[i]
        out[i] = g / (_ONE + np.float32(math.exp(-g))) * up[i]


@njit(cache=True)
def _gelu_f16_formula(h):
    # ggml's tanh GELU of an f16 value h, as float32, rounded to f16 (one entry of its table);
    # no fastmath, so the table does not depend on how this compiles (the sign of zeros included).
    # llama.cpp's compiled ggml_gelu_f32 fuses 1 + (GELU_COEF_A*x)*x into one multiply-add (GCC's
    # -ffp-contract=fast, clang's fmuladd): 2048 of the table's entries depend on it
    inner = fma32(np.float32(0.044715) * h, h, np.float32(1.0))
    return f16_round(np.float32(0.5) * h * (np.float32(1.0) + np.float32(math.tanh(
        np.float32(0.7978845608028654) * h * inner))))


@njit(cache=True)
def _gelu_table(halves, out):
    # halves: (65536,) f32, every f16 value; out: (65536,) f32 GELU of each (NaN/inf entries unused)
    for i in range(halves.shape[0]):
        out[i] = _gelu_f16_formula(halves[i])


# ggml_gelu keeps GELU in a table indexed by the f16 bits of the input; so do we (the formula
# with tanh per element was most of the FFN's time).
GELU_F16 = np.zeros(65536, np.float32)
_gelu_table(F16_TO_F32, GELU_F16)


@njit(cache=True)
def _gelu_slow(g):
    # ggml_gelu for one value: exact outside ±10, else the f16 table at the nearest half of g
    if g <= -10.0:
        return np.float32(0.0)
    if g >= 10.0:
        return g
    return GELU_F16[f32_to_f16(g)]


ACT_SILU, ACT_GELU, ACT_SWIGLU_OAI = 0, 1, 2  # glu's activations (Architecture.activation)
ACT_GELU_UP = 3  # no gate: GELU of the row's first F columns alone (bert's FFN, nomic-bert-moe's experts)
ACTIVATIONS = {"silu": ACT_SILU, "gelu": ACT_GELU, "swiglu_oai": ACT_SWIGLU_OAI}
OAI_ALPHA, OAI_LIMIT = np.float32(1.702), np.float32(7.0)  # gpt-oss's swiglu_oai (llama.cpp's constants)


@njit(cache=True, inline="always", error_model="numpy")
def _glu_row(row, F, act, out):
    # row: (2F,) f32 gate then up; out: (F,) f32 = act(gate) * up
    if act == ACT_GELU_UP:
        for i in range(F):
            out[i] = _gelu_slow(row[i])
    elif act == ACT_SWIGLU_OAI:
        for i in range(F):
            x = min(row[i], OAI_LIMIT)
            y = min(max(row[F + i], -OAI_LIMIT), OAI_LIMIT)
            out[i] = x / (_ONE + np.float32(math.exp(OAI_ALPHA * -x))) * (y + _ONE)
    elif act == ACT_GELU:
        # f16(gelu(f16(g))) from the table, as ggml_gelu.  First every element as if it were a normal
        # half below 10 in magnitude (branch-free, so it vectorizes), then the rare others again.
        bits = row.view(np.uint32)
        for i in range(F):
            b = bits[i]
            a = min(max(b & np.uint32(0x7FFFFFFF), np.uint32(0x38800000)), np.uint32(0x411FFFFF))
            h = ((a + np.uint32(0x0FFF) + ((a >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)) - np.uint32(112 << 10)
            out[i] = GELU_F16[((b >> np.uint32(16)) & np.uint32(0x8000)) | h] * row[F + i]
        for i in range(F):
            a = bits[i] & np.uint32(0x7FFFFFFF)
            if a < np.uint32(0x38800000) or a >= np.uint32(0x41200000):  # tiny, >= 10, inf or NaN
                out[i] = _gelu_slow(row[i]) * row[F + i]
    else:
        _swiglu_row(row[:F], row[F:2 * F], out[:F])


@njit(cache=True, error_model="numpy")
def glu(gu, F, act, out):
    # gu: (T, 2F) f32 C-contiguous, gate then up side by side; out: (T, F) f32 = act(gate) * up
    # act: ACT_SILU, ACT_GELU, or ACT_SWIGLU_OAI: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(up, ±7) + 1)
    # (ggml_swiglu_oai's float arithmetic); ACT_GELU_UP: out = GELU(gu[:, :F]), no gate (the other
    # columns unread).  Serial: for one token, or inside another kernel.
    for t in range(gu.shape[0]):
        _glu_row(gu[t], F, act, out[t])


@njit(cache=True, parallel=True, error_model="numpy")
def glu_rows(gu, F, act, out):
    # glu over a batch, its rows split among the threads
    for t in prange(gu.shape[0]):
        _glu_row(gu[t], F, act, out[t])


@njit(cache=True, error_model="numpy")
def gelu_mul(g, m):
    # g: (T, N) f32 in place = ggml_gelu(g) * m; m: (T, N) f32 (Gemma 4's per-layer gate times its input)
    for t in range(g.shape[0]):
        for i in range(g.shape[1]):
            g[t, i] = _gelu_slow(g[t, i]) * m[t, i]


@njit(cache=True, parallel=True, error_model="numpy")
def gelu_rows(y):
    # y: (T, F) f32 in place = ggml_gelu(y) (an FFN without a gate: bert's), rows split among the threads
    for t in prange(y.shape[0]):
        for i in range(y.shape[1]):
            y[t, i] = _gelu_slow(y[t, i])
