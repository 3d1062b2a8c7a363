"""Speculative decoding by prompt lookup (engine/speculative.py): drafts as llama.cpp's ngram-simple
makes them, and outputs token for token those of plain decoding (greedy and seeded), alone and
batched, through preemption, cancellation, stop strings, max_tokens and grammars."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.tiny_models import write_tiny_model
from infer.engine.engine import EngineConfig
from infer.engine.grammar import Grammar
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams
from infer.engine.speculative import STEP_TOKENS, SpecConfig, SpeculationError, ngram_draft

CODE = '''def fib(n):
    """The n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def primes(limit):
    """Every prime below limit."""
    sieve = [True] * limit
    out = []
    for i in range(2, limit):
        if sieve[i]:
            out.append(i)
            for j in range(i * i, limit, i):
                sieve[j] = False
    return out
'''
COPY = [{"role": "user", "content": "Repeat this code exactly, then stop:\n\n" + CODE}]


def test_ngram_draft_follows_llama_cpp():
    t = np.array([9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], np.int32)
    # the last 3 tokens (1 2 3) occurred at 9 and at 1: the most recent earlier one (9) is used
    assert ngram_draft(t, 3, 4) == [4, 5, 6, 7]
    assert ngram_draft(t, 3, 16) == []  # llama.cpp: the history must be longer than n + m + 1
    assert ngram_draft(np.array([5, 6, 7, 1, 2, 0, 0, 0, 0, 0, 0, 1, 2], np.int32), 2, 3) == [0, 0, 0]
    assert ngram_draft(np.arange(40, dtype=np.int32), 3, 4) == []  # nothing repeats
    # fewer than n tokens follow the most recent earlier occurrence: no draft (llama.cpp's rule)
    assert ngram_draft(np.array([0] * 8 + [1, 2, 1, 2, 1, 2], np.int32), 2, 2) == []


def test_spec_config_is_checked():
    with pytest.raises(SpeculationError, match="--spec takes ngram"):
        SpecConfig("medusa")
    with pytest.raises(SpeculationError, match="--draft-max"):
        SpecConfig("ngram", draft_max=0)
    c = SpecConfig("ngram", draft_max=16)
    assert c.room(1) == 16 and c.room(8) == STEP_TOKENS // 8 - 1 and c.room(STEP_TOKENS) == 0


@pytest.fixture(scope="module")
def gemma(gemma_path):
    plain = LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=4))
    spec = LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=4, spec=SpecConfig("ngram")))
    return plain, spec


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]):
    eng = llm.engine
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    out = []
    for r in rids:  # each request's finish event, carrying every logprob of its stream
        evs = list(eng.stream(r))
        evs[-1].logprobs = [lp for e in evs for lp in (e.logprobs or [])]
        out.append(evs[-1])
    return out


def test_greedy_output_is_plain_decoding(gemma):
    plain, spec = gemma
    prompt = plain.encode_chat(COPY)
    params = SamplingParams(temperature=0, max_tokens=200)
    (a,), (b,) = run(plain, [prompt], [params]), run(spec, [prompt], [params])
    assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
    assert b.usage.drafted_tokens > 0 and b.usage.accepted_tokens > 0  # it did speculate, and it paid
    assert a.usage.drafted_tokens == 0
    assert spec.engine.usage().blocks_used == (0,) * len(spec.engine.usage().blocks_used)


def test_seeded_sampling_batched_stops_and_limits_are_plain_decoding(gemma):
    plain, spec = gemma
    prompt = plain.encode_chat(COPY)
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=120),
              SamplingParams(temperature=0, max_tokens=37),  # ends inside a verified step
              SamplingParams(temperature=0, max_tokens=300, stop=("return out",)),
              SamplingParams(temperature=1.0, seed=5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=60),
              # penalties read the history the drafts extend; logprobs come from each verified row
              SamplingParams(temperature=0.9, seed=3, repeat_penalty=1.3, presence_penalty=0.5,
                             frequency_penalty=0.3, logprobs=3, max_tokens=80)]
    a, b = run(plain, [prompt] * 5, params), run(spec, [prompt] * 5, params)
    for x, y in zip(a, b):
        assert y.token_ids == x.token_ids and y.finish_reason == x.finish_reason and y.logprobs == x.logprobs
    assert len(b[4].logprobs) == len(b[4].token_ids) > 0
    assert len(b[1].token_ids) == 37 and b[1].finish_reason == "length"
    assert sum(e.usage.drafted_tokens for e in b) > 0


def test_grammar_constrained_speculation(gemma):
    plain, spec = gemma
    schema = '{"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}'
    msgs = [{"role": "user", "content": "Put this code in JSON as {\"code\": ...}:\n\n" + CODE}]
    params = SamplingParams(temperature=0, max_tokens=160, grammar=Grammar.json_schema(schema))
    (a,), (b,) = run(plain, [plain.encode_chat(msgs)], [params]), run(spec, [spec.encode_chat(msgs)], [params])
    assert b.token_ids == a.token_ids


def test_preemption_and_cancellation_in_verified_steps(gemma_path):
    """A pool too small for every stream: speculating sequences are preempted and recomputed, one
    is cancelled mid-stream; the rest decode exactly as plain decoding, every block comes back."""
    def engine(kind: str) -> LLM:
        return LLM.load(gemma_path, EngineConfig(n_ctx=512, n_threads=2, max_seqs=4, kv_memory=12 * 2**20,
                                                 spec=SpecConfig(kind, ngram_n=4)))

    outs = {}
    for kind in ("", "ngram"):
        llm = engine(kind)
        eng = llm.engine
        prompt = llm.encode_chat(COPY)
        rids = [eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=150)) for _ in range(3)]
        victim = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=150))
        for _ in range(40):
            eng.step()
        eng.cancel(victim)
        outs[kind] = [list(eng.stream(r))[-1] for r in rids]
        assert list(eng.stream(victim))[-1].finish_reason == "cancelled"
        assert eng.usage().blocks_used == (0,) * len(eng.usage().blocks_used)
        if kind:
            assert eng.scheduler.n_preempted > 0 and eng.drafted > 0
    assert [e.token_ids for e in outs["ngram"]] == [e.token_ids for e in outs[""]]


@pytest.mark.slow  # 1-2 s alone, 15-35 s when other work shares the two cores (threaded steps)
@pytest.mark.parametrize("arch", ["qwen2", "qwen3moe", "gemma3"])  # gemma3: a sliding window of 6
def test_tiny_models_greedy_identical(arch, tmp_path):
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    prompt = [1] + [5, 77, 300, 12, 260, 9] * 6  # a repeating prompt: drafts from the start
    params = SamplingParams(temperature=0, max_tokens=60)
    outs = []
    for kind in ("", "ngram"):
        llm = LLM.load(path, EngineConfig(n_ctx=256, n_threads=2, spec=SpecConfig(kind, ngram_n=1, draft_max=6)))
        outs.append(run(llm, [prompt, prompt[:20]], [params, params]))
    assert [e.token_ids for e in outs[1]] == [e.token_ids for e in outs[0]]
    assert sum(e.usage.drafted_tokens for e in outs[1]) > 0


@pytest.mark.reference
def test_the_llama_cpp_backend_refuses_speculation(gemma_path):
    pytest.importorskip("llama_cpp")
    with pytest.raises(SpeculationError, match="cpu or mlx backend"):
        LLM.load(gemma_path, EngineConfig(n_ctx=256, backend="llama.cpp", spec=SpecConfig("ngram")))


def test_draft_model_speculation(gemma_path, tmp_path):
    """--spec draft: the embedded model drafting for itself agrees on every greedy token; a tiny
    model drafting for another of its vocabulary is mostly wrong, and the output is unchanged."""
    prompt_msgs = [{"role": "user", "content": "Write a short poem about the sea."}]
    outs = {}
    for kind in ("", "draft"):
        llm = LLM.load(gemma_path, EngineConfig(n_ctx=512, n_threads=2, max_seqs=2,
                                                spec=SpecConfig(kind, draft=str(gemma_path) if kind else "", draft_max=4)))
        ids = llm.encode_chat(prompt_msgs)
        outs[kind] = run(llm, [ids, ids[:-3]], [SamplingParams(temperature=0, max_tokens=60)] * 2)
    assert [e.token_ids for e in outs["draft"]] == [e.token_ids for e in outs[""]]
    u = outs["draft"][0].usage
    assert u.drafted_tokens > 0 and u.accepted_tokens == u.drafted_tokens  # itself: every draft right
    target, draft = (write_tiny_model(tmp_path / f"{n}.gguf", "qwen2", seed=s) for n, s in (("t", 0), ("d", 1)))
    res = {}
    for kind, p_min in (("", 0.0), ("draft", 0.0), ("draft", 1.0)):
        llm = LLM.load(target, EngineConfig(n_ctx=256, n_threads=2, spec=SpecConfig(
            kind, draft=str(draft) if kind else "", draft_max=4, draft_p_min=p_min)))
        res[(kind, p_min)] = run(llm, [[1, 5, 7, 9] * k for k in (1, 2, 3)], [SamplingParams(temperature=0, max_tokens=30)] * 3)
    for key in (("draft", 0.0), ("draft", 1.0)):
        assert [e.token_ids for e in res[key]] == [e.token_ids for e in res[("", 0.0)]]
    assert sum(e.usage.drafted_tokens for e in res[("draft", 0.0)]) > 0
    assert sum(e.usage.drafted_tokens for e in res[("draft", 1.0)]) == 0  # nothing is that sure


def test_draft_model_of_another_vocabulary_is_refused(tmp_path):
    target = write_tiny_model(tmp_path / "t.gguf", "qwen2")
    other = write_tiny_model(tmp_path / "o.gguf", "qwen2", n_vocab=640)
    with pytest.raises(SpeculationError, match="same vocabulary"):
        LLM.load(target, EngineConfig(n_ctx=64, spec=SpecConfig("draft", draft=str(other))))
    with pytest.raises(SpeculationError, match="needs --draft"):
        SpecConfig("draft")


@pytest.mark.e2e
def test_cli_run_and_bench_with_speculation():
    import json
    import subprocess
    import sys

    def infer(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True, timeout=600)

    prompt = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,"
    common = ["--raw", "--temperature", "0", "-n", "40", "--threads", "2", "--json"]
    plain, spec = infer("run", prompt, *common), infer("run", prompt, *common, "--spec", "ngram")
    assert plain.returncode == spec.returncode == 0, plain.stderr + spec.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert b["token_ids"] == a["token_ids"] and b["drafted_tokens"] > 0 and a["drafted_tokens"] == 0
    bad = infer("run", "hi", "--spec", "medusa")
    assert bad.returncode == 1 and bad.stderr.strip() == "error: --spec takes ngram, draft, got 'medusa'"
    bench = infer("bench", "-p", "32", "-n", "16", "-r", "1", "--threads", "2", "--spec", "ngram", "--json")
    assert bench.returncode == 0, bench.stderr
    row = json.loads(bench.stdout)
    assert row["spec"] == "ngram" and "acceptance" in row
