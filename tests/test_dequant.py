"""Dequantization kernels against gguf.quants (bit-exact) and numpy."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from numba import njit

from helpers.quant_blocks import F16_FIELDS, random_blocks
from infer.quant import types as qt
from infer.quant.dequant import dequant_row, dequant_rows, dequantize

QUANT_TYPES = sorted(F16_FIELDS)
ALL_TYPES = [qt.F32, qt.F16, qt.BF16, *QUANT_TYPES]



def row_length(type_id: int, blocks: int) -> int:
    return qt.qtype(type_id).block_size * blocks


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal float32 bit patterns (so -0.0 != 0.0 and NaN payloads count)."""
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@njit
def _rows_via_dequant_row(type_id, src, dst):
    # the way the matmul kernels call it: from njit code, one row at a time
    for r in range(src.shape[0]):
        dequant_row(type_id, src[r], dst[r])


@pytest.mark.parametrize("type_id", QUANT_TYPES, ids=lambda t: qt.qtype(t).name)
@pytest.mark.parametrize("blocks", [1, 3, 20])
def test_quant_types_match_gguf(type_id, blocks):
    n = row_length(type_id, blocks)
    raw = random_blocks(type_id, rows=7, n=n, seed=blocks)
    with np.errstate(over="ignore"):  # MXFP4's largest exponents overflow to inf, in ggml too
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id))
    assert want.shape == (7, n)

    assert_same_bits(dequantize(raw, type_id, (7, n)), want)

    out = np.full((7, n), 123.0, dtype=np.float32)
    _rows_via_dequant_row(type_id, raw, out)
    assert_same_bits(out, want)


@pytest.mark.parametrize("type_id", QUANT_TYPES, ids=lambda t: qt.qtype(t).name)
def test_quant_all_byte_values(type_id):
    """Many rows so every quant byte value and scale bit pattern shows up."""
    n = row_length(type_id, 4)
    raw = random_blocks(type_id, rows=300, n=n, seed=99)
    with np.errstate(over="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id))
    assert_same_bits(dequantize(raw, type_id, (300, n)), want)


def _llama_cpp_to_float(type_id: int):
    """llama.cpp's own dequantizer of a type (ggml_get_type_traits(type)->to_float), from the ggml
    library llama-cpp-python ships."""
    import ctypes
    import os

    llama_cpp = pytest.importorskip("llama_cpp")
    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    if not os.path.exists(path):
        pytest.skip("llama-cpp-python ships no libggml-base.so")
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    class Traits(ctypes.Structure):  # ggml.h's struct ggml_type_traits
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", to_float_t), ("from_float_ref", ctypes.c_void_p)]

    lib = ctypes.CDLL(path)
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    traits = lib.ggml_get_type_traits(type_id).contents
    assert traits.type_name.decode() == qt.qtype(type_id).name.lower()

    def run(raw: np.ndarray, n: int) -> np.ndarray:
        raw = np.ascontiguousarray(raw)
        out = np.empty(raw.size // qt.qtype(type_id).type_size * qt.qtype(type_id).block_size, np.float32)
        traits.to_float(raw.ctypes.data, out.ctypes.data, out.size)
        return out.reshape(-1, n)

    return run


@pytest.mark.reference
def test_mxfp4_matches_llama_cpp():
    """MXFP4 against llama.cpp's dequantize_row_mxfp4: every exponent byte (subnormal 2**-128 and
    2**-127, 255 as 2**127, overflowing to inf) under every code."""
    ref = _llama_cpp_to_float(qt.MXFP4)
    rng = np.random.default_rng(39)
    raw = random_blocks(qt.MXFP4, rows=256, n=32 * 8, seed=39).reshape(256, 8, 17)
    raw[:, 0, 0] = np.arange(256)  # each exponent once per row's first block ...
    raw[:, 0, 1:] = np.arange(16, dtype=np.uint8) | ((15 - np.arange(16, dtype=np.uint8)) << 4)  # ... with every code
    raw = raw.reshape(256, -1)
    want = ref(raw, 256)
    assert_same_bits(dequantize(raw, qt.MXFP4, (256, 256)), want)
    assert np.isinf(want[255]).any() and (want[0, :32] != 0).sum() == 28  # 2**127 * 12, subnormal weights
    big = rng.integers(0, 256, size=(64, 17 * 40), dtype=np.uint8)
    assert_same_bits(dequantize(big, qt.MXFP4, (64, 32 * 40)), ref(big, 32 * 40))


def test_f32():
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(5, 4 * 48), dtype=np.uint8)  # any bits, NaNs included
    want = raw.view("<f4")
    assert_same_bits(dequantize(raw, qt.F32, (5, 48)), want.astype(np.float32))


def test_f16():
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=(4, 2 * 96), dtype=np.uint8)
    raw[0, :] = np.arange(96, dtype="<u2").view(np.uint8)  # subnormals
    raw[1, :] = np.array([0x7C00, 0xFC00, 0x7BFF, 0x8001] * 24, dtype="<u2").view(np.uint8)  # inf, max, -tiny
    want = raw.view("<f2").astype(np.float32)
    assert_same_bits(dequantize(raw, qt.F16, (4, 96)), want)
    assert_same_bits(dequantize(raw, qt.F16, (4, 96)), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.F16))


