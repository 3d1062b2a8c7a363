"""The cpu attention kernel (backends/cpu/attention.py) with grouped-query heads: a work item takes
several query heads of one KV head and shares each key and value load among them.  Every head's
numbers must be formed alone: the same bits as with each KV head repeated for every query head
(one head per item), whatever number of heads an item takes (which follows the thread count), and
close to a float64 reference that rounds as the kernel does (the softmax weights to f16 for an f16
V; Q and the cache come in already rounded or quantized)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from infer.backends.cpu.attention import attention, qk

BS = 16  # positions per cache block


def _q8_0(x: np.ndarray) -> np.ndarray:
    """(S, H, D) f32 -> (S, H, D // 32 * 34) q8_0 blocks: an f16 scale, then 32 int8 quants."""
    S, H, D = x.shape
    out = np.zeros((S, H, D // 32 * 34), np.uint8)
    for b in range(D // 32):
        blk = x[:, :, 32 * b:32 * b + 32]
        d = (np.abs(blk).max(-1) / 127).astype(np.float16)
        q = np.clip(np.round(blk / np.maximum(d.astype(np.float32), 1e-8)[..., None]), -127, 127).astype(np.int8)
        out[:, :, 34 * b:34 * b + 2] = d.view(np.uint8).reshape(S, H, 2)
        out[:, :, 34 * b + 2:34 * b + 34] = q.view(np.uint8)
    return out


def _dequant(rows: np.ndarray, D: int) -> np.ndarray:
    """The cache rows as float64 (f16 bits or q8_0 blocks)."""
    if rows.dtype == np.uint16:
        return rows.view(np.float16).astype(np.float64)
    S, H = rows.shape[:2]
    blocks = rows.reshape(S, H, D // 32, 34)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float64)
    return (d * blocks[..., 2:].view(np.int8).astype(np.float64)).reshape(S, H, D)


def _case(Hq, Hkv, D, Dv, cache, T, S0, seed=0):
    """Queries of two sequences (the batch's first half the first, at positions S0.., the rest the
    second, at positions S0 // 2..) over a cache of shuffled blocks; scores ~ N(0, 3)."""
    rng = np.random.default_rng(seed)
    T0 = max(1, T // 2)
    pos = np.concatenate([np.arange(S0, S0 + T0), np.arange(S0 // 2, S0 // 2 + T - T0)]).astype(np.int32)
    seq = np.array([0] * T0 + [1] * (T - T0), np.int32)
    per_seq = -(-(int(pos.max()) + 1) // BS)
    nb = 2 * per_seq + 1
    kf = rng.normal(0, 1, (nb * BS, Hkv, D)).astype(np.float32)
    vf = rng.normal(0, 1, (nb * BS, Hkv, Dv)).astype(np.float32)
    if cache == "f16":
        k, v = kf.astype(np.float16).view(np.uint16), vf.astype(np.float16).view(np.uint16)
        q = rng.normal(0, 3, (T, Hq, D)).astype(np.float16).astype(np.float32)  # as prepare_q leaves it
        qd = np.zeros((T, Hq * D // 16), np.float32)
    else:
        k, v = _q8_0(kf), _q8_0(vf)
        q = np.round(rng.normal(0, 40, (T, Hq, D))).clip(-127, 127).astype(np.float32)  # q8_0 quants
        qd = rng.uniform(0.05, 0.1, (T, Hq * D // 16)).astype(np.float32)  # their scales, every other used
    tables = rng.permutation(nb)[:2 * per_seq].astype(np.int32).reshape(2, per_seq)
    # the first sequence's queries generated tokens, the second's a prompt's: both orders of q·k
    prompt_end = np.array([S0, S0 + T], np.int32)
    return q, qd, k, v, tables, seq, pos, prompt_end


def _seq_last(case, causal):
    """The kernel's seq_last: (0,) causal, else each sequence's last position in the batch."""
    seq, pos = case[5], case[6]
    if causal:
        return np.zeros(0, np.int32)
    last = np.full(len(case[4]), -1, np.int32)
    np.maximum.at(last, seq, pos)
    return last


def _run(case, window, softcap, sinks, rows=4, chunked=False, causal=True):
    q, qd, k, v, tables, seq, pos, prompt_end = case
    T, Hq, _ = q.shape
    Dv = v.shape[2] if v.dtype == np.uint16 else v.shape[2] // 34 * 32
    out = np.full((T, Hq, Dv), np.nan, np.float32)
    scores = np.zeros((rows, Hq * (int(pos.max()) + 1)), np.float32)  # room for any grouping
    attention(q, qd, k, v, tables, seq, pos, prompt_end, _seq_last(case, causal), BS, window, chunked,
              np.float32(1 / np.sqrt(q.shape[2])), np.float32(softcap), sinks, sinks[:0], 0, out, scores)
    return out


def _reference(case, window, softcap, sinks, chunked=False, causal=True):
    q, qd, k, v, tables, seq, pos, _ = case
    last = _seq_last(case, False)
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    Dv = v.shape[2] if v.dtype == np.uint16 else v.shape[2] // 34 * 32
    K, V = _dequant(k, D), _dequant(v, Dv)
    if k.dtype == np.uint8:
        qs = q.astype(np.float64) * np.repeat(qd[:, 0::2].astype(np.float64), 32, axis=1).reshape(T, Hq, D)
    else:
        qs = q.astype(np.float64)
    out = np.zeros((T, Hq, Dv))
    for t in range(T):
        rows = (tables[seq[t]][:, None] * BS + np.arange(BS)).reshape(-1)  # pool row of each position
        hi = pos[t]
        if not causal:  # the whole sequence, within a symmetric window (|q - p| <= window // 2)
            lo = max(0, pos[t] - window // 2) if window else 0
            hi = min(last[seq[t]], pos[t] + window // 2) if window else last[seq[t]]
        else:
            lo = (pos[t] // window * window if chunked else max(0, pos[t] - window + 1)) if window else 0
        Kt, Vt = K[rows[lo:hi + 1]], V[rows[lo:hi + 1]]
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            a = Kt[:, kh] @ qs[t, h] / np.sqrt(D)
            if softcap:
                a = softcap * np.tanh(a / softcap)
            m = max(a.max(), sinks[h]) if sinks.size else a.max()
            e = np.exp(a - m)
            w = e / (e.sum() + (np.exp(sinks[h] - m) if sinks.size else 0))
            if v.dtype == np.uint16:  # llama.cpp multiplies an f16 V by f16 weights
                w = w.astype(np.float32).astype(np.float16).astype(np.float64)
            out[t, h] = w @ Vt[:, kh]
    return out


# (Hq, Hkv, D, Dv): groups of 6, 4, 7, 5, 3, 1, and 4 again with a wider V; head sizes that are
# not a multiple of the vector width (72, 80) take the plain loops for what is left
SHAPES = [(12, 2, 128, 128), (8, 2, 64, 64), (28, 4, 64, 64), (5, 1, 96, 96), (3, 1, 80, 80), (8, 8, 64, 64),
          (8, 2, 64, 128), (6, 2, 72, 72)]
# (window, softcap, sinks, chunked, causal): llama4's chunks of 16 cross the prompts' chunk boundaries;
# non-causal (an encoder's): every key of the sequence, or a symmetric window (9: 4 either side)
SETTINGS = [(0, 0.0, False, False, True), (16, 5.0, True, False, True), (16, 0.0, False, True, True),
            (0, 0.0, False, False, False), (9, 0.0, False, False, False)]


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
@pytest.mark.parametrize("Hq,Hkv,D,Dv", SHAPES)
@pytest.mark.parametrize("T,S0", [(21, 0), (1, 70), (3, 40)])
def test_grouped_heads_are_each_heads_own(Hq, Hkv, D, Dv, cache, T, S0):
    if cache == "q8_0" and (D % 32 or Dv % 32):
        pytest.skip("q8_0 needs whole 32-element blocks")
    case = _case(Hq, Hkv, D, Dv, cache, T, S0)
    q, qd, k, v, tables, seq, pos, prompt_end = case
    group = Hq // Hkv
    alone = (q, qd, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), tables, seq, pos, prompt_end)  # one head per KV head
    for window, softcap, sink, chunked, causal in SETTINGS:
        sinks = np.random.default_rng(1).normal(2, 1, Hq).astype(np.float32) if sink else np.zeros(0, np.float32)
        ref = _run(alone, window, softcap, sinks, chunked=chunked, causal=causal)
        for rows in (1, 4, 16, 64):  # items of the whole group, and split for more threads
            got = _run(case, window, softcap, sinks, rows, chunked, causal)
            np.testing.assert_array_equal(got, ref)
        exact = _reference(case, window, softcap, sinks, chunked, causal)
        # f16: a score a float32 step from a half's rounding boundary may round its weight the other way
        np.testing.assert_allclose(ref, exact, rtol=0, atol=1e-3 if cache == "f16" else 1e-4)


def test_scores_scratch_must_hold_a_group_of_rows():
    q, qd, k, v, tables, seq, pos, prompt_end = _case(12, 2, 64, 64, "f16", 8, 0)
    need = 6 * (int(pos.max()) + 1)  # a whole group of 6 heads at once (few items for 2 rows)

    def run(width):
        attention(q, qd, k, v, tables, seq, pos, prompt_end, np.zeros(0, np.int32), BS, 0, False, np.float32(0.125),
                  np.float32(0), np.zeros(0, np.float32), np.zeros(0, np.float32), 0, np.zeros(q.shape, np.float32),
                  np.zeros((2, width), np.float32))

    run(need)
    with pytest.raises(ValueError, match="scratch"):
        run(need - 1)


@njit(cache=True)
def _scores(q, k, single, s):
    # qk over every key of head 0 for the q's heads (q: (ng * D,) f32), into s (ng * n,)
    qk(q, 0, q.shape[0] // k.shape[2], q[:0], 0, k, 0, 0, k.shape[0], s, 0, k.shape[0], single)


def _fma(a, b, c):
    # a * b + c rounded once (the float64 product of two floats of 24 bits or less is exact)
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _halving(v):
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = (v[..., :h] + v[..., h:]).astype(np.float32)
    return v[..., 0]


def _pairwise8(v):
    # GGML_F32x8_REDUCE's end: the 128-bit halves added, then two _mm_hadd_ps
    t = (v[:4] + v[4:]).astype(np.float32)
    return np.float32(np.float32(t[0] + t[1]) + np.float32(t[2] + t[3]))


def _vec_dot_f16(x, y, W):
    """ggml_vec_dot_f16 on x86 (AVX-512: W 16; AVX2: W 8): four W-lane FMA chains over each 4W,
    summed (0 + 2, 1 + 3, then those), reduced; the elements past the last 4W in float64."""
    n = len(x) - len(x) % (4 * W)
    acc = np.zeros((4, W), np.float32)
    for i in range(0, n, 4 * W):
        for j in range(4):
            acc[j] = _fma(x[i + j * W:i + (j + 1) * W], y[i + j * W:i + (j + 1) * W], acc[j])
    v = ((acc[0] + acc[2]).astype(np.float32) + (acc[1] + acc[3]).astype(np.float32)).astype(np.float32)
    total = np.float64(_halving(v) if W == 16 else _pairwise8(v))
    for i in range(n, len(x)):
        total += np.float64(np.float32(x[i] * y[i]))
    return np.float32(total)


def _tinyblas(x, y, W):
    """llamafile's tinyBLAS on x86: one W-lane FMA chain, reduced by halving."""
    acc = np.zeros(W, np.float32)
    for i in range(0, len(x), W):
        acc = _fma(x[i:i + W], y[i:i + W], acc)
    return _halving(acc)


@pytest.mark.parametrize("D", [64, 72, 80, 128, 256])
@pytest.mark.parametrize("single", [True, False], ids=["decode", "prompt"])
def test_scores_sum_in_llama_cpp_order(D, single):
    """q·k with an f16 K is summed as llama.cpp's CPU backend sums it: ggml_vec_dot_f16 for a token
    alone in its batch, tinyBLAS for a prompt's tokens (which falls back to the vec_dot for a head
    size that is not a multiple of its vector): bit for bit, for every grouping of heads."""
    from infer.backends.cpu.target import VECTOR_WIDTH as W

    rng = np.random.default_rng(D)
    n = 37
    k = rng.normal(0, 1, (n, 1, D)).astype(np.float16)
    for ng in (1, 2, 3, 4, 5):
        q = rng.normal(0, 3, ng * D).astype(np.float16).astype(np.float32)
        s = np.full(ng * n, np.nan, np.float32)
        _scores(q, k.view(np.uint16), single, s)
        kf = k[:, 0].astype(np.float32)
        vec = single or D % W != 0
        want = np.array([[(_vec_dot_f16 if vec else _tinyblas)(kf[j], q[g * D:(g + 1) * D], W) for j in range(n)]
                         for g in range(ng)], np.float32)
        np.testing.assert_array_equal(s.reshape(ng, n), want)
        if D % W == 0:  # the two orders give other floats: which one runs is tested too
            other = np.array([[(_tinyblas if vec else _vec_dot_f16)(kf[j], q[g * D:(g + 1) * D], W)
                               for j in range(n)] for g in range(ng)], np.float32)
            assert not np.array_equal(want, other)
