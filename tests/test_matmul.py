"""The CPU matmul for every GGML type against dequantize-then-multiply with llama.cpp's activation rounding:
the repacked int8 path the model runs, and the reference path qmatmul takes for raw tensors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from infer.backends.cpu.matmul import MatmulWorkspace, qmatmul
from infer.backends.cpu.matmul import round_activations
from infer.backends.cpu.repack import ACT_NONE, ACT_ROUNDING, GROUP, pack_stacked
from infer.backends.cpu.target import VNNI
from infer.quant.tensor import QTensor
from tiny_models import _tensor

TYPES = [GT.F32, GT.F16, GT.BF16, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0,
         GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K]


def _weight(qtype: GT, rows: int, n: int, seed: int) -> QTensor:
    data, qt = _tensor(np.random.default_rng(seed), (rows, n), qtype)
    raw = np.ascontiguousarray(data).view(np.uint8)
    return QTensor.from_bytes(int(qt), (rows, n), raw.reshape(-1))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("repacked", [True, False], ids=["packed", "raw"])
def test_qmatmul_matches_reference(qtype, T, repacked):
    rows, n = 192, 512
    w = _weight(qtype, rows, n, seed=int(qtype) * 7 + T)
    x = np.random.default_rng(T).normal(0, 1, size=(T, n)).astype(np.float32)
    out = np.zeros((T, rows), np.float32)
    # float types are never repacked: both ids run the raw path for them
    qmatmul((pack_stacked((w,)) or w) if repacked else w, x, out, MatmulWorkspace(32, n, rows * n, 4))
    ref = _reference(qtype, w, x)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def _reference(qtype, w, x):
    """x (rounded as llama.cpp rounds it for the type) @ W.T in float64."""
    xr = x.copy()
    if ACT_ROUNDING[int(qtype)] != ACT_NONE:
        round_activations(ACT_ROUNDING[int(qtype)], x, xr)
    return xr.astype(np.float64) @ w.dequantize().astype(np.float64).T


REPACKED = [t for t in TYPES if int(t) in GROUP]


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 4, 8, 13])
def test_vnni_layout_bit_identical(qtype, T):
    """Both packed layouts on every repackable type: the portable one, and where the CPU has
    AVX-512 VNNI, the integer-dot kernel's, which must give the very same floats."""
    rows, n = 192, 512
    w = _weight(qtype, rows, n, seed=int(qtype) * 11 + T)
    x = np.random.default_rng(100 + T).normal(0, 1, size=(T, n)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (zero scale, zero quants)
    ws = MatmulWorkspace(32, n, rows * n, 4)
    ref = _reference(qtype, w, x)
    outs = []
    for vnni in ([False, True] if VNNI else [False]):
        p = pack_stacked((w,), vnni=vnni)
        assert p.vnni == vnni
        out = np.zeros((T, rows), np.float32)
        qmatmul(p, x, out, ws)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
        outs.append(out)
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_no_vnni_env(monkeypatch):
    """INFER_NO_VNNI=1 at pack time selects the portable layout."""
    w = _weight(GT.Q8_0, 64, 256, seed=1)
    monkeypatch.setenv("INFER_NO_VNNI", "1")
    assert not pack_stacked((w,)).vnni
    monkeypatch.delenv("INFER_NO_VNNI")
    assert pack_stacked((w,)).vnni == VNNI
