"""The generate API: one request's tokens in, a stream of text chunks out.

`generate` is a generator so the CLI (and later the server) consume the same loop.
The KV cache, the sampler's RNG and the buffers are created once per request; the
per-token loop reuses them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .sampler import SamplingParams, make_rng, make_sampler
from .stop import StopMatcher


class PromptError(ValueError):
    """A prompt that cannot be run: empty, or longer than the context window."""


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0  # request start to first sampled token (prefill included)
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0  # tokens after the first, over the time after the first


@dataclass
class Chunk:
    """A piece of the stream: new text, the token that produced it, and on the last chunk why it ended."""

    text: str
    token_id: int | None = None
    finish_reason: str | None = None  # "stop" (end-of-generation token or stop string) or "length"
    stats: GenerationStats | None = None
    token_ids: list[int] = field(default_factory=list)  # on the last chunk: every generated token


def generate(runner, tokenizer, prompt_ids: list[int], params: SamplingParams, n_ctx: int) -> Iterator[Chunk]:
    """Stream the completion of prompt_ids under params with `runner` (a backend transformer)."""
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise PromptError("the prompt is empty: nothing to continue from")
    if n_prompt >= n_ctx:
        raise PromptError(
            f"the prompt has {n_prompt} tokens but the context holds {n_ctx}; shorten it or raise --ctx"
        )
    t_start = time.perf_counter()
    cache = runner.new_kv_cache(n_ctx)
    sample = make_sampler(params)
    rng = make_rng(params.seed)
    history = np.zeros(n_ctx, np.int32)
    history[:n_prompt] = prompt_ids
    step = np.zeros(1, np.int32)
    detok = tokenizer.detokenizer()
    stop = StopMatcher(tuple(params.stop))
    eog = tokenizer.eog_ids
    stats = GenerationStats(prompt_tokens=n_prompt)
    generated: list[int] = []

    logits = runner.forward(history[:n_prompt], 0, cache)
    t_prefill = time.perf_counter()
    stats.prefill_tok_s = n_prompt / max(t_prefill - t_start, 1e-9)
    n = n_prompt
    finish = "length"
    hit_stop_string = False
    t_first = t_prefill
    while len(generated) < params.max_tokens:
        tok = int(sample(logits[0], history[:n], rng))
        if not generated:
            t_first = time.perf_counter()
            stats.ttft_ms = (t_first - t_start) * 1000
        if tok in eog:
            finish = "stop"
            break
        generated.append(tok)
        history[n] = tok
        n += 1
        text, stopped = stop.feed(detok.add(tok))
        if text:
            yield Chunk(text, tok)
        if stopped:
            finish, hit_stop_string = "stop", True
            break
        if n >= n_ctx or len(generated) >= params.max_tokens:
            break
        step[0] = tok
        logits = runner.forward(step, n - 1, cache)
    t_end = time.perf_counter()
    stats.completion_tokens = len(generated)
    if len(generated) > 1:
        stats.decode_tok_s = (len(generated) - 1) / max(t_end - t_first, 1e-9)
    tail = ""
    if not hit_stop_string:
        # Release bytes the detokenizer and the stop matcher were still holding back.
        text, stopped = stop.feed(detok.flush())
        tail = text if stopped else text + stop.flush()
        if stopped:
            finish = "stop"
    yield Chunk(tail, None, finish, stats, generated)
