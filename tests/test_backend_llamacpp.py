"""The llama.cpp backend under infer's engine: continuous batching, cancelling, preemption and the
prefix cache work on llama.cpp's own KV cache, and the embedded Gemma agrees with the cpu backend.

llama.cpp's CPU kernels are not batch-invariant: ggml's mul_mat takes llamafile's tinyBLAS only
when the activations have two rows or more ("only enable sgemm for prompt processing",
ggml-cpu/llamafile/sgemm.cpp), whose accumulation order differs from the one-row vec_dot
kernels, and tinyBLAS's tiles depend on the row count.  So a sequence's logits change by a few
ulps to ~1e-2 (tiny models) with what shares its forward pass.  These tests hold batching,
sharing and recomputing to that: the same tokens, or a divergence only where the reference's
two best tokens lie within that noise; logits within it as long as both histories agree.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest

from helpers.engine_runs import alone, cancel_midway, tiny_prompts
from helpers.prompts import PROMPTS
from helpers.tiny_models import write_tiny_model
from infer.backends.base import RunnerOptions
from infer.backends.batch import Batch
from infer.backends.llamacpp.runner import LlamaCppRunner
from infer.backends.registry import probe
from infer.engine.conversation import Conversation, TurnStats
from infer.engine.engine import Engine, EngineConfig
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams

pytestmark = pytest.mark.reference  # the llama.cpp backend runs on llama-cpp-python
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
TINY_TOL = 0.05  # logit noise of batching on the tiny models (measured up to 0.022); a changed token moves them 0.05-0.4
# the hybrids' recurrent state carries llama.cpp's batching noise forward: batched against alone
# measured up to 0.063 (lfm2; qwen35 0.017), while alone against the cpu backend stays within 0.022
HYBRID_TOL = 0.1
# one thread: ggml's workers spin-wait at every barrier, so on a machine whose cores other
# processes share, two threads can run a decode 100x slower than one (results do not depend on it)
LC = dict(backend="llama.cpp", n_threads=1)


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    # a sliding window of 6 next to global layers: llama.cpp's SWA cache and infer's two KV groups
    return write_tiny_model(tmp_path_factory.mktemp("lc") / "tiny-gemma3.gguf", "gemma3", seed=11)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("lc") / "tiny-llama.gguf", "llama", seed=11)


def make_llm(path, config: EngineConfig, flash_attn: bool = False) -> LLM:
    llm = LLM.load(path, config)
    if flash_attn:  # the registry's runner has flash attention off
        opts = RunnerOptions(n_threads=config.n_threads, max_tokens=min(config.max_batch_tokens, 512),
                             max_seqs=config.max_seqs)
        llm.runner = LlamaCppRunner(path, llm.model.config, opts, flash_attn=True)
        llm.engine = Engine(llm.runner, llm.tokenizer, llm.model.config, config, model_key=str(path).encode())
    return llm


def traced(llm: LLM, prompts, params=GREEDY, all_logits: bool = True):
    """Run prompts at once; per prompt (tokens, the logits each was picked from), and the most
    sequences one step ran.  all_logits=False keeps only the first token's logits."""
    eng, runner = llm.engine, llm.runner
    seen: dict[tuple[int, int], np.ndarray] = {}
    real = runner.forward_batch

    def spy(batch, pool, states=None):
        out = real(batch, pool, states)
        for r, t in enumerate(batch.logit_rows):
            seen[(int(batch.seq_ids[batch.tok_seq[t]]), int(batch.positions[t]))] = out[r].copy()
        return out

    runner.forward_batch = spy
    try:
        ids = [eng.add_request(p, params, keep_events=False) for p in prompts]
        first = {(rid, len(p) - 1) for rid, p in zip(ids, prompts)}
        done: dict[int, list[int]] = {}
        widest = 0
        while eng.has_work():
            for ev in eng.step():
                if ev.finish_reason is not None:
                    done[ev.request_id] = ev.token_ids
            widest = max(widest, len(eng.scheduler.running))
            if not all_logits:
                for k in [k for k in seen if k not in first]:
                    del seen[k]
    finally:
        del runner.forward_batch
    out = []
    for rid, p in zip(ids, prompts):
        toks = done[rid]
        n = len(toks) if all_logits else 1
        out.append((toks, [seen[(rid, len(p) - 1 + k)] for k in range(n)]))
    return out, widest


