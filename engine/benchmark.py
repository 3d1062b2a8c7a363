"""Prefill and decode speed of an engine, the way llama-bench measures it, plus N parallel streams.

Each repetition runs (1) a prefill test: one request of prompt_tokens tokens, timed to its first
token, and (2) a decode test: `parallel` requests with short prompts generating gen_tokens each
(end-of-generation ignored), all admitted in the same step.  Every prompt is distinct, so the
prefix cache never shortens a measurement.

With a depth (llama-bench's -d) both tests run after that many tokens of context: the context is
computed once and then served from the prefix cache (llama-bench keeps it as a saved sequence
state), so the prefill test times its own prompt_tokens and the decode test reads the whole
context's K/V each step; for a hybrid model the cache's state snapshot at the context's end
(engine/state_slots.py) stands for it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from .engine import EngineConfigError
from .sampler import SamplingParams

_TEXT = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
         "report on renewable energy, citing wind, solar and hydroelectric capacity figures. ")


@dataclass
class BenchResult:
    prompt_tokens: int
    gen_tokens: int
    parallel: int
    repetitions: int
    prefill_tok_s: list[float]
    ttft_ms: list[float]
    decode_tok_s: list[float]  # per stream, averaged over the streams
    aggregate_decode_tok_s: list[float]
    depth: int = 0  # tokens of context both tests ran after (llama-bench's -d)

    @staticmethod
    def mean_sd(xs: list[float]) -> tuple[float, float]:
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def bench_prompt(tokenizer, n: int, variant: int, bos: bool = True) -> list[int]:
    """n token ids of ordinary text; `variant` changes the first block so no two prompts share a
    prefix (bos=False: a continuation, after a context)."""
    ids = tokenizer.encode(_TEXT, add_special=False, parse_special=False)
    rng = np.random.default_rng(variant)
    lead = rng.permutation(ids).tolist()[:16]
    out = ([tokenizer.bos_id] if bos and tokenizer.bos_id is not None else []) + lead
    while len(out) < n:
        out.extend(ids)
    return out[:n]


def _prefill(engine, prompt: list[int], cached: int = 0) -> tuple[float, float]:
    """(prompt tokens computed per second, ms to the first token); cached: the tokens of a context
    the prefix cache must serve (the test then times only what follows)."""
    t0 = time.perf_counter()
    last = list(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)))[-1]
    dt = time.perf_counter() - t0
    if last.usage.cached_tokens < cached:
        raise EngineConfigError(f"the prefix cache served {last.usage.cached_tokens} of the depth's {cached} "
                                "tokens: --kv-memory (or a hybrid model's --state-snapshots) too small")
    return (len(prompt) - last.usage.cached_tokens) / dt, last.usage.ttft_ms


def _decode(engine, prompts: list[list[int]], gen: int) -> tuple[float, float]:
    params = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)
    ids = [engine.add_request(p, params, keep_events=False) for p in prompts]
    first: dict[int, float] = {}
    end: dict[int, float] = {}
    count: dict[int, int] = {i: 0 for i in ids}
    while engine.has_work():
        evs = engine.step()
        now = time.perf_counter()
        for ev in evs:
            if ev.token_id is not None or ev.finish_reason is None:
                count[ev.request_id] += 1
                first.setdefault(ev.request_id, now)
            if ev.finish_reason is not None:
                end[ev.request_id] = now
    per_stream = [(gen - 1) / max(end[i] - first[i], 1e-9) for i in ids]
    aggregate = len(ids) * (gen - 1) / max(max(end.values()) - min(first.values()), 1e-9)
    return statistics.fmean(per_stream), aggregate


def run_bench(llm, prompt_tokens: int = 512, gen_tokens: int = 128, parallel: int = 1,
              repetitions: int = 3, depth: int = 0) -> BenchResult:
    if prompt_tokens < 1 or gen_tokens < 2 or parallel < 1 or repetitions < 1 or depth < 0:
        raise EngineConfigError("bench needs -p >= 1, -n >= 2, --parallel >= 1, --repetitions >= 1 and -d >= 0")
    eng = llm.engine
    if depth + prompt_tokens >= eng.n_ctx or depth + 8 + gen_tokens > eng.n_ctx:
        raise EngineConfigError(f"-d {depth} / -p {prompt_tokens} / -n {gen_tokens} do not fit the context of "
                                f"{eng.n_ctx}; raise --ctx")
    if parallel > eng.config.max_seqs:
        raise EngineConfigError(f"--parallel {parallel} exceeds the engine's {eng.config.max_seqs} sequences")
    tok = llm.tokenizer
    # warm-up: compiles (or loads) every kernel and touches the buffers
    _prefill(eng, bench_prompt(tok, min(prompt_tokens, 32), 999))
    context: list[int] = []
    if depth:  # computed once (untimed); each test's prompt then continues it from the prefix cache
        context = bench_prompt(tok, depth, 3 * 10**6)
        _prefill(eng, context + bench_prompt(tok, 1, 3 * 10**6 + 1, bos=False))
    served = depth // eng.usage().block_size * eng.usage().block_size  # the cache keeps whole blocks
    res = BenchResult(prompt_tokens, gen_tokens, parallel, repetitions, [], [], [], [], depth)
    for r in range(repetitions):
        # the engine's step count makes the prompts of every call distinct
        pf, ttft = _prefill(eng, context + bench_prompt(tok, prompt_tokens, 10**6 + eng.steps, bos=not depth), served)
        res.prefill_tok_s.append(pf)
        res.ttft_ms.append(ttft)
        prompts = [context + bench_prompt(tok, 8, 2 * 10**6 + 100 * eng.steps + i, bos=not depth)
                   for i in range(parallel)]
        per, agg = _decode(eng, prompts, gen_tokens)
        res.decode_tok_s.append(per)
        res.aggregate_decode_tok_s.append(agg)
    return res
