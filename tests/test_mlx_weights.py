"""The MLX backend's weights (backends/mlx/weights.py): GGML blocks mapped onto MLX's packed layout,
the types MLX holds exactly dequantizing identically, MXFP4 as MLX's own mxfp4 bit for bit, and the
re-quantized types within their measured error."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from helpers.quant_blocks import random_blocks
from infer.backends.mlx import weights as mw
from infer.quant import types as qt
from infer.quant.dequant import dequantize
from infer.quant.tensor import QTensor

# Relative RMS error of the re-quantized types on random blocks (measured 0.41%, 1.15%, 2.03%)
REQUANT_BOUND = {qt.Q6_K: 0.005, qt.Q3_K: 0.014, qt.Q2_K: 0.025}


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_is_mlx_layout(bits):
    q = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 128)).astype(np.uint8)
    ones, zeros = mx.ones((3, 4)), mx.zeros((3, 4))
    got = mx.dequantize(mx.array(mw.pack(q, bits)), ones, zeros, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(got), q.astype(np.float32))


@pytest.mark.parametrize("type_id", mw.EXACT_TYPES, ids=lambda t: qt.qtype(t).name)
def test_exact_types_dequantize_identically(type_id):
    t = QTensor.from_bytes(type_id, (48, 512), random_blocks(type_id, 48, 512, seed=3).reshape(-1))
    m = mw.upload(t)
    # equal as numbers (a zero's sign may differ: d*(q-8) vs d*q - 8d)
    np.testing.assert_array_equal(np.array(m.dense()), dequantize(t.raw, type_id, t.shape))


def test_mxfp4_is_mlx_mxfp4():
    """MXFP4 maps onto MLX's mxfp4 mode bit for bit (weights.py): every exponent byte ggml accepts
    (0..254) under every code dequantizes to infer's (= llama.cpp's) weights; MLX's own mxfp4
    quantizer, given those weights, writes the same codes and scales back; the product is the
    float product with them."""
    rng = np.random.default_rng(39)
    raw = random_blocks(qt.MXFP4, 255, 512, seed=39).reshape(255, 16, 17)
    raw[:, :, 0] = rng.integers(0, 255, size=(255, 16))
    raw[:, 0, 0] = np.arange(255)
    raw[:, 0, 1:] = np.arange(16, dtype=np.uint8) | ((15 - np.arange(16, dtype=np.uint8)) << 4)  # every code
    t = QTensor.from_bytes(qt.MXFP4, (255, 512), raw.reshape(-1))
    m = mw.upload(t)
    assert (m.mode, m.bits, m.group_size, m.biases, m.scales.dtype) == ("mxfp4", 4, 32, None, mx.uint8)
    assert m.nbytes == t.nbytes  # 4.25 bits per weight, as the file
    np.testing.assert_array_equal(np.array(m.dense()), dequantize(t.raw, qt.MXFP4, t.shape))  # inf included
    # weights as llama.cpp's quantizer writes them, which MLX's quantizer reproduces
    from infer.quant.quantizers import quantize
    x = rng.normal(0, 0.05, size=(64, 256)).astype(np.float32)
    q = QTensor.from_bytes(qt.MXFP4, (64, 256), quantize(qt.MXFP4, x).reshape(-1))
    w = dequantize(q.raw, qt.MXFP4, q.shape)
    codes, scales = mx.quantize(mx.array(w), group_size=32, bits=4, mode="mxfp4")
    m = mw.upload(q)
    np.testing.assert_array_equal(np.array(codes), np.array(m.w))
    np.testing.assert_array_equal(np.array(scales), np.array(m.scales))
    a = rng.normal(0, 1, size=(5, 256)).astype(np.float32)
    ref = a.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(np.array(m.matmul(mx.array(a))), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert mw.stack([m, m]).mode == "mxfp4" and mw.stack([m, mw.upload(t_q8(q))]) is None


def t_q8(t: QTensor) -> QTensor:
    """t's weights as Q8_0 (another format, which must not stack with mxfp4)."""
    from infer.quant.quantizers import quantize
    return QTensor.from_bytes(qt.Q8_0, t.shape, quantize(qt.Q8_0, t.dequantize()).reshape(-1))


@pytest.mark.parametrize("type_id", sorted(REQUANT_BOUND), ids=lambda t: qt.qtype(t).name)
def test_requantized_types_within_bound(type_id):
    t = QTensor.from_bytes(type_id, (64, 1024), random_blocks(type_id, 64, 1024, seed=4).reshape(-1))
    ref = dequantize(t.raw, type_id, t.shape)
    got = np.array(mw.upload(t).dense())
    err = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
    print(f"{qt.qtype(type_id).name} -> {mw.REQUANT_BITS[type_id]}-bit: relative RMS error {err:.4%}")
    assert err < REQUANT_BOUND[type_id]
