"""The cpu attention kernel (backends/cpu/attention.py) with grouped-query heads: a work item takes
several query heads of one KV head and shares each key and value load among them.  Every head's
numbers must be formed alone: the same bits as with each KV head repeated for every query head
(one head per item), whatever number of heads an item takes (which follows the thread count), and
close to a float64 reference that rounds as the kernel does (the softmax weights to f16 for an f16
V; Q and the cache come in already rounded or quantized)."""
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
    return q, qd, k, v, tables, seq, pos


def _run(case, window, softcap, sinks, rows=4):
    q, qd, k, v, tables, seq, pos = case
    T, Hq, _ = q.shape
    Dv = v.shape[2] if v.dtype == np.uint16 else v.shape[2] // 34 * 32
    out = np.full((T, Hq, Dv), np.nan, np.float32)
    scores = np.zeros((rows, Hq * (int(pos.max()) + 1)), np.float32)  # room for any grouping
    attention(q, qd, k, v, tables, seq, pos, BS, window, np.float32(1 / np.sqrt(q.shape[2])), np.float32(softcap),
              sinks, 0, out, scores)
    return out


def _reference(case, window, softcap, sinks):
    q, qd, k, v, tables, seq, pos = case
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
        lo = max(0, pos[t] - window + 1) if window else 0
        Kt, Vt = K[rows[lo:pos[t] + 1]], V[rows[lo:pos[t] + 1]]
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
SETTINGS = [(0, 0.0, False), (16, 5.0, True)]  # (window, softcap, sinks)


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
@pytest.mark.parametrize("Hq,Hkv,D,Dv", SHAPES)
@pytest.mark.parametrize("T,S0", [(21, 0), (1, 70), (3, 40)])
def test_grouped_heads_are_each_heads_own(Hq, Hkv, D, Dv, cache, T, S0):
    if cache == "q8_0" and (D % 32 or Dv % 32):
        pytest.skip("q8_0 needs whole 32-element blocks")
    case = _case(Hq, Hkv, D, Dv, cache, T, S0)
    q, qd, k, v, tables, seq, pos = case
    group = Hq // Hkv
    alone = (q, qd, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), tables, seq, pos)  # one head per KV head
    for window, softcap, sink in SETTINGS:
        sinks = np.random.default_rng(1).normal(2, 1, Hq).astype(np.float32) if sink else np.zeros(0, np.float32)
        ref = _run(alone, window, softcap, sinks)
        for rows in (1, 4, 16, 64):  # items of the whole group, and split for more threads
            got = _run(case, window, softcap, sinks, rows)
            np.testing.assert_array_equal(got, ref)
        exact = _reference(case, window, softcap, sinks)
        # f16: a score a float32 step from a half's rounding boundary may round its weight the other way
        np.testing.assert_allclose(ref, exact, rtol=0, atol=1e-3 if cache == "f16" else 1e-4)


def test_scores_scratch_must_hold_a_group_of_rows():
    q, qd, k, v, tables, seq, pos = _case(12, 2, 64, 64, "f16", 8, 0)
    need = 6 * (int(pos.max()) + 1)  # a whole group of 6 heads at once (few items for 2 rows)

    def run(width):
        attention(q, qd, k, v, tables, seq, pos, BS, 0, np.float32(0.125), np.float32(0), np.zeros(0, np.float32), 0,
                  np.zeros(q.shape, np.float32), np.zeros((2, width), np.float32))

    run(need)
    with pytest.raises(ValueError, match="scratch"):
        run(need - 1)
