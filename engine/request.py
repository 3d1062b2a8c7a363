"""One request inside the engine: its sequence, sampler and detokenizer state, and the events it
produces (Event, with Usage at its end)."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .grammar import LazyGrammar
from .pooling import Pooler
from .sampler import SamplingParams, TokenLogprob, make_rng, make_sampler
from .scheduler import Sequence
from .stop import StopMatcher


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache instead of computed
    ttft_ms: float = 0.0  # request added to first token (queueing and prefill included)
    prefill_tok_s: float = 0.0  # prompt tokens computed per second, from admission to first token
    decode_tok_s: float = 0.0  # tokens after the first, over the time after the first
    drafted_tokens: int = 0  # speculative decoding: tokens proposed for verification
    accepted_tokens: int = 0  # and those the model agreed with


@dataclass
class Event:
    """A piece of one request's stream: new text and the token that produced it; the last event
    of a request has a finish_reason ("stop", "length", "cancelled" or "error"), its usage and every
    generated token id; an embedding request (add_embedding) has only that event, with its pooled
    vector (not normalized) in `embedding`.  With SamplingParams.logprobs set, `logprobs` has one entry per token
    generated since the previous event (a token whose text is held back reports with the next)."""

    request_id: int
    text: str
    token_id: int | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    embedding: np.ndarray | None = None  # (n_embd,) float32
    stop_word: str | None = None  # the finish event's, when a stop string ended the reply (llama-server's stopping_word)


EventSink = Callable[[Event], None]


class Request:
    def __init__(self, rid: int, prompt: list[int], params: SamplingParams, tokenizer, n_ctx: int, keep: bool,
                 sink: EventSink | None = None, grammar=None, pooler: Pooler | None = None):
        # an embedding's hidden states must all be computed (but "last" needs only the last token's)
        self.seq = Sequence(rid, list(prompt), len(prompt),
                            reuse_prefix=pooler is None or pooler.kind == "last", transient=pooler is not None)
        self.pooler = pooler
        self.params = params
        # the matcher holding the reply now; a lazy grammar's waits for its trigger
        self.grammar, self.waiting = (None, LazyGrammar(grammar, params.grammar_triggers, params.thinking)) \
            if params.grammar_triggers else (grammar, None)
        self.sample = make_sampler(params)
        self.rng = make_rng(params.seed)
        # the sampler's view of seq.tokens (an embedding samples nothing: its prompt only)
        self.history = np.zeros(n_ctx if pooler is None else len(prompt), np.int32)
        self.history[:len(prompt)] = prompt
        self.detok = tokenizer.detokenizer(special=params.special)
        self.stop = StopMatcher(tuple(params.stop))
        self.events: queue.SimpleQueue[Event] | None = queue.SimpleQueue() if keep and sink is None else None
        self.sink = sink
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None  # not yet reported
        self.t_added = time.perf_counter()
        self.t_admitted = 0.0
        self.t_first = 0.0
        self.done = False
        self.drafted = 0  # speculative tokens proposed, and accepted
        self.accepted = 0