def test_f16_every_bit_pattern():
    raw = np.arange(65536, dtype="<u2").view(np.uint8).reshape(64, 2048)
    want = raw.view("<f2").astype(np.float32)
    assert_same_bits(dequantize(raw, qt.F16, (64, 1024)), want)  # NaN payloads as numpy converts them


def test_bf16():
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, size=(6, 2 * 64), dtype=np.uint8)
    want = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    assert_same_bits(dequantize(raw, qt.BF16, (6, 64)), want)
    assert_same_bits(dequantize(raw, qt.BF16, (6, 64)), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.BF16))


@pytest.mark.parametrize("type_id", ALL_TYPES, ids=lambda t: qt.qtype(t).name)
def test_dequant_row_from_python_and_shapes(type_id):
    t = qt.qtype(type_id)
    n = 512  # a multiple of every block size
    raw = random_blocks(type_id, rows=6, n=n, seed=5)
    whole = dequantize(raw, type_id, (6, n))

    # one row, called directly
    dst = np.empty(n, dtype=np.float32)
    dequant_row(type_id, raw[4], dst)
    assert_same_bits(dst, whole[4])

    # dequant_rows on a caller's buffer
    out = np.empty((6, n), dtype=np.float32)
    dequant_rows(type_id, raw, out)
    assert_same_bits(out, whole)

    # N-d result shape, raw bytes flat or in another shape
    assert_same_bits(dequantize(raw.reshape(-1), type_id, (2, 3, n)), whole.reshape(2, 3, n))
    assert_same_bits(dequantize(raw.reshape(3, -1), type_id, (2, 3, n)), whole.reshape(2, 3, n))
    assert dequantize(raw[:1], type_id, (n,)).shape == (n,)
    assert t.type_size * (n // t.block_size) == raw.shape[1]


def test_raw_of_another_dtype():
    x = np.random.default_rng(4).standard_normal((3, 32)).astype(np.float32)
    assert_same_bits(dequantize(x, qt.F32, (3, 32)), x)


def test_empty_tensor():
    raw = np.zeros(0, dtype=np.uint8)
    assert dequantize(raw, qt.Q8_0, (0, 64)).shape == (0, 64)
    assert dequantize(raw, qt.Q4_K, (3, 0)).shape == (3, 0)


def test_wrong_byte_count():
    raw = random_blocks(qt.Q8_0, rows=4, n=64)  # 4 rows x 68 bytes
    with pytest.raises(ValueError, match=r"Q8_0 tensor of shape \(4, 64\) needs 272 bytes \(4 rows x 68 bytes\), got 271"):
        dequantize(raw.reshape(-1)[:-1], qt.Q8_0, (4, 64))
    with pytest.raises(ValueError, match="needs 340 bytes"):
        dequantize(raw, qt.Q8_0, (5, 64))


def test_row_not_a_multiple_of_the_block():
    raw = np.zeros(144, dtype=np.uint8)
    with pytest.raises(ValueError, match="row length 128 .* not a multiple of Q4_K's block size 256"):
        dequantize(raw, qt.Q4_K, (1, 128))


def test_unknown_type():
    with pytest.raises(qt.UnsupportedQuantType, match="unsupported tensor type 99"):
        dequantize(np.zeros(16, dtype=np.uint8), 99, (1, 16))
    dst = np.zeros(8, dtype=np.float32)
    dequant_row(99, np.zeros(16, dtype=np.uint8), dst)  # njit path: NaN, no raise
    assert np.isnan(dst).all()


@pytest.mark.parametrize("type_id", [qt.Q8_0, qt.Q4_K, qt.F16], ids=lambda t: qt.qtype(t).name)
def test_dequant_row_short_source_stays_in_bounds(type_id):
    t = qt.qtype(type_id)
    n = row_length(type_id, 4)
    raw = random_blocks(type_id, rows=1, n=n)[0]
    full = dequantize(raw, type_id, (n,))
    cut = 2 * t.type_size + 1  # two whole blocks and a stray byte
    dst = np.full(n, 7.0, dtype=np.float32)
    dequant_row(type_id, raw[:cut].copy(), dst)
    done = 2 * t.block_size
    assert_same_bits(dst[:done], full[:done])
    assert (dst[done:] == 7.0).all()