def agree(got, ref, tol: float) -> int:
    """Assert each run of `got` matches `ref` up to kernel noise; returns how many are identical."""
    same = 0
    for i, ((gt, gl), (rt, rl)) in enumerate(zip(got, ref)):
        k = next((j for j, (a, b) in enumerate(zip(gt, rt)) if a != b), min(len(gt), len(rt)))
        for j in range(min(k + 1, len(gl), len(rl))):
            d = float(np.abs(gl[j] - rl[j]).max())
            assert d <= tol, f"run {i} step {j}: logits differ by {d:.4f} (> {tol}) with the same history"
        if k == len(gt) == len(rt):
            same += 1
            continue
        margin = float(rl[k][rt[k]] - rl[k][gt[k]])
        assert margin <= tol, f"run {i} diverges at step {k} where the reference preferred its token by {margin:.4f}"
    return same


# -- the backend ------------------------------------------------------------------------------


def test_backend_probe_devices_and_warmup(tiny_gemma):
    info = probe("llama.cpp")
    assert info.available and info.devices
    assert info.gpu == bool(llama_cpp.llama_supports_gpu_offload())
    assert any("cpu" in d.lower() for d in info.devices)
    llm = LLM.load(tiny_gemma, EngineConfig(n_ctx=64, max_batch_tokens=32, **LC))
    r = llm.runner
    assert (r.backend, r.max_tokens, r.n_threads) == ("llama.cpp", 32, 1)
    assert r.devices()[0].startswith("llama.cpp") and "1 thread" in r.devices()[0]
    cfg = llm.model.config
    per_token = cfg.n_layer * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2
    # swa_full: every layer counts in the global group, plus a quarter of headroom
    assert r.bytes_per_block(16) == (16 * per_token * 5 // 4, 0)
    pool = llm.engine.pool
    assert pool.nbytes >= llm.engine.blocks.pools[0].n_blocks * 16 * per_token * 5 // 4
    r.warmup()
    assert llm.engine.pool.n_live == 0 and not llm.engine.pool.donors
    assert list(llm.generate([1, 5, 6], GREEDY))[-1].token_ids == alone(tiny_gemma, [[1, 5, 6]], llm.config)[0]


def test_quantized_cache_types(tiny_gemma):
    # --cache-type-k/-v q8_0 reach llama.cpp (its quantized V runs with flash attention), and the
    # pool is sized for 34 bytes per 32 values
    llm = LLM.load(tiny_gemma, EngineConfig(n_ctx=64, cache_type_k="q8_0", cache_type_v="q8_0", **LC))
    cfg = llm.model.config
    per_token = cfg.n_layer * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 34 // 32
    assert llm.runner.bytes_per_block(16) == (16 * per_token * 5 // 4, 0) and llm.runner.flash_attn
    assert len(list(llm.generate([1, 5, 6], GREEDY))[-1].token_ids) == GREEDY.max_tokens


def test_decode_failure_is_a_clear_error(tiny_gemma):
    llm = LLM.load(tiny_gemma, EngineConfig(n_ctx=64, **LC))
    pool = llm.engine.pool
    bad = Batch.single(np.array([1, 10_000], np.int32), 0, [np.arange(4, dtype=np.int32)[None]] * 2, 16)
    with pytest.raises(RuntimeError, match="llama.cpp decode of 2 tokens failed"):
        llm.runner.forward_batch(bad, pool)
    assert pool.slots[pool.slot_of[0]].n == 0  # nothing half-written is kept
    with pytest.raises(ValueError, match="1 to 512"):
        llm.runner.forward_batch(Batch.single(np.zeros(513, np.int32), 0, [np.arange(40, dtype=np.int32)[None]] * 2, 16),
                                 pool)


# -- the engine on llama.cpp ------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_batched_matches_alone(model, request):
    path = request.getfixturevalue(model)
    # a small token budget: prompts are chunked and admitted over several steps, later ones
    # sharing the first ones' prefix cells
    config = EngineConfig(n_ctx=256, max_seqs=8, max_batch_tokens=40, **LC)
    prompts = tiny_prompts()
    llm = LLM.load(path, config)
    together, widest = traced(llm, prompts)
    assert widest == 8
    assert llm.engine.pool.shared_tokens > 0
    solo = [traced(LLM.load(path, config), [p])[0][0] for p in prompts]
    same = agree(together, solo, TINY_TOL)
    print(f"{model}: {same}/8 batched continuations identical to alone")
    # what does hold exactly: the same schedule gives bit-identical logits
    again, _ = traced(LLM.load(path, config), prompts)
    assert all(a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1])) for a, b in zip(together, again))


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_hybrid_models_batched_and_against_the_cpu_backend(arch, tmp_path):
    """A hybrid model (recurrent layers beside attention) on llama.cpp's own memory: 8 sequences
    batched give what each gives alone, and the cpu backend's tokens. llama.cpp keeps the recurrent
    state itself, so the engine has no snapshot to pair with a cached prefix: prompts sharing a
    prefix are recomputed (cached_tokens 0), never served a state from the wrong position."""
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, seed=11)
    config = EngineConfig(n_ctx=256, max_seqs=8, max_batch_tokens=40, **LC)
    prompts = tiny_prompts()
    llm = LLM.load(path, config)
    together, widest = traced(llm, prompts)
    assert widest == 8 and llm.engine.pool.shared_tokens == 0
    solo = [traced(LLM.load(path, config), [p])[0][0] for p in prompts]
    agree(together, solo, HYBRID_TOL)
    cpu = traced(LLM.load(path, EngineConfig(n_ctx=256, max_seqs=8, n_threads=1)), prompts)[0]
    agree(together, cpu, HYBRID_TOL)
    agree(solo, cpu, TINY_TOL)
    again = list(llm.engine.generate(prompts[1], GREEDY))  # its prefix in the block cache: recomputed
    assert again[-1].usage.cached_tokens == 0 and again[-1].token_ids == together[1][0]


