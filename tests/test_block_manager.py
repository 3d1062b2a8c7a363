"""The paged KV bookkeeping and the scheduler, with fake sequences and no model."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from infer.engine.block_manager import BlockManager
from infer.engine.scheduler import Scheduler, SeqStatus, Sequence

BS = 4


def run(bm: BlockManager, sid, tokens, n_new=None):
    """Compute tokens of a tracked sequence as the engine would: append, then commit."""
    n = n_new if n_new is not None else len(tokens) - bm.num_computed(sid)
    copies = bm.append(sid, n)
    bm.commit(sid, tokens, n)
    return copies


def check_refcounts(bm: BlockManager) -> None:
    """Every block's count equals the number of tables holding it; free/cached lists agree."""
    for g, pool in enumerate(bm.pools):
        counts = [0] * pool.n_blocks
        for s in bm.seqs.values():
            for b in s.tables[g]:
                if b >= 0:
                    counts[b] += 1
        assert counts == pool.ref
        idle = set(pool.free) | set(pool.cached)
        assert idle == {b for b in range(pool.n_blocks) if pool.ref[b] == 0}
        assert not set(pool.free) & set(pool.cached)
        assert all(pool.hash_of[b] is not None for b in pool.cached)
        assert all(pool.hash_of[b] == h for h, b in pool.by_hash.items())


def test_allocate_and_free():
    bm = BlockManager([8], BS, [0])
    toks = list(range(10))
    assert bm.begin("a", toks) == 0
    run(bm, "a", toks)
    assert bm.held("a") == [3]  # ceil(10 / 4)
    assert bm.usage().blocks_used == (3,)
    bm.free("a")
    assert bm.usage().blocks_used == (0,)
    check_refcounts(bm)


def test_prefix_hit_shares_full_blocks():
    bm = BlockManager([16], BS, [0])
    a = list(range(11))  # two full blocks and a partial one
    bm.begin("a", a)
    run(bm, "a", a)
    b = a[:8] + [100, 101, 102]
    assert bm.begin("b", b) == 8
    assert bm.tables("b")[0][:2] == bm.tables("a")[0][:2]
    assert bm.pools[0].ref[bm.tables("a")[0][0]] == 2
    run(bm, "b", b)
    assert bm.tables("b")[0][2] != bm.tables("a")[0][2]
    # a prompt differing in the first block shares nothing (hashes are chained)
    c = [99] + a[1:]
    assert bm.begin("c", c) == 0
    check_refcounts(bm)


def test_prefix_survives_its_sequence_and_model_key_separates():
    bm = BlockManager([16], BS, [0], model_key=b"m1")
    a = list(range(9))
    bm.begin("a", a)
    run(bm, "a", a)
    bm.free("a")
    assert bm.usage().blocks_cached == (2,)
    assert bm.cached_prefix(a + [5, 6]) == 8
    other = BlockManager([16], BS, [0], model_key=b"m2")
    other.begin("a", a)
    run(other, "a", a)
    # same tokens, another model: the names differ
    assert bm.pools[0].by_hash.keys().isdisjoint(other.pools[0].by_hash.keys())


def test_full_prompt_hit_recomputes_last_token_with_copy_on_write():
    bm = BlockManager([16], BS, [0])
    a = list(range(8))  # exactly two blocks
    bm.begin("a", a)
    run(bm, "a", a)
    assert bm.begin("b", a) == 7  # the last token is computed again for its logits
    shared = bm.tables("b")[0][1]
    assert shared == bm.tables("a")[0][1]
    copies = run(bm, "b", a)
    new = bm.tables("b")[0][1]
    assert copies == [(0, shared, new)] and new != shared
    assert bm.pools[0].ref[shared] == 1 and bm.pools[0].ref[new] == 1
    check_refcounts(bm)


