"""Soak `infer serve`: many clients for a long time, as real traffic mixes it, and what the server
looks like afterwards.

16 client threads (--clients) for 20 minutes (--minutes) against a fresh `infer serve` (the
embedded model unless MODEL is given), each looping over a random mix: streamed and plain chat
completions and completions, short and long replies, prompts near the context limit, multi-turn
conversations that share a prefix, clients that disconnect mid-stream and requests that are
cancelled by closing the connection at once, plus the odd bad request (expected 4xx).

Reported: requests by outcome (expected errors by kind; anything else is unexpected), p50/p99
time to first token and inter-token latency per period, the server's RSS per period (growth after
the warm-up period, the first --warmup minutes, should stay within 5%), and at the end KV blocks
in use (0), and the server's open file descriptors and threads against the end of the warm-up.

    python scripts/soak_serve.py [MODEL] [--clients 16] [--minutes 20] [--period 60] [--threads 2]
"""
from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

CTX = 2048
WORDS = ("the quick brown fox jumps over the lazy dog while a small model writes careful answers about "
         "rivers mountains kernels caches tokens numbers and the weather of distant places").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: collections.Counter = collections.Counter()
        self.ttft: dict[int, list[float]] = collections.defaultdict(list)  # period -> seconds
        self.itl: dict[int, list[float]] = collections.defaultdict(list)
        self.t0 = time.time()

    def period(self, period_s: float) -> int:
        return int((time.time() - self.t0) // period_s)

    def add(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1


def request(port: int, body: dict, path: str, stats: Stats, period_s: float, drop_after: int | None = None) -> str:
    """One request; its outcome. drop_after: close the connection after that many streamed chunks."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t = time.time()
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        if drop_after == 0:
            return "cancelled at once"
        r = conn.getresponse()
        if r.status != 200:
            data = json.loads(r.read() or b"{}")
            code = (data.get("error") or {}).get("code") if isinstance(data.get("error"), dict) else "?"
            return f"http {r.status} {code}" if r.status < 500 else f"UNEXPECTED http {r.status} {code}"
        if not body.get("stream"):
            data = json.loads(r.read())
            return "ok" if data.get("choices") else "UNEXPECTED empty reply"
        first, last, chunks = None, None, 0
        for line in r:
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                break
            now = time.time()
            p = stats.period(period_s)
            if first is None:
                first = now
                with stats.lock:
                    stats.ttft[p].append(now - t)
            elif last is not None:
                with stats.lock:
                    stats.itl[p].append(now - last)
            last = now
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                return "disconnected mid-stream"
        return "ok stream"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return f"UNEXPECTED {type(e).__name__}"
    finally:
        conn.close()


def client(port: int, seed: int, stop_at: float, stats: Stats, period_s: float) -> None:
    rng = random.Random(seed)
    history: list[dict] = []
    while time.time() < stop_at:
        kind = rng.random()
        if kind < 0.35:  # a conversation: each turn repeats the previous ones (prefix sharing)
            if len(history) > 8:
                history = []
            history.append({"role": "user", "content": text(rng, rng.randint(5, 40))})
            body = {"messages": history, "max_tokens": rng.choice([8, 32, 96]), "stream": rng.random() < 0.7}
            out = request(port, body, "/v1/chat/completions", stats, period_s)
            history.append({"role": "assistant", "content": "ok"})
        elif kind < 0.55:
            body = {"prompt": text(rng, rng.randint(10, 200)), "max_tokens": rng.choice([16, 64, 200]),
                    "stream": rng.random() < 0.5, "temperature": rng.choice([0, 0.8])}
            out = request(port, body, "/v1/completions", stats, period_s)
        elif kind < 0.65:  # near the context limit
            body = {"prompt": text(rng, int(CTX * 0.7)), "max_tokens": 8, "stream": True}
            out = request(port, body, "/v1/completions", stats, period_s)
        elif kind < 0.8:  # gone mid-stream
            body = {"messages": [{"role": "user", "content": text(rng, 30)}], "max_tokens": 200, "stream": True}
            out = request(port, body, "/v1/chat/completions", stats, period_s, drop_after=rng.randint(1, 10))
        elif kind < 0.9:  # cancelled before an answer
            body = {"messages": [{"role": "user", "content": text(rng, 30)}], "max_tokens": 100}
            out = request(port, body, "/v1/chat/completions", stats, period_s, drop_after=0)
        else:  # bad requests: a 4xx is the right answer
            body = rng.choice([{"messages": "nope"}, {"prompt": text(rng, 5), "max_tokens": 10 * CTX},
                               {"prompt": text(rng, 5), "temperature": -1}, {"messages": [], "n": 3}])
            out = request(port, body, rng.choice(["/v1/chat/completions", "/v1/completions"]), stats, period_s)
        stats.add(out)


def proc_status(pid: int) -> dict:
    s = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) / 1024
    threads = int(re.search(r"Threads:\s+(\d+)", s).group(1))
    return {"rss_mb": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([-\d.e+]+)$", body, re.M)}


def pct(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100)[p - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--period", type=float, default=60, help="seconds per reported period")
    ap.add_argument("--warmup", type=float, default=2, help="minutes before RSS growth is counted")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    a = ap.parse_args(argv)
    port = free_port()
    cmd = [sys.executable, "-m", "infer.cli", "serve", *([a.model] if a.model else []), "--port", str(port),
           "--threads", str(a.threads), "--parallel", str(a.parallel), "--ctx", str(CTX), "--max-queue", "256"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"infer serve exited: {server.stderr.read()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 1}),
                             {"Content-Type": "application/json"})
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        stats = Stats()
        stop_at = time.time() + a.minutes * 60
        workers = [threading.Thread(target=client, args=(port, i, stop_at, stats, a.period), daemon=True)
                   for i in range(a.clients)]
        for w in workers:
            w.start()
        samples = []
        start = None  # fds and threads once warmed up: the executor's worker threads exist by then
        while any(w.is_alive() for w in workers):
            time.sleep(min(a.period, 10))
            samples.append((stats.period(a.period), proc_status(server.pid)))
            if start is None and time.time() - stats.t0 >= a.warmup * 60:
                start = samples[-1][1]
        start = start or samples[0][1]
        for w in workers:
            w.join()
        time.sleep(2)  # cancelled requests' finishes drain
        end, m = proc_status(server.pid), metrics(port)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    total = sum(stats.outcomes.values())
    unexpected = {k: v for k, v in stats.outcomes.items() if k.startswith("UNEXPECTED")}
    print(f"{a.clients} clients, {a.minutes:g} min: {total} requests; " + ", ".join(
        f"{k} {v}" for k, v in sorted(stats.outcomes.items())))
    print("| period | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    rss_by_period: dict[int, float] = {}
    for p, st in samples:
        rss_by_period[p] = max(rss_by_period.get(p, 0), st["rss_mb"])
    for p in sorted(set(stats.ttft) | set(rss_by_period)):
        t, i = stats.ttft.get(p, []), stats.itl.get(p, [])
        print(f"| {p} | {pct(t, 50) * 1e3:.0f} | {pct(t, 99) * 1e3:.0f} | {pct(i, 50) * 1e3:.1f} | "
              f"{pct(i, 99) * 1e3:.1f} | {rss_by_period.get(p, float('nan')):.0f} |")
    warm = [st["rss_mb"] for p, st in samples if p * a.period >= a.warmup * 60]
    growth = (warm[-1] - warm[0]) / warm[0] * 100 if len(warm) >= 2 else float("nan")
    print(f"RSS after warm-up: {warm[0] if warm else float('nan'):.0f} -> {warm[-1] if warm else float('nan'):.0f} MiB "
          f"({growth:+.1f}%, bound +5%)")
    print(f"KV blocks in use at the end: {m.get('infer_kv_blocks_used', float('nan')):.0f}; running "
          f"{m.get('infer_requests_running', 0):.0f}, waiting {m.get('infer_requests_waiting', 0):.0f}")
    print(f"file descriptors {start['fds']} -> {end['fds']}, threads {start['threads']} -> {end['threads']}")
    ok = (not unexpected and m.get("infer_kv_blocks_used", 1) == 0 and end["fds"] <= start["fds"]
          and end["threads"] <= start["threads"] and not growth > 5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
