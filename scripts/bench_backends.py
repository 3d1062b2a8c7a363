"""Prefill and decode speed of every available backend on one model, as one table.

Each backend runs infer.engine.benchmark.run_bench (what `infer bench` runs) in turn, in this
process, on the same model and settings.

    python scripts/bench_backends.py [--model PATH] [-p 512] [-n 128] [-r 1] [--threads 2] [--backends cpu,mlx]
"""
from __future__ import annotations

import argparse
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded Gemma 3 270M Q4_K_M)")
    p.add_argument("-p", "--prompt-tokens", type=int, default=512)
    p.add_argument("-n", "--gen-tokens", type=int, default=128)
    p.add_argument("-r", "--repetitions", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: every core)")
    p.add_argument("--backends", default="", help="comma-separated (default: every available backend)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from infer.engine.benchmark import BenchResult, run_bench
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM, probe_all
    from infer.models.default import default_model_path

    available = {b.name: b for b in probe_all()}
    names = [n for n in args.backends.split(",") if n] or [n for n, b in available.items() if b.available]
    path = args.model or default_model_path()
    rows = []
    for name in names:
        if name not in available or not available[name].available:
            reason = available[name].reason if name in available else "unknown backend"
            print(f"{name}: skipped ({reason})", file=sys.stderr)
            continue
        config = EngineConfig(n_ctx=max(4096, args.prompt_tokens + 1), n_threads=args.threads, max_seqs=1,
                              backend=name)
        llm = LLM.load(path, config)
        res = run_bench(llm, args.prompt_tokens, args.gen_tokens, 1, args.repetitions)
        pp, tg, ttft = (BenchResult.mean_sd(x)[0] for x in (res.prefill_tok_s, res.decode_tok_s, res.ttft_ms))
        rows.append((name, ", ".join(llm.runner.devices()), getattr(llm.runner, "n_threads", "-"), pp, tg, ttft))
        print(f"{name}: pp{args.prompt_tokens} {pp:.2f} t/s, tg{args.gen_tokens} {tg:.2f} t/s", file=sys.stderr)
    print(f"model: {path}\n")
    print(f"| {'backend':<10} | {'device':<40} | {'threads':>7} | {'pp' + str(args.prompt_tokens) + ' t/s':>11} "
          f"| {'tg' + str(args.gen_tokens) + ' t/s':>11} | {'ttft ms':>9} |")
    print(f"|{'-' * 12}|{'-' * 42}|{'-' * 9}|{'-' * 13}|{'-' * 13}|{'-' * 11}|")
    for name, dev, threads, pp, tg, ttft in rows:
        print(f"| {name:<10} | {dev[:40]:<40} | {threads!s:>7} | {pp:>11.2f} | {tg:>11.2f} | {ttft:>9.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