def test_lru_eviction_order():
    bm = BlockManager([4], BS, [0])
    for name, base in (("a", 0), ("b", 100)):
        toks = list(range(base, base + 8))
        bm.begin(name, toks)
        run(bm, name, toks)
    bm.free("a")  # a's blocks are freed first: the oldest
    bm.free("b")
    assert bm.usage().blocks_cached == (4,)
    c = list(range(200, 205))
    bm.begin("c", c)
    run(bm, "c", c)  # needs two blocks: evicts a's
    assert bm.cached_prefix(list(range(8)) + [1]) == 0
    assert bm.cached_prefix(list(range(100, 108)) + [1]) == 8
    check_refcounts(bm)


def test_sliding_window_group_drops_blocks_outside_the_window():
    window = 8
    bm = BlockManager([64, 64], BS, [0, window])
    toks = list(range(60))
    bm.begin("a", toks[:1])
    for n in range(1, 61):
        run(bm, "a", toks[:n], 1)
        full, local = bm.held("a")
        assert full == math.ceil(n / BS)
        assert local <= window // BS + 1
        # the blocks kept cover every key the next query (position n) can see
        first = max(0, n - window + 1) // BS
        assert all(b >= 0 for b in bm.tables("a")[1][first:])
    check_refcounts(bm)


def test_sliding_window_prefix_hit_needs_the_window_blocks():
    window = 8
    bm = BlockManager([64, 64], BS, [0, window])
    a = list(range(30))
    bm.begin("a", a)
    run(bm, "a", a)
    b = a[:24] + [7, 7]
    n = bm.begin("b", b)
    assert n == 24
    first = (n - window + 1) // BS
    assert all(x == -1 for x in bm.tables("b")[1][:first])
    run(bm, "b", b)
    bm.free("a")
    bm.free("b")
    check_refcounts(bm)
    # the sliding-window blocks of the early part were dropped and may be evicted; a hit
    # is only reported where every group has what it needs
    for seq_len in (9, 13, 17, 25, 31):
        n = bm.cached_prefix(a[:seq_len])
        assert n <= seq_len - 1 and n % BS in (0, (seq_len - 1) % BS)


def make_seq(i, n_prompt, base=0):
    return Sequence(i, [base + (i * 1000 + k) % 50 for k in range(n_prompt)], n_prompt)


def step(sched: Scheduler, finish_after: dict) -> list:
    """One scheduler step with fake forward passes: every sequence that reaches its last
    token 'samples' token 1; sequences with enough output finish."""
    s = sched.schedule()
    sched.commit(s)
    for seq, n in s.items:
        if seq.status == SeqStatus.RUNNING and sched.num_computed(seq) == seq.num_tokens:
            seq.tokens.append(1)
            if len(seq.output) >= finish_after.get(seq.id, 10**9):
                sched.finish(seq)
    return s.items


def test_scheduler_chunks_long_prompts_and_keeps_decoding():
    bm = BlockManager([256], BS, [0])
    sched = Scheduler(bm, max_seqs=4, max_batch_tokens=16)
    short = make_seq(1, 3)
    sched.add(short)
    step(sched, {})
    longp = make_seq(2, 40)
    sched.add(longp)
    for chunk in (15, 15, 10, 1):
        items = step(sched, {})
        d = dict((s.id, n) for s, n in items)
        assert d[1] == 1  # the decoding sequence runs every step
        assert d[2] == chunk  # the prompt gets the rest of the budget, then decodes too
        assert sum(d.values()) <= 16


def test_scheduler_preempts_newest_and_resumes():
    bm = BlockManager([10], BS, [0])
    sched = Scheduler(bm, max_seqs=4, max_batch_tokens=64)
    a, b = make_seq(1, 12), make_seq(2, 12, base=7)
    sched.add(a)
    sched.add(b)
    step(sched, {})
    assert a.status == b.status == SeqStatus.RUNNING
    assert bm.usage().blocks_used == (6,)
    # decoding grows both; past 20 tokens each they need more than the 10 blocks: b (the newest) is preempted
    preempted = False
    for _ in range(12):
        s = sched.schedule()
        preempted |= b in s.preempted
        sched.commit(s)
        for seq, n in s.items:
            if sched.num_computed(seq) == seq.num_tokens:
                seq.tokens.append(1)
        if len(a.output) >= 12 and a.status == SeqStatus.RUNNING:
            sched.finish(a)
    assert preempted and b.num_preempted >= 1
    while b.status != SeqStatus.FINISHED:
        step(sched, {2: len(b.output) + 1})
    assert bm.usage().blocks_used == (0,)
    check_refcounts(bm)