def test_cancel_frees_blocks_and_releases_the_slot(tiny_gemma):
    config = EngineConfig(n_ctx=64, **LC)
    llm = LLM.load(tiny_gemma, config)
    eng, pool = llm.engine, llm.engine.pool

    def one_slot_live():
        assert pool.n_live == 1

    cancel_midway(eng, one_slot_live)
    assert pool.n_live == 0 and len(pool.donors) == 1  # its cells stay for a later prefix
    # a consumer walking away cancels too; the engine keeps serving what it would alone
    s = eng.generate([1, 9, 9], SamplingParams(temperature=0.0, max_tokens=50))
    next(s)
    s.close()
    assert eng.usage().blocks_used == (0, 0) and pool.n_live == 0
    got = traced(llm, [[1, 8, 9, 10]])[0]
    agree(got, traced(LLM.load(tiny_gemma, config), [[1, 8, 9, 10]])[0], TINY_TOL)


def test_preemption_recomputes_the_same_tokens(tiny_gemma):
    roomy = EngineConfig(n_ctx=128, max_seqs=8, max_batch_tokens=64, **LC)
    per_block = LLM.load(tiny_gemma, roomy).engine.blocks.block_bytes
    tight = EngineConfig(n_ctx=128, max_seqs=8, max_batch_tokens=64, kv_memory=int(1.3 * 8 * per_block[0]), **LC)
    llm = LLM.load(tiny_gemma, tight)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = tiny_prompts()
    got, _ = traced(llm, prompts, params)
    eng, pool = llm.engine, llm.engine.pool
    assert eng.scheduler.n_preempted > 0
    assert pool.shared_tokens > 0  # resumed sequences found their cells in their donor slots
    solo = [traced(LLM.load(tiny_gemma, roomy), [p], params)[0][0] for p in prompts]
    agree(got, solo, TINY_TOL)
    assert eng.usage().blocks_used == (0, 0) and pool.n_live == 0


