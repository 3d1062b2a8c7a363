"""Constrained decoding's cost inside continuous batching: aggregate decode tok/s of N streams held
to a JSON schema against N free streams, same model, same prompts, same run (issue target: the
constrained streams lose <= 10%).

    python scripts/bench_grammar.py [--model PATH] [--threads 2] [--parallel 8] [--tokens 64] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

# long outputs: an array of at least 40 short records, so the grammar is exercised on every token and
# no stream ends before max_tokens (streams that end early would leave smaller batches behind)
SCHEMAS = {
    "records": {"type": "array", "minItems": 40, "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False}},
    # inside a string nearly every token is allowed: the widest masks
    "strings": {"type": "array", "minItems": 40, "items": {"type": "string", "maxLength": 400}},
}


def run(eng, prompts, params) -> float:
    """Aggregate decode tok/s of the prompts run together: tokens after each stream's first, over
    the time from the first sampled token to the end (the prefills mostly before it)."""
    for p in prompts:
        eng.add_request(p, params, keep_events=False)
    first, tokens = None, 0
    while eng.has_work():
        events = eng.step()
        if first is None and events:
            first = time.perf_counter()
        tokens += sum(ev.usage.completion_tokens - 1 for ev in events if ev.finish_reason is not None)
    return tokens / (time.perf_counter() - first)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)

    import numba

    from infer.engine.engine import EngineConfig
    from infer.engine.grammar import Grammar
    from infer.engine.llm import LLM
    from infer.engine.sampler import SamplingParams
    from infer.models.resolve import resolve_model

    numba.set_num_threads(a.threads)
    llm = LLM.load(resolve_model(a.model), EngineConfig(n_ctx=2048, n_threads=a.threads, max_seqs=a.parallel))
    eng = llm.engine
    prompts = [llm.encode_chat([{"role": "user", "content": f"List {i + 3} people as JSON records."}])
               for i in range(a.parallel)]
    free = SamplingParams(temperature=0.8, seed=1, max_tokens=a.tokens, ignore_eos=True)
    run(eng, prompts, free)  # warm-up
    print(f"model {a.model or 'embedded'}, threads {a.threads}, {a.parallel} streams, {a.tokens} tokens each")
    for name, schema in SCHEMAS.items():
        grammar = Grammar.json_schema(schema)
        t0 = time.perf_counter()
        eng.grammars.compile(grammar)
        print(f"{name}: compiled in {time.perf_counter() - t0:.2f} s (the first also hands the vocabulary over)")
        held = SamplingParams(temperature=0.8, seed=1, max_tokens=a.tokens, grammar=grammar)
        fr, co = [], []
        for r in range(a.rounds):
            fr.append(run(eng, prompts, free))
            co.append(run(eng, prompts, held))
            print(f"  round {r}: free {fr[-1]:.1f} tok/s, constrained {co[-1]:.1f} tok/s")
        f, c = statistics.median(fr), statistics.median(co)
        print(f"{name}: aggregate decode free {f:.1f} tok/s, constrained {c:.1f} tok/s: "
              f"{100 * (1 - c / f):.1f}% lost (target <= 10%)")


if __name__ == "__main__":
    main()
