"""The engine on real models: batching, prefix reuse, preemption and cancelling change nothing
a request computes, and free every block."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from helpers.engine_runs import GREEDY, alone, cancel_midway, run_all, tiny_prompts
from helpers.tiny_models import write_tiny_model
from infer.engine.engine import EngineConfig, PromptError
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    # gemma3: a sliding window of 6 next to global layers, so both KV groups are exercised
    return write_tiny_model(tmp_path_factory.mktemp("engine") / "tiny-gemma3.gguf", "gemma3", seed=11)


@pytest.mark.slow  # 1-2 s alone, 15-35 s when other work shares the two cores (threaded steps)
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_batched_equals_alone_tiny(tiny_path, cache_type):
    # a small token budget, so prompts are chunked differently when they run together
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40, cache_type_k=cache_type,
                          cache_type_v=cache_type)
    prompts = tiny_prompts()
    together, widest = run_all(LLM.load(tiny_path, config), prompts)
    assert widest == 8
    assert together == alone(tiny_path, prompts, config)
    assert all(len(t) > 0 for t in together)


@pytest.mark.slow  # 1-2 s alone, 15-35 s when other work shares the two cores (threaded steps)
@pytest.mark.parametrize("arch", ["qwen3moe", "llama-moe", "glm4moe", "deepseek2", "llama4"])
def test_batched_equals_alone_moe(tmp_path, arch):
    # a mixture of experts groups the batch's tokens by expert (backends/cpu/moe.py): sequences run
    # together must still get exactly the tokens they get alone (qwen3moe: expert by expert;
    # llama-moe: every expert packed alike, one compiled loop; glm4moe: sigmoid gating with a
    # selection bias and scaled weights, a dense first layer and a shared expert; deepseek2: the same
    # over MLA's latent cache, its per-head products over the whole batch; llama4: each token's input
    # weighted before its expert, a shared expert, chunked attention)
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, seed=12)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40)
    prompts = tiny_prompts()
    together, widest = run_all(LLM.load(path, config), prompts)
    assert widest == 8
    assert together == alone(path, prompts, config)


@pytest.mark.slow  # 1-2 s alone, 15-35 s when other work shares the two cores (threaded steps)
@pytest.mark.parametrize("arch", ["mistral3", "smollm3"])
def test_batched_equals_alone_per_position(tmp_path, arch):
    # mistral3: Q times an attention temperature of each token's own position (its step 4 tokens in
    # the tiny model); smollm3: layers without RoPE beside rotated ones. Sequences at other positions
    # in one batch must still get exactly the tokens they get alone
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, seed=12)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40)
    prompts = tiny_prompts()
    together, widest = run_all(LLM.load(path, config), prompts)
    assert widest == 8
    assert together == alone(path, prompts, config)


@pytest.mark.slow  # threaded steps, as the tests above
@pytest.mark.parametrize("arch", ["gemma4-shared", "gemma4-ple", "gemma4-moe"])
def test_batched_equals_alone_gemma4(tmp_path, arch):
    # Gemma 4: two KV groups of different head sizes, layers that read an earlier layer's K/V blocks
    # (gemma4-shared), take per-layer embeddings of each token (gemma4-ple) or route each token to
    # its experts beside the dense FFN (gemma4-moe), prompts chunked differently together than alone
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, seed=15)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40)
    prompts = tiny_prompts()
    together, widest = run_all(LLM.load(path, config), prompts)
    assert widest == 8
    assert together == alone(path, prompts, config)
    assert all(len(t) > 0 for t in together)


def test_grouped_experts_equal_expert_by_expert(tmp_path):
    # moe.experts_ffn (experts packed alike) against primitives' expert-by-expert loop: the same rows
    path = write_tiny_model(tmp_path / "tiny-llama-moe.gguf", "llama-moe", seed=13)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=1)
    llm = LLM.load(path, config)
    runner = llm.engine.runner
    assert all(ly.grouped is not None for ly in runner.layers)
    tokens = np.array(tiny_prompts()[0], np.int32)
    grouped = runner.forward(tokens, 0, runner.new_kv_cache(64), all_logits=True).copy()
    for ly in runner.layers:
        ly.grouped = None
    each = runner.forward(tokens, 0, runner.new_kv_cache(64), all_logits=True)
    np.testing.assert_array_equal(grouped, each)
    mixed = LLM.load(write_tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", seed=13), config)
    assert all(ly.grouped is None for ly in mixed.engine.runner.layers)  # gate Q4_K, up Q5_0


def test_q8_0_cache_halves_the_pool(tiny_path):
    sizes = {}
    for t in ("f16", "q8_0"):
        llm = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=2, cache_type_k=t, cache_type_v=t))
        usage = llm.engine.usage()
        sizes[t] = usage.bytes_total, usage.blocks_total
    assert sizes["q8_0"][1] == sizes["f16"][1]  # room for the same tokens
    assert sizes["q8_0"][0] * 64 == sizes["f16"][0] * 34  # llama.cpp's q8_0: 34 bytes per 32 values
    with pytest.raises(ValueError, match="--cache-type-v: unknown KV cache type 'q4_0'"):
        EngineConfig(cache_type_v="q4_0")


def test_preemption_recomputes_exactly(tiny_path):
    roomy = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64)
    # room for little more than one full-context sequence: the newest are preempted and recomputed
    per_seq = LLM.load(tiny_path, roomy).engine.blocks.block_bytes
    tight = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64,
                         kv_memory=int(1.3 * (8 * per_seq[0] + 8 * per_seq[1])))
    llm = LLM.load(tiny_path, tight)
    prompts = tiny_prompts()
    params = SamplingParams(temperature=0.0, max_tokens=40)
    eng = llm.engine
    ids = [eng.add_request(p, params, keep_events=False) for p in prompts]
    out = {}
    while eng.has_work():
        for ev in eng.step():
            if ev.finish_reason is not None:
                out[ev.request_id] = ev.token_ids
    assert eng.scheduler.n_preempted > 0
    assert [out[i] for i in ids] == alone(tiny_path, prompts, roomy, params)
    assert eng.usage().blocks_used == (0, 0)


def test_prefix_cache_off(tiny_path):
    """EngineConfig(prefix_cache=False): the same prompt again is prefilled cold, with the same result."""
    eng = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2, prefix_cache=False)).engine
    prompt = [1] + list(range(10, 60))
    first, again = (list(eng.generate(prompt, GREEDY))[-1] for _ in range(2))
    assert again.usage.cached_tokens == 0 and again.token_ids == first.token_ids


def test_prefix_cache_and_multi_turn_reuse(tiny_path):
    config = EngineConfig(n_ctx=256, n_threads=2)
    llm = LLM.load(tiny_path, config)
    eng = llm.engine
    bs = config.block_size
    first = [1] + list(range(10, 60))  # 51 tokens: three full blocks
    ev = list(eng.generate(first, GREEDY))[-1]
    assert ev.usage.cached_tokens == 0
    # a second request with the same 48-token prefix takes it from the cache
    second = first[:48] + [7, 8, 9]
    ev2 = list(eng.generate(second, GREEDY))[-1]
    assert ev2.usage.cached_tokens == 48
    assert ev2.token_ids == alone(tiny_path, [second], config)[0]
    # the next turn of a conversation prefills only its new tokens
    turn2 = first + ev.token_ids + [5, 6, 7]
    ev3 = list(eng.generate(turn2, GREEDY))[-1]
    assert ev3.usage.cached_tokens == (len(first) + len(ev.token_ids) - 1) // bs * bs
    assert ev3.token_ids == alone(tiny_path, [turn2], config)[0]
    # a prompt made of cached blocks only: everything but the last token is reused, and the
    # shared last block is copied before that token's K/V is written again
    whole = first[:48]
    ev4 = list(eng.generate(whole, GREEDY))[-1]
    assert ev4.usage.cached_tokens == 47
    assert ev4.token_ids == alone(tiny_path, [whole], config)[0]
    # the same while the first holder still runs: its last block is shared, so it is copied
    a = eng.add_request(whole, GREEDY)
    eng.step()
    b = eng.add_request(whole, GREEDY)
    copies = []
    orig = eng.pool.copy_block
    eng.pool.copy_block = lambda g, src, dst: (copies.append((g, src, dst)), orig(g, src, dst))
    outs = [list(eng.stream(r))[-1] for r in (a, b)]
    del eng.pool.copy_block
    assert len(copies) == 2  # one per KV group
    assert outs[1].usage.cached_tokens == 47
    assert outs[0].token_ids == outs[1].token_ids == ev4.token_ids
    assert eng.usage().blocks_used == (0, 0)


def test_cancel_frees_blocks_and_prompt_too_long(tiny_path):
    llm = LLM.load(tiny_path, EngineConfig(n_ctx=64, n_threads=2))
    eng = llm.engine
    with pytest.raises(PromptError, match="64"):
        eng.add_request(list(range(3, 70)), GREEDY)
    with pytest.raises(PromptError, match="empty"):
        eng.add_request([], GREEDY)
    cancel_midway(eng)
    # a consumer that walks away cancels its request too
    s2 = eng.generate([1, 9, 9], SamplingParams(temperature=0.0, max_tokens=50))
    next(s2)
    s2.close()
    assert eng.usage().blocks_used == (0, 0) and not eng.has_work()


def test_background_loop_serves_threads(tiny_path):
    config = EngineConfig(n_ctx=256, n_threads=2)
    llm = LLM.load(tiny_path, config)
    prompts = tiny_prompts(6)
    expected = alone(tiny_path, prompts, config)
    results: dict[int, list[int]] = {}
    llm.engine.start()
    try:
        def client(i):
            evs = list(llm.engine.generate(prompts[i], GREEDY))
            results[i] = evs[-1].token_ids
            assert "".join(e.text for e in evs) == llm.tokenizer.decode(evs[-1].token_ids)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        llm.engine.stop()
    assert [results[i] for i in range(len(prompts))] == expected
    assert llm.engine.usage().blocks_used == (0, 0)


def test_sink_gets_the_stream_events_and_queue_depth(tiny_path):
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=1)
    llm = LLM.load(tiny_path, config)
    eng = llm.engine
    prompts = tiny_prompts(3)
    expected = alone(tiny_path, prompts, config)
    got: dict[int, list] = {}
    done = threading.Event()

    def sink(ev):
        got.setdefault(ev.request_id, []).append(ev)
        if len(got) == 3 and all(evs[-1].finish_reason for evs in got.values()):
            done.set()

    ids = [eng.add_request(p, GREEDY, sink=sink) for p in prompts]
    assert eng.num_waiting() == 3 and eng.num_running() == 0  # nothing stepped yet
    eng.step()
    assert eng.num_running() == 1 and eng.num_waiting() == 2  # max_seqs=1: the others queue
    eng.start()
    try:
        assert done.wait(60)
    finally:
        eng.stop()
    for rid, want in zip(ids, expected):
        evs = got[rid]
        assert [e.finish_reason for e in evs[:-1]] == [None] * (len(evs) - 1)
        assert evs[-1].token_ids == want and evs[-1].logprobs is None
        assert "".join(e.text for e in evs) == llm.tokenizer.decode(want)
    assert eng.num_waiting() == 0 and eng.usage().blocks_used == (0, 0)
    with pytest.raises(KeyError):  # a sink request has no queue for stream()
        list(eng.stream(eng.add_request(prompts[0], GREEDY, sink=sink)))


def test_logprobs_are_the_raw_log_softmax(tiny_path):
    from infer.engine.sampler import InvalidSamplingParams

    with pytest.raises(InvalidSamplingParams, match="logprobs"):
        SamplingParams(logprobs=21)
    llm = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2))
    eng = llm.engine
    prompt = tiny_prompts(1)[0]
    # a repeat penalty changes what is sampled, never the reported (raw) logprobs
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=3, repeat_penalty=1.3)
    evs = list(eng.generate(prompt, params))
    lps = [lp for e in evs for lp in e.logprobs]
    assert [lp.token_id for lp in lps] == evs[-1].token_ids
    # recompute each position's logits with a fresh engine, one greedy token at a time
    ref = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2, prefix_cache=False))
    seq = list(prompt)
    for lp in lps:
        captured = {}
        runner = ref.runner
        real = runner.forward_batch

        def spy(batch, pool, states=None):
            out = real(batch, pool, states)
            captured["row"] = np.array(out[-1], dtype=np.float64)
            return out

        runner.forward_batch = spy
        list(ref.engine.generate(seq, SamplingParams(temperature=0.0, max_tokens=1)))
        runner.forward_batch = real
        x = captured["row"]
        logsm = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        assert lp.logprob == pytest.approx(logsm[lp.token_id], abs=1e-4)
        order = np.argsort(-logsm, kind="stable")[:3]
        assert [t for t, _ in lp.top] == order.tolist()
        assert [v for _, v in lp.top] == pytest.approx(logsm[order].tolist(), abs=1e-4)
        seq.append(lp.token_id)


def test_failed_step_ends_requests_and_loop_keeps_serving(tiny_path):
    llm = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2))
    eng = llm.engine
    real = llm.runner.forward_batch
    calls = {"n": 0}

    def flaky(batch, pool, states=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return real(batch, pool, states)

    llm.runner.forward_batch = flaky
    eng.start()
    try:
        prompts = tiny_prompts(2)
        ends = [list(eng.generate(p, GREEDY))[-1] for p in prompts[:1]]
        assert ends[0].finish_reason == "error" and isinstance(eng.last_error, RuntimeError)
        assert eng.usage().blocks_used == (0, 0)
        after = list(eng.generate(prompts[1], GREEDY))[-1]  # the loop survived
    finally:
        eng.stop()
    assert after.finish_reason == "length" and after.token_ids == alone(tiny_path, prompts[1:], EngineConfig(
        n_ctx=256, n_threads=2))[0]


def test_batched_equals_alone_gemma(gemma_path):
    config = EngineConfig(n_ctx=512, n_threads=2, max_seqs=8)
    llm = LLM.load(gemma_path, config)
    questions = ["Why is the sky blue?", "Write a haiku about rain.", "What is 17 times 23?",
                 "Name three rivers in Europe.", "Translate 'good morning' into French.",
                 "What does a compiler do?", "Give me a synonym for happy.", "Who wrote Hamlet?"]
    prompts = [llm.encode_chat([{"role": "user", "content": q}]) for q in questions]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    together, widest = run_all(llm, prompts, params)
    assert widest == 8
    solo = []
    for p in prompts:
        fresh = LLM(llm.model, config)
        solo.append(run_all(fresh, [p], params)[0][0])
    assert together == solo


def test_stream_closed_early_with_background_loop(tiny_path):
    """Ctrl-C in `infer chat` closes the stream while the loop thread steps: the request is
    cancelled, its blocks freed, and the engine keeps serving."""
    llm = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2))
    eng = llm.engine
    eng.start()
    try:
        s = eng.generate([1, 5, 6, 7], SamplingParams(temperature=0.0, max_tokens=200))
        next(s)
        s.close()
        after = list(eng.generate([1, 8, 9], GREEDY))[-1]
        assert after.finish_reason == "length" and len(after.token_ids) == GREEDY.max_tokens
        for _ in range(100):
            if not eng.has_work():
                break
            threading.Event().wait(0.05)
        left = {k: (r.done, r.events is None, r.seq.status, len(r.seq.output)) for k, r in eng._requests.items()}
        assert eng.usage().blocks_used == (0, 0) and eng.num_running() == 0 and not left, left
    finally:
        eng.stop()
    # a generator never started queues nothing
    eng.generate([1, 2, 3], GREEDY)
    assert not eng.has_work()


def test_failed_step_still_delivers_decided_finishes(tiny_path):
    llm = LLM.load(tiny_path, EngineConfig(n_ctx=256, n_threads=2))
    eng = llm.engine
    a = eng.add_request([1, 5, 6], SamplingParams(temperature=0.0, max_tokens=50))
    b = eng.add_request([1, 7, 8], SamplingParams(temperature=0.0, max_tokens=50))
    eng.step()
    eng.cancel(a)
    real = eng.runner.forward_batch

    def boom(*args):
        raise RuntimeError("backend failure")
    eng.runner.forward_batch = boom
    with pytest.raises(RuntimeError):
        eng.step()
    eng.runner.forward_batch = real
    evs_a = list(eng.stream(a))
    assert evs_a[-1].finish_reason == "cancelled"
    eng.fail_all(RuntimeError("backend failure"))
    assert list(eng.stream(b))[-1].finish_reason == "error"
    assert eng.usage().blocks_used == (0, 0) and not eng.has_work()
