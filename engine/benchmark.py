"""Prefill and decode speed of an engine, the way llama-bench measures it, plus N parallel streams.

Each repetition runs (1) a prefill test: one request of prompt_tokens tokens, timed to its first
token, and (2) a decode test: `parallel` requests with short prompts generating gen_tokens each
(end-of-generation ignored), all admitted in the same step.  Every prompt is distinct, so the
prefix cache never shortens a measurement.
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

    @staticmethod
    def mean_sd(xs: list[float]) -> tuple[float, float]:
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def bench_prompt(tokenizer, n: int, variant: int) -> list[int]:
    """n token ids of ordinary text; `variant` changes the first block so no two prompts share a prefix."""
    ids = tokenizer.encode(_TEXT, add_special=False, parse_special=False)
    rng = np.random.default_rng(variant)
    lead = rng.permutation(ids).tolist()[:16]
    out = ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + lead
    while len(out) < n:
        out.extend(ids)
    return out[:n]


def _prefill(engine, prompt: list[int]) -> tuple[float, float]:
    t0 = time.perf_counter()
    last = list(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)))[-1]
    dt = time.perf_counter() - t0
    return len(prompt) / dt, last.usage.ttft_ms


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
              repetitions: int = 3) -> BenchResult:
    if prompt_tokens < 1 or gen_tokens < 2 or parallel < 1 or repetitions < 1:
        raise EngineConfigError("bench needs -p >= 1, -n >= 2, --parallel >= 1 and --repetitions >= 1")
    eng = llm.engine
    if prompt_tokens >= eng.n_ctx or 8 + gen_tokens > eng.n_ctx:
        raise EngineConfigError(f"-p {prompt_tokens} / -n {gen_tokens} do not fit the context of {eng.n_ctx}; raise --ctx")
    if parallel > eng.config.max_seqs:
        raise EngineConfigError(f"--parallel {parallel} exceeds the engine's {eng.config.max_seqs} sequences")
    tok = llm.tokenizer
    # warm-up: compiles (or loads) every kernel and touches the buffers
    _prefill(eng, bench_prompt(tok, min(prompt_tokens, 32), 999))
    res = BenchResult(prompt_tokens, gen_tokens, parallel, repetitions, [], [], [], [])
    for r in range(repetitions):
        # the engine's step count makes the prompts of every call distinct
        pf, ttft = _prefill(eng, bench_prompt(tok, prompt_tokens, 10**6 + eng.steps))
        res.prefill_tok_s.append(pf)
        res.ttft_ms.append(ttft)
        prompts = [bench_prompt(tok, 8, 2 * 10**6 + 100 * eng.steps + i) for i in range(parallel)]
        per, agg = _decode(eng, prompts, gen_tokens)
        res.decode_tok_s.append(per)
        res.aggregate_decode_tok_s.append(agg)
    return res