def test_cancel_frees_blocks():
    bm = BlockManager([32], BS, [0])
    sched = Scheduler(bm, max_seqs=2, max_batch_tokens=8)
    a = make_seq(1, 20)
    sched.add(a)
    step(sched, {})  # mid-prefill
    assert bm.usage().blocks_used == (2,)
    sched.finish(a)
    assert bm.usage().blocks_used == (0,) and not sched.has_work()


@settings(max_examples=60, deadline=None)
@given(
    n_blocks=st.integers(12, 40),
    window=st.sampled_from([0, 6, 9]),
    budget=st.integers(1, 24),
    max_seqs=st.integers(1, 5),
    # (prompt length, tokens to generate, prefix family, speculates: drafts verified and partly rejected)
    reqs=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3), st.booleans()),
                  min_size=1, max_size=10),
    cancel_at=st.lists(st.integers(0, 60), max_size=4),
)
def test_random_workloads_end_with_every_block_free(n_blocks, window, budget, max_seqs, reqs, cancel_at):
    windows = [0, window] if window else [0]
    ctx = 48
    # the engine sizes the pool so one sequence of the whole context always fits
    n_blocks = max(n_blocks, math.ceil(ctx / BS) + 1)
    bm = BlockManager([n_blocks] * len(windows), BS, windows)
    sched = Scheduler(bm, max_seqs=max_seqs, max_batch_tokens=budget)
    seqs = []
    speculates = {i for i, r in enumerate(reqs) if r[3]}
    for i, (n_prompt, n_out, family, _) in enumerate(reqs):
        # families share prefixes, so the prefix cache is exercised
        seq = Sequence(i, [family * 7 + (k % 5) for k in range(n_prompt)], n_prompt)
        seqs.append((seq, n_out))
        sched.add(seq)
    limits = {s.id: n for s, n in seqs}
    for t in range(2000):
        if not sched.has_work():
            break
        if t in cancel_at:
            live = [s for s, _ in seqs if s.status != SeqStatus.FINISHED]
            if live:
                sched.finish(live[t % len(live)])
        s = sched.schedule()
        assert s.n_tokens <= budget
        assert s.items or s.preempted or not sched.running
        kept = {}
        for seq, n in s.items:  # as the engine: accepted draft tokens join the sequence, the rest's K/V go
            if seq.draft and sched.num_computed(seq) + n == seq.num_scheduled:
                accepted = (t + seq.id) % (len(seq.draft) + 1)
                kept[seq.id] = n - len(seq.draft) + accepted
                seq.tokens.extend(seq.draft[:accepted])
                seq.draft = []
        sched.commit(s, kept)
        for seq, n in s.items:
            if seq.status == SeqStatus.RUNNING and sched.num_computed(seq) == seq.num_tokens:
                seq.tokens.append(3)
                if len(seq.output) >= limits[seq.id] or seq.num_tokens >= ctx:
                    sched.finish(seq)
                elif seq.id in speculates:
                    room = min(limits[seq.id] - len(seq.output), ctx - seq.num_tokens) - 1
                    seq.draft = [(t + k) % 5 for k in range(min(1 + t % 4, max(room, 0)))]
        for seq in sched.running:  # between steps: exactly the blocks of the computed tokens
            full, *local = bm.held(seq.id)
            assert full == math.ceil(sched.num_computed(seq) / BS)
            for w, held in zip(windows[1:], local):
                assert held <= w // BS + 1
        check_refcounts(bm)
    assert not sched.has_work()
    assert all(s.status == SeqStatus.FINISHED for s, _ in seqs)
    assert bm.usage().blocks_used == (0,) * len(windows)
    assert not bm.seqs
    check_refcounts(bm)