def test_prefix_cache_shares_cells_and_computes_the_same(tiny_gemma):
    config = EngineConfig(n_ctx=256, **LC)
    cold = EngineConfig(n_ctx=256, prefix_cache=False, **LC)
    llm = LLM.load(tiny_gemma, config)
    eng, pool = llm.engine, llm.engine.pool
    first = [1] + list(range(10, 60))  # 51 tokens: three full blocks
    r1 = traced(llm, [first])[0]
    shared0 = pool.shared_tokens
    # the same 48-token prefix: its cells are shared, not recomputed
    second = first[:48] + [7, 8, 9]
    r2 = traced(llm, [second])[0]
    assert pool.shared_tokens - shared0 == 48 and pool.recomputed_tokens == 0
    agree(r2, traced(LLM.load(tiny_gemma, cold), [second])[0], TINY_TOL)
    # a prompt of cached blocks only, twice at once: 47 tokens shared each, the last one computed
    # again after the engine copied the shared last block (copy-on-write)
    whole = first[:48]
    copies = []
    real_copy = pool.copy_block
    pool.copy_block = lambda g, src, dst: (copies.append(g), real_copy(g, src, dst))
    before = pool.shared_tokens
    both = traced(llm, [whole, whole])[0]
    del pool.copy_block
    assert sorted(copies) == [0, 1] and pool.shared_tokens - before == 2 * 47
    agree(both, 2 * traced(LLM.load(tiny_gemma, cold), [whole])[0], TINY_TOL)
    # the next turn of a conversation prefills only its new tokens
    turn2 = first + r1[0][0] + [5, 6, 7]
    before = pool.shared_tokens
    ev = list(eng.generate(turn2, GREEDY))[-1]
    assert ev.usage.cached_tokens == (len(first) + len(r1[0][0]) - 1) // 16 * 16
    assert pool.shared_tokens - before == ev.usage.cached_tokens
    assert eng.usage().blocks_used == (0, 0) and pool.n_live == 0


