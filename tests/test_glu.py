"""The FFN's gated activations (backends/cpu/glu.py): SiLU as ggml's vector SiLU computes it (its
polynomial exp, vexp.py: a few ulps from float64's, at every magnitude, the tail of a row past its
last whole 16 through expf), the same floats serially, split among threads, and row by row; and the
softmax's exponentials (vexp.softmax_exp) with their sum formed as ggml_vec_soft_max_f32 forms it."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.cpu.glu import ACT_GELU, ACT_SILU, ACT_SWIGLU_OAI, glu, glu_rows
from infer.backends.cpu.vexp import softmax_exp


def _rows(F: int, T: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gate = np.concatenate([rng.normal(0, 4, T * F // 2), rng.uniform(-120, 120, T * F - T * F // 2)])
    rng.shuffle(gate)
    gate[:12] = [0.0, -0.0, 87.0, -87.0, 87.7, -87.7, 88.72, -88.72, 103.9, -103.9, 150.0, -150.0]
    up = rng.normal(0, 1, T * F)
    return np.concatenate([gate.reshape(T, F), up.reshape(T, F)], axis=1).astype(np.float32)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (both finite)."""
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


@pytest.mark.parametrize("F", [64, 8960, 8960 + 7, 5])
def test_silu_within_two_ulps_of_exact(F):
    gu = _rows(F)
    out = np.zeros((gu.shape[0], F), np.float32)
    glu(gu, F, ACT_SILU, out)
    g, u = gu[:, :F].astype(np.float64), gu[:, F:].astype(np.float64)
    with np.errstate(over="ignore"):
        silu = (g / (1.0 + np.exp(-g))).astype(np.float32)  # the activation, rounded once
    ref = (silu * gu[:, F:]).astype(np.float32)  # times up in float32, as ggml
    tiny = np.abs(silu) < 1e-30  # far below a float's normal range: compared absolutely
    # ggml_v_expf is within 1.95 ulps, then 1 + e, the division and the product round: a few ulps
    ulps = _ulps(out[~tiny], ref[~tiny])
    assert ulps.max() <= 6 and np.mean(ulps <= 1) > 0.85
    assert np.all(np.abs(out[tiny]) <= 1e-30 * np.abs(u[tiny]) + 1e-37)
    big = gu[:, :F] > 88  # exp(-g) vanishes beside 1: silu(g) = g exactly
    assert np.array_equal(out[big], (gu[:, :F] * gu[:, F:])[big])


def test_silu_specials():
    F = 16
    gu = np.zeros((1, 2 * F), np.float32)
    gu[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    gu[0, F:] = 1.0
    out = np.zeros((1, F), np.float32)
    glu(gu, F, ACT_SILU, out)
    assert out[0, 0] == np.inf and np.isnan(out[0, 1]) and np.isnan(out[0, 2]) and out[0, 3] == 0.0


@pytest.mark.parametrize("act", [ACT_SILU, ACT_GELU, ACT_SWIGLU_OAI], ids=["silu", "gelu", "swiglu_oai"])
def test_rows_split_among_threads_change_nothing(act):
    F = 8960 + 7
    gu = _rows(F, T=9, seed=3)
    gu[:, :F] /= 10
    one, split = np.zeros((9, F), np.float32), np.zeros((9, F), np.float32)
    glu(gu, F, act, one)
    glu_rows(gu, F, act, split)
    assert np.array_equal(one.view(np.uint32), split.view(np.uint32))
    for t in range(9):  # and each row alone (a decode step) as within the batch
        alone = np.zeros((1, F), np.float32)
        glu(gu[t:t + 1], F, act, alone)
        assert np.array_equal(alone[0].view(np.uint32), one[t].view(np.uint32))


@pytest.mark.parametrize("n", [1, 16, 37, 512])
def test_softmax_exp_within_ulps_and_summed_per_16(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 8, n).astype(np.float32)
    x[: n // 4] -= 90  # some beyond a normal 2**n: exp underflows toward subnormals and 0
    mx = np.float32(x.max())
    e = x.copy()
    total = softmax_exp(e, mx)
    ref = np.exp((x - mx).astype(np.float64)).astype(np.float32)  # of the float32 difference, as ggml
    normal = ref > 1e-37
    assert np.all(_ulps(e[normal], ref[normal]) <= 2)
    assert np.all(np.abs(e[~normal] - ref[~normal]) <= 2e-45 * 4)
    assert e[np.argmax(x)] == 1.0
    # each 16's float32 sum (halves, then halves again), the 16s added in float64
    pad = np.concatenate([e, np.zeros(-n % 16, np.float32)]).reshape(-1, 16)
    h = pad[:, 8:] + pad[:, :8]
    q = h[:, 4:] + h[:, :4]
    assert total == sum(float((r[0] + r[2]) + (r[1] + r[3])) for r in q)


@pytest.mark.slow  # compiles the attention kernels in a subprocess (~20 s)
def test_softmax_sum_is_ggmls_when_attention_compiles_it(tmp_path):
    """softmax_exp compiled first for the attention kernel (a fresh numba cache), then loaded from
    that cache by another process, still sums as ggml does: numba compiles what a parallel loop
    calls with the caller's flags and caches it so, and a fastmath attention kernel had it summing
    in another order (which moved the embedded Gemma's pooled embeddings outside llama.cpp's spread)."""
    import os
    import subprocess
    import sys

    first = """
import numpy as np
from infer.backends.cpu.attention import attention
T, H, D, bs = 8, 2, 64, 16
rng = np.random.default_rng(0)
q = rng.normal(0, 1, (T, H, D)).astype(np.float32)
kv = rng.normal(0, 1, (bs, 1, D)).astype(np.float16).view(np.uint16)
out, scores = np.zeros((T, H, D), np.float32), np.zeros((2, H * T), np.float32)
attention(q, np.zeros((T, H * D // 16), np.float32), kv, kv.copy(), np.zeros((1, 1), np.int32),
          np.zeros(T, np.int32), np.arange(T, dtype=np.int32), np.full(1, T, np.int32), np.zeros(0, np.int32), bs, 0,
          False, np.float32(0.125), np.float32(0), np.zeros(0, np.float32), np.zeros(0, np.float32), 0, out, scores)
"""
    then = """
import numpy as np
from infer.backends.cpu.vexp import softmax_exp
x = np.random.default_rng(16).normal(0, 8, 16).astype(np.float32)
x[:4] -= 90
e = x.copy()
total = softmax_exp(e, np.float32(x.max()))
h = e[8:] + e[:8]
q4 = h[4:] + h[:4]
print(total == float((q4[0] + q4[2]) + (q4[1] + q4[3])))
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    for code in (first, then):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"
