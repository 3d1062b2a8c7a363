"""The cpu attention kernel (backends/cpu/attention.py) with grouped-query heads: a work item takes
several query heads of one KV head and shares each key and value load among them.  Every head's
numbers must be formed alone: the same bits as with each KV head repeated for every query head
(one head per item), whatever number of heads an item takes (which follows the thread count), and
close to a float64 reference of the same rounding (f16 Q and softmax weights, or q8_0 blocks)."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.cpu.attention import attention

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


def _case(Hq, Hkv, D, cache, T, S0, seed=0):
    rng = np.random.default_rng(seed)
    S = S0 + T
    nb = -(-S // BS) + 1
    kf = rng.normal(0, 1, (nb * BS, Hkv, D)).astype(np.float32)
    vf = rng.normal(0, 1, (nb * BS, Hkv, D)).astype(np.float32)
    if cache == "f16":
        k, v = kf.astype(np.float16).view(np.uint16), vf.astype(np.float16).view(np.uint16)
        q = rng.normal(0, 1, (T, Hq, D)).astype(np.float16).astype(np.float32)  # as prepare_q leaves it
        qd = np.zeros((T, Hq * D // 16), np.float32)
    else:
        k, v = _q8_0(kf), _q8_0(vf)
        q = np.round(rng.normal(0, 40, (T, Hq, D))).clip(-127, 127).astype(np.float32)  # q8_0 quants
        qd = rng.uniform(0.005, 0.02, (T, Hq * D // 16)).astype(np.float32)  # their scales, every other used
    table = rng.permutation(nb).astype(np.int32)[None]
    return q, qd, k, v, table, np.zeros(T, np.int32), np.arange(S0, S, dtype=np.int32)


def _run(case, window, softcap, sinks, rows=4):
    q, qd, k, v, table, seq, pos = case
    T, Hq, D = q.shape
    out = np.full((T, Hq, D), np.nan, np.float32)
    scores = np.zeros((rows, Hq * (int(pos.max()) + 1)), np.float32)  # room for any grouping
    attention(q, qd, k, v, table, seq, pos, BS, window, np.float32(1 / np.sqrt(D)), np.float32(softcap), sinks, 0,
              out, scores)
    return out


def _reference(case, window, softcap, sinks):
    q, qd, k, v, table, seq, pos = case
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    rows = (table[0][:, None] * BS + np.arange(BS)).reshape(-1)  # pool row of each position
    K, V = _dequant(k, D)[rows], _dequant(v, D)[rows]
    if k.dtype == np.uint8:
        qs = q.astype(np.float64) * np.repeat(qd[:, 0::2].astype(np.float64), 32, axis=1).reshape(T, Hq, D)
    else:
        qs = q.astype(np.float64)
    out = np.zeros((T, Hq, D))
    for t in range(T):
        lo = max(0, pos[t] - window + 1) if window else 0
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            a = K[lo:pos[t] + 1, kh] @ qs[t, h] / np.sqrt(D)
            if softcap:
                a = softcap * np.tanh(a / softcap)
            m = max(a.max(), sinks[h]) if sinks.size else a.max()
            e = np.exp(a - m)
            total = e.sum() + (np.exp(sinks[h] - m) if sinks.size else 0)
            out[t, h] = (e / total) @ V[lo:pos[t] + 1, kh]
    return out


SHAPES = [(12, 2, 128), (8, 2, 64), (28, 4, 64), (5, 1, 96), (3, 1, 80), (8, 8, 64)]
SETTINGS = [(0, 0.0, False), (16, 30.0, True)]  # (window, softcap, sinks)


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES)
@pytest.mark.parametrize("T,S0", [(21, 0), (1, 70)])
def test_grouped_heads_are_each_heads_own(Hq, Hkv, D, cache, T, S0):
    if cache == "q8_0" and D % 32:
        pytest.skip("q8_0 needs whole 32-element blocks")
    case = _case(Hq, Hkv, D, cache, T, S0)
    q, qd, k, v, table, seq, pos = case
    group = Hq // Hkv
    alone = (q, qd, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), table, seq, pos)  # one head per KV head
    for window, softcap, sink in SETTINGS:
        sinks = np.random.default_rng(1).normal(0, 1, Hq).astype(np.float32) if sink else np.zeros(0, np.float32)
        ref = _run(alone, window, softcap, sinks)
        for rows in (1, 4, 64):  # items of the whole group, and split for more threads
            got = _run(case, window, softcap, sinks, rows)
            np.testing.assert_array_equal(got, ref)
        exact = _reference(case, window, softcap, sinks)
        np.testing.assert_allclose(ref, exact, rtol=0, atol=2e-3 if cache == "f16" else 2e-2)


def test_scores_scratch_too_short_is_an_error():
    case = _case(12, 2, 64, "f16", 8, 0)
    q, qd, k, v, table, seq, pos = case
    with pytest.raises(ValueError, match="scratch"):
        attention(q, qd, k, v, table, seq, pos, BS, 0, np.float32(0.125), np.float32(0), np.zeros(0, np.float32), 0,
                  np.zeros(q.shape, np.float32), np.zeros((2, 8), np.float32))
