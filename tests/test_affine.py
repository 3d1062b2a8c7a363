"""MLX's affine quantization (quant/affine.py): codes, scales and biases identical to `mx.quantize`,
the packing MLX reads, and the errors a bad bit width, group size or NaN gives."""
from __future__ import annotations

import numpy as np
import pytest

from infer.quant.affine import BITS, GROUP_SIZES, AffineError, dequantize_affine, pack, quantize_affine, unpack

mx = pytest.importorskip("mlx.core")


@pytest.mark.parametrize("bits", BITS)
def test_quantize_affine_is_mx_quantize(bits):
    """Same codes, scales and biases as mx.quantize, for float32 input and for float16/bfloat16 input
    (where MLX keeps scales and biases in the input's dtype); dequantization as mx.dequantize."""
    rng = np.random.default_rng(bits)
    for gs in GROUP_SIZES:
        w = (rng.normal(size=(12, 256)) * rng.uniform(1e-3, 4, size=(12, 1))).astype(np.float32)
        w[0, :gs] = 0.0  # a constant group: scale falls back to eps
        w[1, :gs] = -0.25  # a constant nonzero group
        w[2, :gs] = np.linspace(-1, 0.1, gs)  # the minimum has the larger magnitude: positive scale
        for dtype in ("float32", "float16", "bfloat16"):
            xm = mx.array(w).astype(getattr(mx, dtype))
            q, s, b = mx.quantize(xm, group_size=gs, bits=bits)
            t = quantize_affine(np.array(xm.astype(mx.float32)), bits, gs, scale_dtype=dtype)
            assert t.shape == w.shape and t.packed.dtype == np.uint32
            np.testing.assert_array_equal(t.packed, np.array(q))
            np.testing.assert_array_equal(t.scales, np.array(s.astype(mx.float32)))
            np.testing.assert_array_equal(t.biases, np.array(b.astype(mx.float32)))
            ref = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=gs, bits=bits)
            np.testing.assert_allclose(dequantize_affine(t), np.array(ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", BITS)
def test_pack_layout(bits):
    """Codes round-trip, and MLX reads our packing: dequantizing hand-made codes gives them back."""
    rng = np.random.default_rng(10 + bits)
    codes = rng.integers(0, 1 << bits, size=(5, 128), dtype=np.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (5, 128 * bits // 32)
    np.testing.assert_array_equal(unpack(packed, bits), codes)
    ones = mx.ones((5, 128 // 32))
    got = mx.dequantize(mx.array(packed), ones, mx.zeros((5, 128 // 32)), group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(got), codes.astype(np.float32))


def test_affine_errors():
    x = np.zeros((2, 64), np.float32)
    for kwargs, msg in (({"bits": 7}, "bits"), ({"group_size": 48}, "group size"), ({"group_size": 128}, "groups")):
        with pytest.raises(AffineError, match=msg):
            quantize_affine(x, **{"bits": 4, "group_size": 32, **kwargs})
    with pytest.raises(AffineError, match="NaN"):
        quantize_affine(np.full((1, 32), np.nan, np.float32), 4, 32)
