"""Running requests through an engine for the tests that compare ways of running them: every
prompt at once, each alone on a fresh engine, one cancelled midway."""
from __future__ import annotations

import numpy as np

from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def tiny_prompts(n: int = 8) -> list[list[int]]:
    rng = np.random.default_rng(5)
    shared = [1] + rng.integers(3, 320, 20).tolist()
    out = []
    for i in range(n):
        tail = rng.integers(3, 320, int(rng.integers(3, 40))).tolist()
        out.append((shared if i % 2 else [1]) + tail)  # half share a 21-token prefix
    return out


def run_all(llm: LLM, prompts, params=GREEDY) -> tuple[list[list[int]], int]:
    """Submit every prompt at once and step until done; (tokens per prompt, most sequences in one step)."""
    eng = llm.engine
    ids = [eng.add_request(p, params, keep_events=False) for p in prompts]
    out: dict[int, list[int]] = {}
    widest = 0
    while eng.has_work():
        for ev in eng.step():
            if ev.finish_reason is not None:
                out[ev.request_id] = ev.token_ids
        widest = max(widest, len(eng.scheduler.running))
    return [out[i] for i in ids], widest


def alone(path, prompts, config, params=GREEDY) -> list[list[int]]:
    res = []
    for p in prompts:
        llm = LLM.load(path, config)  # a fresh engine: no cache, nothing else running
        res.append(run_all(llm, [p], params)[0][0])
    return res


def cancel_midway(eng, during=None) -> None:
    """A long request cancelled after 5 tokens ends "cancelled" with every block free (during():
    more checks while it runs)."""
    rid = eng.add_request([1, 5, 6, 7], SamplingParams(temperature=0.0, max_tokens=50))
    stream = eng.stream(rid)
    for _ in range(5):
        next(stream)
    assert sum(eng.usage().blocks_used) > 0
    if during is not None:
        during()
    eng.cancel(rid)
    assert list(stream)[-1].finish_reason == "cancelled"
    assert not any(eng.usage().blocks_used) and not eng.has_work()
    states = eng.scheduler.states  # a hybrid model's state slots: all given back
    assert states is None or states.n_free == states.n_slots
