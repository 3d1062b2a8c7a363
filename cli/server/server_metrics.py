"""The server's Prometheus metrics: counters, gauges read from the engine, latency histograms."""
from __future__ import annotations

import bisect
import math

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics",
          "/api/chat", "/api/generate", "/api/embed")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, x)] += 1
        self.sum += x
        self.count += 1

    def render(self, name: str, help: str) -> list[str]:
        out = [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
        acc = 0
        for le, c in zip((*self.buckets, math.inf), self.counts):
            acc += c
            out.append(f'{name}_bucket{{le="{"+Inf" if le == math.inf else le}"}} {acc}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """Counters kept by the event loop thread (so no locks); gauges are read from the engine."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.ttft = Histogram((0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))
        self.itl = Histogram((0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5))

    def count_request(self, path: str, status: int) -> None:
        key = (path if path in ROUTES else "other", status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def render(self, engines: list) -> str:
        """The counters, and the gauges summed over the engines (the models loaded)."""
        kvs = [e.usage() for e in engines]
        used = sum(sum(kv.blocks_used) for kv in kvs)
        total = sum(sum(kv.blocks_total) for kv in kvs)
        lines = ["# HELP infer_requests_total HTTP requests answered, by route and status",
                 "# TYPE infer_requests_total counter"]
        for (path, status), n in sorted(self.requests.items()):
            lines.append(f'infer_requests_total{{route="{path}",status="{status}"}} {n}')

        def one(name: str, kind: str, help: str, value: float) -> None:
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name} {value}"])

        one("infer_prompt_tokens_total", "counter", "prompt tokens of finished requests", self.prompt_tokens)
        one("infer_prompt_tokens_cached_total", "counter", "prompt tokens taken from the prefix cache",
            self.cached_tokens)
        one("infer_generation_tokens_total", "counter", "tokens generated", self.completion_tokens)
        one("infer_requests_waiting", "gauge", "requests queued for a running slot", sum(e.num_waiting() for e in engines))
        one("infer_requests_running", "gauge", "sequences running", sum(e.num_running() for e in engines))
        one("infer_kv_blocks_used", "gauge", "KV cache blocks held by sequences", used)
        one("infer_kv_blocks_free", "gauge", "KV cache blocks free (cached prefixes included)", total - used)
        one("infer_kv_blocks_cached", "gauge", "free KV blocks still holding a reusable prefix", sum(sum(kv.blocks_cached) for kv in kvs))
        one("infer_kv_blocks_total", "gauge", "KV cache blocks", total)
        one("infer_prefix_cache_hit_rate", "gauge", "prompt tokens found in the prefix cache / tokens looked up",
            round(_hit_rate(engines), 6))
        one("infer_spec_draft_tokens_total", "counter", "speculative decoding: tokens drafted",
            sum(e.drafted for e in engines))
        one("infer_spec_accepted_tokens_total", "counter", "speculative decoding: drafted tokens the model agreed with",
            sum(e.accepted for e in engines))
        one("infer_preemptions_total", "counter", "sequences preempted for lack of KV blocks",
            sum(e.scheduler.n_preempted for e in engines))
        lines += self.ttft.render("infer_time_to_first_token_seconds", "request queued to first token")
        lines += self.itl.render("infer_inter_token_latency_seconds", "time between streamed tokens")
        return "\n".join(lines) + "\n"



def _hit_rate(engines: list) -> float:
    looked = sum(e.blocks.lookup_tokens for e in engines)
    return sum(e.blocks.hit_tokens for e in engines) / looked if looked else 0.0
