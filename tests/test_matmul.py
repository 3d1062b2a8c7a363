"""The CPU matmul for every GGML type against dequantize-then-multiply with llama.cpp's activation rounding:
the packed path the model runs, and the reference path qmatmul takes for raw tensors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.tiny_models import random_tensor
from infer.backends.cpu.activations import ACT_NONE, ACT_Q8_1, ACT_ROUNDING, round_activations
from infer.backends.cpu.matmul import MatmulWorkspace, WidenedF16, qmatmul
from infer.backends.cpu.qdot import LAYOUTS, NC
from infer.backends.cpu.repack import pack_stacked
from infer.backends.cpu.target import INT_KERNEL
from infer.quant.tensor import QTensor

TYPES = [GT.F32, GT.F16, GT.BF16, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0,
         GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K, GT.MXFP4]


def random_mxfp4(rng: np.random.Generator, rows: int, n: int, e_range=(112, 134)) -> np.ndarray:
    """(rows, n // 32 * 17) uint8 MXFP4 blocks: random codes under exponents drawn from e_range
    (2**(e - 128): 2**-16 .. 2**5), with f16's extremes (e - 128 = -24 and 15) and blocks of
    zeros under exponent 0 (what llama.cpp writes for them, beyond f16's range) sprinkled in."""
    b = rng.integers(0, 256, size=(rows, n // 32, 17), dtype=np.uint8)
    b[:, :, 0] = rng.integers(*e_range, size=(rows, n // 32))
    pick = rng.random((rows, n // 32))
    b[pick < 0.02, 0] = 104
    b[(pick >= 0.02) & (pick < 0.04), 0] = 143
    zero = pick > 0.95
    b[zero, 0] = 0
    b[zero, 1:] = rng.choice(np.array([0x00, 0x08, 0x80, 0x88], np.uint8), size=(int(zero.sum()), 16))  # +-0 codes
    return b.reshape(rows, -1)


def random_weight(qtype: GT, rows: int, n: int, seed: int) -> QTensor:
    if qtype == GT.MXFP4:
        raw = random_mxfp4(np.random.default_rng(seed), rows, n)
        return QTensor.from_bytes(int(qtype), (rows, n), raw.reshape(-1))
    data, qt = random_tensor(np.random.default_rng(seed), (rows, n), qtype)
    raw = np.ascontiguousarray(data).view(np.uint8)
    return QTensor.from_bytes(int(qt), (rows, n), raw.reshape(-1))


@pytest.mark.parametrize("T", [1, 3, 17])
def test_widened_f16_gives_the_reference_path_floats(T):
    # Gemma 4's per_layer_model_proj, kept F16 by llama.cpp's quantizer, runs widened to f32: the
    # very floats of the F16 reference path, rows past the last quad and a column offset included
    rows, n = 198, 512
    w = random_weight(GT.F16, rows, n, seed=T)
    x = np.random.default_rng(T).normal(0, 3, size=(T, n)).astype(np.float32)
    ref, out = np.full((T, rows + 9), 7.0, np.float32), np.full((T, rows + 9), 7.0, np.float32)
    qmatmul(w, x, ref, MatmulWorkspace(32, n, 4), 5)
    qmatmul(WidenedF16.of(w.raw, w.shape), x, out, MatmulWorkspace(32, n, 4), 5)
    np.testing.assert_array_equal(out, ref)
    assert (out[:, :5] == 7.0).all() and (out[:, 5 + rows:] == 7.0).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("repacked", [True, False], ids=["packed", "raw"])
def test_qmatmul_matches_reference(qtype, T, repacked):
    rows, n = 192, 512
    w = random_weight(qtype, rows, n, seed=int(qtype) * 7 + T)
    x = np.random.default_rng(T).normal(0, 1, size=(T, n)).astype(np.float32)
    out = np.zeros((T, rows), np.float32)
    # float types are never repacked: both ids run the raw path for them
    qmatmul((pack_stacked((w,)) or w) if repacked else w, x, out, MatmulWorkspace(32, n, 4))
    # the raw path (a fallback for tensors the kernels cannot pack) multiplies the rounded
    # activations as they are: without Q8_1's rounded block sums
    ref = reference_product(qtype, w, x, q8_1_sums=repacked)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def reference_product(qtype, w, x, q8_1_sums=True):
    """x (rounded as llama.cpp rounds it for the type) @ W.T in float64; for the types with a min
    (Q4_1, Q5_1: Q8_1 activations) each block's min times the block's f16 sum s = d * sum(q),
    as llama.cpp's vec_dot takes it, instead of times the sum of the rounded activations."""
    mode = ACT_ROUNDING[int(qtype)]
    xr = x.copy()
    if mode != ACT_NONE:
        round_activations(mode, x, xr)
    out = xr.astype(np.float64) @ w.dequantize().astype(np.float64).T
    if mode == ACT_Q8_1 and q8_1_sums:
        blocks = x.reshape(x.shape[0], -1, 32)
        amax = np.abs(blocks).max(-1)
        d_raw = (amax / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(amax[..., None] > 0, np.rint(blocks * (np.float32(127) / amax)[..., None]), 0)
        sum_q = q.sum(-1).astype(np.float32)
        s = (d_raw * sum_q).astype(np.float16).astype(np.float64)  # quantize_row_q8_1's s
        exact = d_raw.astype(np.float16).astype(np.float64) * sum_q  # what the rounded activations sum to
        raw = np.asarray(w.raw).reshape(w.shape[0], -1, 20 if qtype == GT.Q4_1 else 24)
        mins = raw[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # the blocks' m (after d)
        out += (s - exact) @ mins.T
    return out


REPACKED = [t for t in TYPES if int(t) in LAYOUTS]


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 4, 8, 13, 21])
def test_integer_kernel_bit_identical(qtype, T):
    """Both kernels on every repackable type: the portable one, and where the CPU has one (AVX-512
    VNNI, AVX-512BW or AVX2), the integer-dot one, which must give the very same floats."""
    rows, n = 192, 512
    w = random_weight(qtype, rows, n, seed=int(qtype) * 11 + T)
    x = np.random.default_rng(100 + T).normal(0, 1, size=(T, n)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (zero scale, zero quants)
    ws = MatmulWorkspace(32, n, 4)
    ref = reference_product(qtype, w, x)
    outs = []
    for int_kernel in ([False, True] if INT_KERNEL else [False]):
        p = pack_stacked((w,), int_kernel=int_kernel)
        assert p.int_kernel == int_kernel
        out = np.zeros((T, rows), np.float32)
        qmatmul(p, x, out, ws)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
        outs.append(out)
    assert all(np.array_equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_batching_changes_no_result(qtype):
    """Each token's row of a batch is bit-identical to that token alone (decode and prefill
    agree: the 4-token register tile and the 1-token one sum in the same order, and a batch of
    the type's expand_from tokens or more runs on tiles expanded to bytes, a single token on the
    planes; the float types' reference path sums each output in an order fixed by its row alone)."""
    expand_from = LAYOUTS[int(qtype)].expand_from if int(qtype) in LAYOUTS else 0
    rows, n, T = 130, 768, (expand_from or 16) + 5  # a partial last tile
    w = random_weight(qtype, rows, n, seed=int(qtype) * 13)
    x = np.random.default_rng(7).normal(0, 1, size=(T, n)).astype(np.float32)
    ws = MatmulWorkspace(max(T, 32), 2 * n, 4)  # wider than K, as a model's workspace is for most products
    kernels = [False, True] if INT_KERNEL else [False]
    for int_kernel in (kernels if qtype in REPACKED else [None]):
        p = w if int_kernel is None else pack_stacked((w,), int_kernel=int_kernel)
        batch = np.zeros((T, rows), np.float32)
        qmatmul(p, x, batch, ws)
        for t in range(T):
            one = np.zeros((1, rows), np.float32)
            qmatmul(p, x[t:t + 1], one, ws)
            assert np.array_equal(one[0], batch[t])


# Packed at the file's bits per weight: as many bytes as the file (all but Q3_K, whose 1-bit plane
# is half used).
SAME_BYTES = [GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q2_K, GT.Q4_K, GT.Q5_K, GT.Q6_K]


@pytest.mark.parametrize("qtype", SAME_BYTES, ids=lambda t: t.name)
def test_packed_costs_the_file_bytes(qtype):
    w = random_weight(qtype, 128, 512, seed=3)
    assert pack_stacked((w,)).nbytes == w.raw.nbytes


def mxfp4_as_q5_0(raw: np.ndarray) -> np.ndarray:
    """MXFP4 rows (rows, nb * 17) rewritten as the Q5_0 rows (rows, nb * 22) of the same weights:
    d = 2**(e - 128) in f16 (0 for a block of zeros beyond f16's range), q = kvalue + 16."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, 17)
    kv = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int32)
    q = kv[np.concatenate([b[..., 1:] & 15, b[..., 1:] >> 4], axis=-1)] + 16  # (rows, nb, 32) in 0..28
    k = b[..., 0].astype(np.int32) - 128
    assert ((-24 <= k) & (k <= 15) | (q == 16).all(-1)).all()
    d = np.where((-24 <= k) & (k <= 15), np.ldexp(np.float32(1), np.clip(k, -24, 15)), 0).astype(np.float16)
    out = np.zeros((rows, b.shape[1], 22), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(rows, -1, 2)
    qh = ((q >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(-1).astype("<u4")
    out[..., 2:6] = qh.view(np.uint8).reshape(rows, -1, 4)
    out[..., 6:22] = (q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)
    return out.reshape(rows, -1)


@pytest.mark.parametrize("T", [1, 5, LAYOUTS[int(GT.MXFP4)].expand_from + 3])
def test_mxfp4_packs_its_codes_and_agrees_with_q5_0(T):
    """An MXFP4 weight keeps its 4-bit codes (4.5 bits per weight: its exponent byte becomes an f16
    scale) and the kernels map them to its values: the same integer dots and scales, so the same
    floats, as the Q5_0 tensor of its weights (whose dequantization is the MXFP4 one, exactly) --
    decode and prefill (expanded tiles), integer and portable kernels."""
    rows, n = 130, 512
    w = random_weight(GT.MXFP4, rows, n, seed=T)
    q5 = QTensor.from_bytes(int(GT.Q5_0), (rows, n), mxfp4_as_q5_0(w.raw).reshape(-1))
    np.testing.assert_array_equal(q5.dequantize(), w.dequantize())
    x = np.random.default_rng(T).normal(0, 1, size=(T, n)).astype(np.float32)
    ws = MatmulWorkspace(max(T, 32), n, 4)
    for int_kernel in ([False, True] if INT_KERNEL else [False]):
        p, pq = pack_stacked((w,), int_kernel=int_kernel), pack_stacked((q5,), int_kernel=int_kernel)
        # 18 bytes per 32 weights (the file: 17), for each row of whole tiles
        assert p.type_id == int(GT.MXFP4) and p.src == (w,) and p.nbytes == -(-rows // NC) * NC * n // 32 * 18
        np.testing.assert_array_equal(p.s, pq.s)
        out, want = np.zeros((T, rows), np.float32), np.zeros((T, rows), np.float32)
        qmatmul(p, x, out, ws)
        qmatmul(pq, x, want, ws)
        assert np.array_equal(out, want)


def test_mxfp4_beyond_f16_runs_on_the_reference_path():
    """A block of nonzero weights whose scale f16 cannot hold (2**(e - 128) below 2**-24 or above
    2**15) is not packed: the tensor stays raw, for the reference path, with a warning.  (e = 255,
    NaN in the OCP spec and refused by ggml's row validation, is 2**127 to ggml's arithmetic.)"""
    x = np.random.default_rng(0).normal(0, 1, size=(3, 256)).astype(np.float32)
    for e in (103, 144, 255):
        w = random_weight(GT.MXFP4, 64, 256, seed=e)
        w.raw[5, 17 * 3] = e
        w.raw[5, 17 * 3 + 1] = 0x21  # nonzero codes
        with pytest.warns(RuntimeWarning, match="beyond f16's range"):
            assert pack_stacked((w,)) is None
        if e == 255:
            continue  # infinite weights: no product to compare
        out = np.zeros((3, 64), np.float32)
        qmatmul(w, x, out, MatmulWorkspace(32, 256, 4))
        ref = reference_product(GT.MXFP4, w, x)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_portable_kernel_env(monkeypatch):
    """INFER_PORTABLE_KERNEL=1 at pack time selects the portable kernel."""
    w = random_weight(GT.Q8_0, 64, 256, seed=1)
    monkeypatch.setenv("INFER_PORTABLE_KERNEL", "1")
    assert not pack_stacked((w,)).int_kernel
    monkeypatch.delenv("INFER_PORTABLE_KERNEL")
    assert pack_stacked((w,)).int_kernel == INT_KERNEL


def _avx2_build_features() -> str | None:
    """LLVM features of this CPU with every AVX-512 extension (and AVX-VNNI) turned off, or None
    when it has no AVX2: what numba would compile for an AVX2-only CPU."""
    import llvmlite.binding as llvm

    f = llvm.get_host_cpu_features()
    if not f.get("avx2"):
        return None
    off = lambda k: k.startswith(("avx512", "avx10", "amx")) or k == "avxvnni"
    return ",".join(("-" if off(k) else "+") + k for k, v in f.items() if v)


_AVX2_CHECK = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from gguf import GGMLQuantizationType as GT
from infer.backends.cpu.matmul import MatmulWorkspace, WidenedF16, qmatmul
from infer.backends.cpu.repack import pack_stacked
from infer.backends.cpu.target import ISA
from test_matmul import REPACKED, reference_product, random_weight
assert ISA == "AVX2", ISA
for qtype in REPACKED:
    w = random_weight(qtype, 130, 512, seed=int(qtype))
    for T in (1, 5, 21):
        x = np.random.default_rng(T).normal(0, 1, size=(T, 512)).astype(np.float32)
        ref = reference_product(qtype, w, x)
        outs = []
        for int_kernel in (True, False):
            out = np.zeros((T, 130), np.float32)
            qmatmul(pack_stacked((w,), int_kernel=int_kernel), x, out, MatmulWorkspace(32, 512, 4))
            np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
            outs.append(out)
        assert np.array_equal(outs[0], outs[1]), qtype.name
print("ok", ISA)
"""


@pytest.mark.slow  # the kernels compiled for another CPU, in a subprocess
@pytest.mark.skipif(_avx2_build_features() is None, reason="needs a CPU with AVX2")
def test_avx2_kernel_in_an_avx2_build():
    """The AVX2 kernel (vpmaddubsw/vpmaddwd), compiled as for a CPU without AVX-512 (numba's CPU
    name and features set in a subprocess), on every packed type: bit-identical to the portable
    kernel and within rounding of dequantize-then-multiply."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=_avx2_build_features())
    p = subprocess.run([sys.executable, "-c", _AVX2_CHECK, str(Path(__file__).parent)], env=env,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ok AVX2" in p.stdout


def test_f16_round_is_the_nearest_half():
    """ops.f16_round (each Q8_0 activation block's scale, formed on the float's bits), and round_f16
    (arrays: Q and the softmax weights), equal numpy's float32 -> float16 -> float32 on a sweep of
    every exponent and sign (a spaced sample of bit patterns) and on the edges: ties either way,
    the largest half and the first value past it, half subnormals and the smallest normal, zeros,
    infinities, NaN."""
    from numba import njit

    from infer.backends.cpu.elementwise import f16_round, round_f16

    @njit
    def rounded(x, out):
        for i in range(x.shape[0]):
            out[i] = f16_round(x[i])

    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504, 65519.996, 65520, 65536, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 2.0**-24, 2.0**-25,
                      2.0**-25 * 1.0000001, 3 * 2.0**-25, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 0.0, np.inf, np.nan],
                     np.float32)
    x = np.concatenate([bits.view(np.float32), edges, -edges])
    out = np.empty_like(x)
    rounded(x, out)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    in_place = x.copy()
    round_f16(in_place)
    for got in (out, in_place):
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("qtype", [GT.Q8_0, GT.Q5_0, GT.Q4_K, GT.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 5])
def test_mla_heads_in_one_loop_are_qmatmul_head_by_head(qtype, T):
    """MLA's per-head products (attn_k_b's, attn_v_b's) packed alike and run by one parallel loop
    over every head's tiles (mla.heads_matmul) are each head's qmatmul to the bit: the head's input
    columns out of a wider row, its output at its own columns, the columns between them left alone."""
    from infer.backends.cpu.mla import heads_matmul
    from infer.backends.cpu.repack import PackedExperts

    H, N, K, in_stride, out_stride = 3, 64, 256, 256 + 32, 64 + 16
    heads = [random_weight(qtype, N, K, seed=int(qtype) * 5 + h) for h in range(H)]
    packed = PackedExperts.pack([(w,) for w in heads])
    assert packed is not None
    src = np.random.default_rng(3).normal(0, 1, size=(T, H * in_stride)).astype(np.float32)
    ws = MatmulWorkspace(8, H * K, 4)  # room for every head's quantized input, as the runner sizes it
    want = np.full((T, H * out_stride), 7.0, np.float32)
    for h, w in enumerate(packed.weights):
        qmatmul(w, np.ascontiguousarray(src[:, h * in_stride:h * in_stride + K]), want, ws, h * out_stride)
    got = np.full_like(want, 7.0)
    xq = ws.xi if packed.weights[0].int_kernel else ws.xq
    heads_matmul(src, in_stride, K, *packed.planes, *packed.info, xq, ws.dxb, ws.bsum, ws.acc, ws.expanded,
                 np.zeros(8 * K, np.float32), got, out_stride)
    assert np.array_equal(got, want)
    assert (got.reshape(T, H, out_stride)[:, :, N:] == 7.0).all()
