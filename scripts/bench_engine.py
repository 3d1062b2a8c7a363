"""The engine core's acceptance numbers, measured in one run on the same model:

1. prefix cache: TTFT of a request with a ~1000-token prompt, then of a second request that
   shares the first 1000 tokens (different question at the end); target second <= 20% of first.
2. continuous batching: aggregate decode tok/s with 8 parallel streams vs one stream
   (the `infer bench` decode test); target >= 3x.

    python scripts/bench_engine.py [--model PATH] [--threads 2] [--gen-tokens 64] [--repetitions 3]
"""
from __future__ import annotations

import argparse
import statistics


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--repetitions", type=int, default=3)
    a = p.parse_args(argv)

    import numba

    from infer.engine.benchmark import bench_prompt, run_bench
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.engine.sampler import SamplingParams
    from infer.models.resolve import resolve_model

    numba.set_num_threads(a.threads)
    llm = LLM.load(resolve_model(a.model), EngineConfig(n_ctx=4096, n_threads=a.threads, max_seqs=a.parallel))
    eng = llm.engine
    tok = llm.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=4)
    run_bench(llm, 32, 4, 1, 1)  # warm-up: kernels compiled or loaded

    print(f"model: {llm.model.path.name}, threads {a.threads}")
    firsts, seconds = [], []
    for r in range(a.repetitions):
        prefix = bench_prompt(tok, a.prefix_tokens, 5000 + r)
        q1 = tok.encode(" Question: what is the report about?", add_special=False, parse_special=False)
        q2 = tok.encode(" Question: which energy sources are cited?", add_special=False, parse_special=False)
        e1 = list(eng.generate(prefix + q1, params))[-1]
        e2 = list(eng.generate(prefix + q2, params))[-1]
        firsts.append(e1.usage.ttft_ms)
        seconds.append(e2.usage.ttft_ms)
        print(f"  prefix run {r}: first {e1.usage.prompt_tokens} tok, TTFT {e1.usage.ttft_ms:.1f} ms; "
              f"second {e2.usage.prompt_tokens} tok ({e2.usage.cached_tokens} from the cache), "
              f"TTFT {e2.usage.ttft_ms:.1f} ms")
    f, s = statistics.median(firsts), statistics.median(seconds)
    print(f"prefix cache: TTFT first {f:.1f} ms, second {s:.1f} ms: {100 * s / f:.1f}% (target <= 20%)")

    one = run_bench(llm, 64, a.gen_tokens, 1, a.repetitions)
    many = run_bench(llm, 64, a.gen_tokens, a.parallel, a.repetitions)
    s1 = statistics.median(one.aggregate_decode_tok_s)
    sn = statistics.median(many.aggregate_decode_tok_s)
    print(f"decode: 1 stream {s1:.1f} tok/s; {a.parallel} streams {sn:.1f} tok/s aggregate "
          f"({statistics.median(many.decode_tok_s):.1f} per stream): {sn / s1:.2f}x (target >= 3x)")
    kv = eng.usage()
    print(f"KV pool: {kv.bytes_total / 2**20:.1f} MiB, blocks per group {kv.blocks_total}, "
          f"prefix cache hit rate {100 * eng.prefix_hit_rate():.1f}% of looked-up prompt tokens")


if __name__ == "__main__":
    main()
