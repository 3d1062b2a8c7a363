"""The CPU matmul for every GGML type against dequantize-then-multiply with llama.cpp's activation rounding:
the repacked int8 path the model runs, and the reference path qmatmul takes for raw tensors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from infer.backends.cpu.matmul import MatmulWorkspace, qmatmul
from infer.backends.cpu.matmul import round_activations
from infer.backends.cpu.repack import ACT_NONE, ACT_ROUNDING, pack_stacked
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
    xr = x.copy()
    if ACT_ROUNDING[int(qtype)] != ACT_NONE:
        round_activations(ACT_ROUNDING[int(qtype)], x, xr)
    ref = xr.astype(np.float64) @ w.dequantize().astype(np.float64).T
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
