"""Quantizers against llama.cpp's own ggml_quantize_chunk (byte equality), with and without an
importance matrix, plus the NaN error and a round trip through our dequantizer."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from infer.quant import types as qt
from infer.quant.dequant import dequantize
from infer.quant.quantizers import QUANTIZE_TYPES, quantize

BLOCK_TYPES = sorted(t for t in QUANTIZE_TYPES if qt.QTYPES[t].block_size > 1)


def _load_ggml():
    llama_cpp = pytest.importorskip("llama_cpp")
    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    if not os.path.exists(path):
        pytest.skip("llama-cpp-python ships no libggml-base.so")
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    return lib


@pytest.fixture(scope="module")
def ggml():
    lib = _load_ggml()

    def run(type_id: int, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, k = x.shape
        out = np.zeros((rows, lib.ggml_row_size(type_id, k)), dtype=np.uint8)
        im = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        lib.ggml_quantize_init(type_id)
        n = lib.ggml_quantize_chunk(type_id, x.ctypes.data, out.ctypes.data, 0, rows, k,
                                    None if im is None else im.ctypes.data)
        assert n == out.size
        return out

    return run


def mixed_rows(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """Rows from several distributions, with all-zero and constant 32-blocks sprinkled in."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    kind = np.arange(rows) % 8
    x[kind == 1] *= np.float32(1e-8)  # tiny: f16 scales underflow to subnormal or zero
    x[kind == 2] = rng.standard_t(1.5, (int(np.sum(kind == 2)), k))  # heavy tails / outliers
    x[kind == 3] = np.abs(x[kind == 3])  # all positive: min clamps to 0
    x[kind == 4] = rng.integers(-3, 4, (int(np.sum(kind == 4)), k))  # exact ties in rounding
    x[kind == 5] = -np.abs(x[kind == 5]) + 3
    x[kind == 6] = 0.0
    x[kind == 7, 5] = 80.0  # one outlier in an otherwise normal row
    blocks = x.reshape(rows, k // 32, 32)
    blocks[rng.random((rows, k // 32)) < 0.05] = 0.0
    blocks[rng.random((rows, k // 32)) < 0.05] = 0.25
    return x.astype(np.float32)


def imatrices(rng: np.random.Generator, k: int) -> list[np.ndarray | None]:
    sparse = rng.uniform(0.0, 5.0, k).astype(np.float32)
    sparse[rng.random(k) < 0.2] = 0.0  # unused columns have zero importance
    return [None, rng.uniform(0.01, 10.0, k).astype(np.float32), sparse]


def assert_rows_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    bad = np.nonzero((ours != theirs).any(axis=1))[0]
    assert ours.shape == theirs.shape
    assert bad.size == 0, f"{bad.size} rows differ, first {bad[:5].tolist()}"


@pytest.mark.reference
@pytest.mark.parametrize("type_id", BLOCK_TYPES, ids=lambda t: qt.QTYPES[t].name)
def test_block_types_match_llama_cpp(ggml, type_id):
    rng = np.random.default_rng(type_id)
    sizes = [256, 512] if qt.QTYPES[type_id].block_size == qt.QK_K else [32, 96, 256, 512]
    for k in sizes:
        x = mixed_rows(rng, 400, k)
        for imatrix in imatrices(rng, k):
            assert_rows_equal(quantize(type_id, x, imatrix), ggml(type_id, x, imatrix))


@pytest.mark.reference
def test_mxfp4_exponent_edges_match_llama_cpp(ggml):
    """MXFP4's exponent is floorf(log2f(amax)) - 2 + 127 as a uint8: blocks whose amax is each
    power of two from the subnormals (where the uint8 wraps) to 2**127, the 100 floats below it
    (where log2f rounds up to the integer) and 5 above; and halfway ties between code values."""
    rng = np.random.default_rng(39)
    amax = []
    for k in range(-149, 128):
        p = np.float32(np.ldexp(1.0, k))
        below, above = [p], [p]
        for _ in range(99):
            below.append(np.nextafter(below[-1], np.float32(0)))
        for _ in range(5):
            above.append(np.nextafter(above[-1], np.float32(np.inf)))
        amax += below + above[1:]
    amax = np.array([a for a in amax if 0 < a < np.inf], np.float32)
    x = amax[:, None] * rng.uniform(-1, 1, (len(amax), 32)).astype(np.float32)
    x[:, 0] = np.where(np.arange(len(amax)) % 2, amax, -amax)
    assert_rows_equal(quantize(qt.MXFP4, x), ggml(qt.MXFP4, x))
    d = np.ldexp(np.float32(1), rng.integers(-20, 10, (2000, 1))).astype(np.float32)  # 2**(e - 128)
    ties = rng.integers(-24, 25, (2000, 32)).astype(np.float32) * np.float32(0.5) * d
    assert_rows_equal(quantize(qt.MXFP4, ties), ggml(qt.MXFP4, ties))


@pytest.mark.reference
@pytest.mark.parametrize("type_id", [qt.F32, qt.F16, qt.BF16], ids=lambda t: qt.QTYPES[t].name)
def test_float_types_match_ggml_on_every_kind_of_bits(ggml, type_id):
    rng = np.random.default_rng(7)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 65504, 65519.99, 65520, -0.0, 6e-8, 2.98e-8,
                        1e-45, 3.4e38, 1.00048828125], dtype=np.float32)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([special, bits, np.zeros(3, np.float32)])[None, :]
    ours = quantize(type_id, x)
    assert_rows_equal(ours, ggml(type_id, x))
    if type_id == qt.F16:  # also the plain numpy rounding, away from NaN payloads
        finite = np.isfinite(x)
        with np.errstate(over="ignore"):  # values past 65504 become inf, as they should
            assert np.array_equal(ours.view(np.float16)[finite], x[finite].astype(np.float16))


def test_imatrix_is_ignored_by_q8_0_but_not_by_q4_k():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    imatrix = rng.uniform(0.1, 3.0, 256).astype(np.float32)
    assert np.array_equal(quantize(qt.Q8_0, x, imatrix), quantize(qt.Q8_0, x))
    assert not np.array_equal(quantize(qt.Q4_K, x, imatrix), quantize(qt.Q4_K, x))


@pytest.mark.parametrize("type_id", BLOCK_TYPES, ids=lambda t: qt.QTYPES[t].name)
def test_round_trip_error_is_small(type_id):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    back = dequantize(quantize(type_id, x), type_id, x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x ** 2))
    bits = {qt.Q4_0: 4, qt.Q4_1: 4, qt.Q4_K: 4, qt.Q5_0: 5, qt.Q5_1: 5, qt.Q5_K: 5, qt.Q6_K: 6, qt.Q8_0: 8,
            qt.MXFP4: 4}
    assert rel < 2.0 ** -bits[type_id] * 2.5, rel  # about the step of a b-bit grid over a normal block


@pytest.mark.parametrize("type_id", BLOCK_TYPES, ids=lambda t: qt.QTYPES[t].name)
def test_non_finite_input_is_an_error(type_id):
    x = np.ones((3, 256), dtype=np.float32)
    x[2, 100] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        quantize(type_id, x)
    x[2, 100] = -np.inf
    with pytest.raises(ValueError, match="non-finite"):
        quantize(type_id, x)


def test_scale_overflowing_f16_is_an_error():
    x = np.full((1, 32), -1e6, dtype=np.float32)  # Q4_1's block minimum does not fit an f16
    with pytest.raises(ValueError, match="non-finite"):
        quantize(qt.Q4_1, x)


def test_bad_shapes_and_types():
    with pytest.raises(ValueError, match="multiple"):
        quantize(qt.Q4_K, np.zeros((2, 96), np.float32))
    with pytest.raises(qt.UnsupportedQuantType):
        quantize(qt.Q3_K, np.zeros((2, 256), np.float32))
    with pytest.raises(qt.UnsupportedQuantType):
        quantize(999, np.zeros((2, 256), np.float32))
    with pytest.raises(ValueError, match="importance"):
        quantize(qt.Q4_K, np.zeros((2, 256), np.float32), np.ones(128, np.float32))
    out = quantize(qt.Q8_0, np.zeros((0, 64), np.float64))
    assert out.shape == (0, 68) and out.dtype == np.uint8


@pytest.mark.reference
def test_converts_input_dtype_and_layout(ggml):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((512, 16))  # float64, transposed below: not C-contiguous
    want = ggml(qt.Q6_K, x.T.astype(np.float32))
    assert_rows_equal(quantize(qt.Q6_K, x.T), want)
    assert quantize(qt.Q6_K, x.T).shape == (16, qt.row_bytes(qt.Q6_K, 512))


@pytest.mark.reference
@pytest.mark.parametrize("type_id", [qt.Q4_K, qt.Q6_K, qt.MXFP4], ids=lambda t: qt.QTYPES[t].name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=arrays(np.float32, (2, 256), elements=st.floats(-1e4, 1e4, width=32)),
    weights=st.one_of(st.none(), arrays(np.float32, (256,), elements=st.floats(0, 100, width=32))),
)
def test_hypothesis_matches_llama_cpp(ggml, type_id, data, weights):
    assert_rows_equal(quantize(type_id, data, weights), ggml(type_id, data, weights))