def test_full_cache_evicts_donors(tiny_llama):
    # short requests one after another: finished ones stay as donors until llama.cpp's cache has no
    # room for the next batch (there are 4 + 8 slots, more than requests, and 768 cells), then the oldest
    # are dropped
    from infer.backends.llamacpp.runner import DONOR_SLOTS

    config = EngineConfig(n_ctx=128, max_seqs=4, max_batch_tokens=16, **LC)
    llm = LLM.load(tiny_llama, config)
    pool = llm.engine.pool
    assert len(pool.slots) == 4 + DONOR_SLOTS  # the running sequences and as many donors, at least 8
    rng = np.random.default_rng(1)
    prompts = [[1] + rng.integers(3, 320, 70).tolist() for _ in range(11)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    got = [traced(llm, [p], params)[0][0] for p in prompts]
    assert pool.evictions > 0 and len(pool.donors) < len(prompts)
    agree(got[-3:], [traced(LLM.load(tiny_llama, config), [p], params)[0][0] for p in prompts[-3:]], TINY_TOL)


def test_shared_prefixes_under_memory_pressure(tiny_gemma):
    """Waves of requests sharing prefixes of a few documents in a pool too small for them: prefix
    copies from running and finished slots, preemption, donor eviction, and sources whose
    sliding-window cells llama.cpp already reused (then the prefix is recomputed instead)."""
    rng = np.random.default_rng(6)
    docs = [[1] + rng.integers(3, 320, int(rng.integers(20, 60))).tolist() for _ in range(4)]
    prompts = []
    for _ in range(16):
        d = docs[int(rng.integers(0, 4))]
        prompts.append(d[:int(rng.integers(1, len(d) + 1))] + rng.integers(3, 320, int(rng.integers(0, 10))).tolist())
    per_block = LLM.load(tiny_gemma, EngineConfig(**LC)).engine.blocks.block_bytes[0]
    config = EngineConfig(n_ctx=128, max_seqs=4, max_batch_tokens=32, kv_memory=11 * per_block, **LC)
    llm = LLM.load(tiny_gemma, config)
    got = []
    for w in range(0, len(prompts), 5):  # later waves find earlier ones' cells
        got += traced(llm, prompts[w:w + 5])[0]
    pool = llm.engine.pool
    assert llm.engine.scheduler.n_preempted > 0 and pool.evictions > 0
    assert pool.shared_tokens > 0 and pool.recomputed_tokens > 0
    solo = [traced(LLM.load(tiny_gemma, EngineConfig(n_ctx=128, **LC)), [p])[0][0] for p in prompts]
    agree(got, solo, TINY_TOL)
    assert llm.engine.usage().blocks_used == (0, 0) and pool.n_live == 0


def test_prefix_reuse_is_faster_on_gemma(gemma_path):
    doc = ("The committee reviewed the quarterly report on renewable energy, citing wind, solar and "
           "hydroelectric capacity figures for every region, and asked each member to summarise one section. ") * 12
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    config = EngineConfig(n_ctx=1024, **LC)
    llm = LLM.load(gemma_path, config)
    ask = [llm.encode_chat([{"role": "user", "content": doc + "\n\nQuestion: " + q}])
           for q in ("Which energy sources are cited?", "Who summarises the sections?")]
    list(llm.generate(ask[0], params))
    warm = list(llm.generate(ask[1], params))[-1]
    cold = list(LLM.load(gemma_path, EngineConfig(n_ctx=1024, prefix_cache=False, **LC)).generate(ask[1], params))[-1]
    assert warm.usage.cached_tokens >= 300 and cold.usage.cached_tokens == 0
    assert llm.engine.pool.shared_tokens == warm.usage.cached_tokens
    assert warm.usage.ttft_ms < 0.5 * cold.usage.ttft_ms, (warm.usage.ttft_ms, cold.usage.ttft_ms)
    assert warm.token_ids == cold.token_ids


def test_conversation_reuses_its_prefix(gemma_path):
    llm = LLM.load(gemma_path, EngineConfig(n_ctx=512, **LC))
    conv = Conversation(llm, system="You answer in one short sentence.")
    params = SamplingParams(temperature=0.0, max_tokens=12)
    stats = []
    for text in ("Name a colour.", "Name another one.", "And a third?"):
        st = TurnStats()
        list(conv.turn(text, params, st))
        stats.append(st)
    assert stats[0].cached_tokens == 0
    pool = llm.engine.pool
    for st in stats[1:]:
        assert st.cached_tokens > 0 and st.prompt_tokens - st.cached_tokens < 40
    assert pool.shared_tokens == sum(st.cached_tokens for st in stats)


def test_gemma_continuations_against_the_cpu_backend(gemma_path):
    """Greedy 32-token continuations of the e2e prompt set, llama.cpp (flash attention off and on)
    against infer's cpu kernels.  Near-ties in this small model flip with kernel rounding: wherever
    the llama.cpp backend and the cpu backend first part ways, the cpu's token must be within
    llama.cpp's own spread (the most its two attention paths differ on a first token's logits) of
    llama.cpp's best.  (The issue's 80% identical is not reachable: llama.cpp's two paths agree on
    about a third of these continuations.)"""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    def run(backend, fa=False, all_logits=False):
        llm = make_llm(gemma_path, EngineConfig(n_ctx=256, n_threads=1, max_seqs=8, backend=backend), fa)
        ids = [llm.tokenizer.encode(p, add_special=True, parse_special=True) for p in PROMPTS]
        return traced(llm, ids, params, all_logits=all_logits)[0]

    cpu, off, on = run("cpu"), run("llama.cpp", all_logits=True), run("llama.cpp", fa=True)
    same_off = sum(a[0] == b[0] for a, b in zip(off, cpu))
    same_on = sum(a[0] == b[0] for a, b in zip(on, cpu))
    same_paths = sum(a[0] == b[0] for a, b in zip(off, on))
    spread = max(float(np.abs(ll[0] - fl[0]).max()) for (_, ll), (_, fl) in zip(off, on))
    first_diff, margins = 0, []
    for (ct, _), (lt, ll), text in zip(cpu, off, PROMPTS):
        k = next((i for i, (a, b) in enumerate(zip(ct, lt)) if a != b), None)
        if k is None:
            continue
        first_diff += k == 0
        margin = float(ll[k].max() - ll[k][ct[k]])
        margins.append(margin)
        assert margin <= spread, f"{text!r} step {k}: cpu {ct[k]} is {margin:.3f} below llama.cpp's {lt[k]}"
    print(f"identical 32-token continuations vs cpu: llama.cpp {same_off}/24 (flash attention on: {same_on}/24); "
          f"llama.cpp flash attention on vs off {same_paths}/24; first tokens differing: {first_diff}; "
          f"divergence margins {sorted(round(m, 3) for m in margins)} within llama.cpp's spread {spread:.3f}")
    assert same_off >= 4  # a broken backend would agree on none


@pytest.mark.e2e
def test_cli_run_with_llamacpp_backend():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "infer.cli", "run", "--backend", "llama.cpp", "--temperature", "0",
                        "-n", "16", "--threads", "1", "--json", "Name a colour."], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["completion_tokens"] == len(out["token_ids"]) and 1 <= out["completion_tokens"] <= 16
    assert out["text"] and out["decode_tok_s"] > 0
    assert "llama_" not in r.stderr  # llama.cpp's load chatter stays off the terminal
