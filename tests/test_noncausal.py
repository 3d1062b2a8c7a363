"""Non-causal attention (an encoder's: ModelConfig.causal False): the MLX backend's attention plan
against a float64 reference (the cpu kernel's: test_attention.py), and the scheduler, which must
admit such a prompt whole, in one step, from no cached prefix."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.batch import Batch
from infer.engine.block_manager import BlockManager
from infer.engine.scheduler import Scheduler, Sequence

BS = 4  # positions per cache block


def _batch(lengths: list[int], rng) -> tuple[Batch, int]:
    """Whole prompts of len(lengths) sequences in one batch, their blocks shuffled over the pool."""
    per_seq = max(-(-n // BS) for n in lengths)
    nb = len(lengths) * per_seq
    tables = rng.permutation(nb).astype(np.int32).reshape(len(lengths), per_seq)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    seq = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int32)
    slots = (tables[seq, pos // BS] * BS + pos % BS).astype(np.int32)[None]
    T = len(pos)
    batch = Batch(np.zeros(T, np.int32), pos, seq, slots, [tables], np.array([T - 1], np.int32),
                  prompt_end=np.array(lengths, np.int32))
    return batch, nb * BS


def _reference(batch: Batch, q, k, v, window: int) -> np.ndarray:
    """(T, H * D): each query over every key of its sequence (|q - p| <= window // 2 where window)."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    out = np.zeros((T, H, D))
    for t in range(T):
        s, p = batch.tok_seq[t], batch.positions[t]
        keys = batch.positions[batch.tok_seq == s]
        if window:
            keys = keys[np.abs(keys - p) <= window // 2]
        rows = batch.tables[0][s][keys // BS] * BS + keys % BS
        for h in range(H):
            kh = h // (H // Hkv)
            a = k[rows, kh].astype(np.float64) @ q[t, h].astype(np.float64) / np.sqrt(D)
            w = np.exp(a - a.max())
            out[t, h] = (w / w.sum()) @ v[rows, kh].astype(np.float64)
    return out.reshape(T, H * D)


@pytest.mark.parametrize("window", [0, 5])
def test_mlx_plan_sees_the_whole_sequence(window):
    mx = pytest.importorskip("mlx.core")
    from infer.backends.mlx.attention import AttentionPlan

    rng = np.random.default_rng(0)
    batch, n_rows = _batch([9, 1, 6], rng)
    H, Hkv, D = 4, 2, 16
    q = rng.normal(0, 1, (len(batch.tokens), H, D)).astype(np.float32)
    k = rng.normal(0, 1, (n_rows, Hkv, D)).astype(np.float32)
    v = rng.normal(0, 1, (n_rows, Hkv, D)).astype(np.float32)
    plan = AttentionPlan(batch, 0, BS, window, causal=False)
    got = np.array(plan.attend(mx.array(q), mx.array(k), mx.array(v), 1 / np.sqrt(D), 0.0))
    ref = _reference(batch, q, k, v, window)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    # and it is not what the causal plan computes: the later keys count
    causal = np.array(AttentionPlan(batch, 0, BS, window).attend(mx.array(q), mx.array(k), mx.array(v),
                                                                   1 / np.sqrt(D), 0.0))
    assert np.abs(causal - ref).max() > 0.1


def test_scheduler_admits_whole_prompts_only():
    bm = BlockManager([64], BS, [0], naming=False)
    sched = Scheduler(bm, max_seqs=4, max_batch_tokens=16, whole_prompts=True)
    a, b, c = (Sequence(i, list(range(i, i + n)), n) for i, n in ((1, 10), (2, 9), (3, 6)))
    for s in (a, b, c):
        sched.add(s)
    step = sched.schedule()
    # a fits; b does not fit in what is left (6) and waits whole rather than being chunked, and
    # c, behind it, waits too (first come, first served)
    assert [(s.id, n) for s, n in step.items] == [(1, 10)]
    sched.commit(step)
    sched.finish(a)
    step = sched.schedule()
    assert [(s.id, n) for s, n in step.items] == [(2, 9), (3, 6)]
