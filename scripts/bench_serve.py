"""Streaming clients against `infer serve` and `python -m llama_cpp.server` on the same model.

    python scripts/bench_serve.py                       # the embedded model, 1, 4 and 8 clients
    python scripts/bench_serve.py model.gguf --threads 4 --max-tokens 64 --clients 1,2,4,8
    python scripts/bench_serve.py --infer-only          # without llama-cpp-python[server]

Each server runs alone (one after the other, same threads, same context, same prompts); each
level starts N clients at once, each streaming one completion of --max-tokens tokens at
temperature 0.  Reported per server and level: aggregate tok/s (tokens of all clients over the
wall time of the level), time to first token p50/p95 and inter-token latency p50/p95 (the gaps
between streamed chunks), then infer's figures divided by llama.cpp's.  Every prompt starts
differently, so neither server's prefix cache helps it.  llama_cpp.server runs one request at a
time (--interrupt_requests False, or a new request would cut the running one short).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TOPICS = ["a lighthouse keeper", "the history of bread", "a robot learning to paint", "how rivers form",
          "a chess tournament", "life on a space station", "the first winter of a fox", "an old clock shop"]


@dataclass
class Stream:
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc: subprocess.Popen, port: int, path: str, log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    proc.kill()
    sys.exit(f"the server did not come up in {timeout:.0f} s:\n{log.read_text()[-2000:]}")


def stream_one(port: int, prompt: str, max_tokens: int, out: Stream, start: threading.Barrier) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start.wait()
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return
        last = None
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if last is None:
                out.ttft = now - t0
            else:
                out.gaps.append(now - last)
            last = now
            out.tokens += 1
    except OSError as e:
        out.error = str(e)
    finally:
        conn.close()


def run_level(port: int, n: int, max_tokens: int, tag: str) -> dict:
    streams = [Stream() for _ in range(n)]
    barrier = threading.Barrier(n + 1)
    threads = [threading.Thread(target=stream_one, args=(
        port, f"Request {tag}-{i}. Write a long story about {TOPICS[i % len(TOPICS)]}.", max_tokens, s, barrier))
        for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    errors = [s.error for s in streams if s.error]
    if errors:
        sys.exit(f"{len(errors)} of {n} streams failed: {errors[0]}")
    ttfts = [s.ttft for s in streams]
    gaps = [g for s in streams for g in s.gaps]
    return {"clients": n, "tokens": sum(s.tokens for s in streams), "wall_s": wall,
            "tok_s": sum(s.tokens for s in streams) / wall,
            "ttft_p50_ms": pct(ttfts, 50) * 1000, "ttft_p95_ms": pct(ttfts, 95) * 1000,
            "itl_p50_ms": pct(gaps, 50) * 1000, "itl_p95_ms": pct(gaps, 95) * 1000}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1]


def bench_server(name: str, cmd: list[str], health: str, port: int, levels: list[int], max_tokens: int) -> list[dict]:
    log = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        wait_up(proc, port, health, log)
        run_level(port, 1, 4, f"{name}-warmup")
        rows = []
        for n in levels:
            row = run_level(port, n, max_tokens, f"{name}-{n}")
            row["server"] = name
            rows.append(row)
            print(f"  {name:<10} {n} clients: {row['tok_s']:.1f} tok/s", file=sys.stderr)
        return rows
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF path (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--clients", default="1,4,8", help="comma-separated concurrency levels")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--infer-only", action="store_true", help="skip llama_cpp.server")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    if args.model:
        model = str(Path(args.model).expanduser())
    else:
        from infer.models.default import default_model_path

        model = str(default_model_path())
    if not args.infer_only:
        try:
            import llama_cpp.server.app  # noqa: F401
        except ImportError as e:
            sys.exit(f"cannot start llama_cpp.server ({e}): pip install 'llama-cpp-python[server]', "
                     "or pass --infer-only")

    rows = []
    port = free_port()
    print(f"model {model}, threads {args.threads}, ctx {args.ctx}, {args.max_tokens} tokens per client",
          file=sys.stderr)
    rows += bench_server("infer", [sys.executable, "-m", "infer.cli", "serve", model, "--port", str(port),
                                   "--threads", str(args.threads), "--parallel", str(max(levels)),
                                   "--ctx", str(args.ctx)], "/health", port, levels, args.max_tokens)
    if not args.infer_only:
        port = free_port()
        rows += bench_server("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model", model,
                                           "--port", str(port), "--n_threads", str(args.threads),
                                           "--n_threads_batch", str(args.threads), "--n_ctx", str(args.ctx),
                                           "--interrupt_requests", "False", "--verbose", "False"],
                             "/v1/models", port, levels, args.max_tokens)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print("| server | clients | tok/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['server']} | {r['clients']} | {r['tok_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} "
              f"| {r['itl_p50_ms']:.1f} | {r['itl_p95_ms']:.1f} |")
    if not args.infer_only:
        by = {(r["server"], r["clients"]): r for r in rows}
        for n in levels:
            a, b = by["infer", n], by["llama.cpp", n]
            print(f"| infer / llama.cpp | {n} | {a['tok_s'] / b['tok_s']:.2f}x | "
                  + " | ".join(f"{a[k] / b[k]:.2f}x" for k in ("ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms",
                                                                 "itl_p95_ms"))
                  + " |")


if __name__ == "__main__":
    main()
