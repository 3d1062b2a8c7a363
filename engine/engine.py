"""The engine: many requests at once over one model, as a stream of per-request events.

add_request() queues a prompt with its sampling parameters and returns an id; each step() runs
one forward pass for every running sequence (continuous batching, see scheduler.py), samples
the sequences that reached their next token and emits events: a token with its text delta, and
at the end a finish event with the reason and usage.  add_request() and cancel() are safe to
call from any thread, while one thread steps the engine (start() runs such a loop in the
background; without it, stream() steps the engine itself).
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Iterator

import numpy as np

from infer.backends.base import BlockKVPool
from infer.backends.batch import Batch
from infer.quant.errors import InferError

from .block_manager import BlockManager, KVUsage
from .config import EngineConfig, EngineConfigError
from .grammar import CompiledGrammar, GrammarCompiler, GrammarError
from .kv_sizing import kv_pool_bytes, pool_blocks, state_slots_needed, state_snapshots
from .pooling import Pooler, PoolingError, apply_head, choose_pooling, row_pooling
from .request import Event, EventSink, Request, Usage
from .sampler import InvalidSamplingParams, SamplingParams, TokenLogprob, token_logprob
from .scheduler import ScheduledStep, Scheduler, Sequence
from .speculative import SpeculationError, ngram_draft
from .state_slots import StateSlots, StateSnapshots

__all__ = ["Engine", "EngineConfig", "EngineConfigError", "Event", "ModelRunError", "PromptError", "Usage"]


class PromptError(InferError, ValueError):
    """A prompt that cannot be run: empty, or longer than the context window."""


class ModelRunError(InferError, RuntimeError):
    """The model's forward pass failed (a corrupt file's weights: NaN scales, say); one line for the user."""


class Engine:
    def __init__(self, runner, tokenizer, model_config, config: EngineConfig = EngineConfig(), model_key: bytes = b"",
                 drafter=None, head=None):
        """head: the model's pooling head (models/pooling_head.py's PoolingHead), applied to every
        embedding after its pooling; None: the model has none."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.n_ctx = min(config.n_ctx, model_config.n_ctx_train)
        bs = config.block_size
        groups = model_config.kv_groups
        windows = [g.window for g in groups]
        per_block = runner.bytes_per_block(bs)
        state_bytes = runner.state_bytes_per_seq()
        n_blocks = self.pool_blocks(self.n_ctx, windows, per_block, config, state_bytes)
        self.pool = runner.new_kv_pool(n_blocks, bs)
        # a hybrid model's recurrent state: a slot per sequence that may run, a scratch slot each
        # under speculation, then the prefix cache's snapshots (state_slots.py)
        self.states = runner.new_state_pool(state_slots_needed(config)) if state_bytes else None
        recurrent = bool(model_config.recurrent_layers)  # whichever backend keeps the state
        if recurrent and self.states is None and config.spec.kind:
            raise SpeculationError(f"speculative decoding cannot run {model_config.arch} on {runner.backend}: "
                                   "its recurrent state cannot roll back a rejected draft there; drop --spec")
        # a non-causal model's (an encoder's) K/V depend on the tokens after them: no block of it is
        # ever found again by its prefix
        self.causal = model_config.causal
        self.model_name = model_config.name or model_config.arch
        self.blocks = BlockManager(n_blocks, bs, windows, model_key, per_block, on_free=self.pool.free_sequence,
                                   naming=config.prefix_cache and self.causal and (self.states is not None or not recurrent))
        budget = min(config.max_batch_tokens, runner.max_tokens)
        n_snap = state_snapshots(config) if self.states is not None else 0
        first_snap = state_slots_needed(config) - state_snapshots(config)  # the snapshots come last
        self.scheduler = Scheduler(self.blocks, config.max_seqs, budget,
                                   StateSlots(config.max_seqs) if self.states is not None else None,
                                   StateSnapshots(first_snap, n_snap) if n_snap else None,
                                   scratch=config.max_seqs,  # slot s's state before its draft: s + max_seqs
                                   whole_prompts=not self.causal)
        self.eog = tokenizer.eog_ids
        self.pooling = choose_pooling(model_config.pooling, config.pooling)
        self.head = head
        self._no_rank = (f"rank pooling needs a classification head ('cls' or 'cls.output' tensors), which this "
                         f"{model_config.arch} model does not have; use --pooling mean, cls or last")
        self._rows = row_pooling(self.pooling, model_config.causal, model_config.pooling_cls)
        if config.spec.kind and not isinstance(self.pool, BlockKVPool):  # rejected K/V just left behind in their blocks
            raise SpeculationError(f"speculative decoding needs the cpu or mlx backend, not {runner.backend}")
        self.spec = config.spec
        self.drafter = drafter  # draft.DraftModel when config.spec.kind is "draft"
        if config.spec.kind == "draft" and drafter is None:
            raise SpeculationError("--spec draft needs the draft model loaded (LLM does it)")
        self.drafted = 0  # every request's speculative tokens so far, proposed and accepted
        self.accepted = 0
        self.n_embd = model_config.n_embd
        # an embedding's length as it leaves the engine (a reranker's: its scores)
        self.n_out = head.out_dim(self.n_embd, self.pooling == "rank") if head is not None else self.n_embd
        self._hidden: np.ndarray | None = None  # (budget, n_embd): the hidden rows of a step, made at the first embedding
        self.grammars = GrammarCompiler(tokenizer)
        self._ids = itertools.count(1)
        self._requests: dict[int, Request] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("add", request) / ("cancel", id)
        self._step_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop_loop = False
        self.last_error: BaseException | None = None  # what made fail_all() end the running requests
        self.steps = 0

    # how much memory the pools take (kv_sizing.py), as Engine.* for the callers that size before loading
    pool_blocks = staticmethod(pool_blocks)
    kv_pool_bytes = staticmethod(kv_pool_bytes)

    # -- requests ---------------------------------------------------------------------------------

    def check_prompt(self, prompt: list[int]) -> None:
        if len(prompt) == 0:
            raise PromptError("the prompt is empty: nothing to continue from")
        if len(prompt) >= self.n_ctx:
            raise PromptError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx}; shorten it or raise --ctx"
            )

    def add_request(self, prompt: list[int], params: SamplingParams, keep_events: bool = True,
                    sink: EventSink | None = None, compiled: CompiledGrammar | None = None) -> int:
        """Queue a request; returns its id.  Events go to stream(id) unless keep_events is False
        (then only step()'s return value carries them) or a sink is given: then sink(event) is
        called with each one from the stepping thread, so it must be quick and must not block
        (an asyncio server passes loop.call_soon_threadsafe with its queue's put_nowait).
        compiled: params.grammar compiled already (grammars.compile, which can take a second);
        else it is compiled here, in the caller's thread: a bad grammar is the caller's GrammarError."""
        self.check_prompt(prompt)
        if not self.causal:
            raise PromptError(f"{self.model_name} is an embedding model: use `infer embed` or /v1/embeddings")
        bad = [t for t, _ in params.logit_bias if t >= self.tokenizer.vocab_size]
        if bad:
            raise InvalidSamplingParams(f"logit_bias names token {bad[0]}, past the vocabulary "
                                        f"({self.tokenizer.vocab_size} tokens)", field="logit_bias")
        if params.grammar is not None and compiled is None:
            compiled = self.grammars.compile(params.grammar)
        grammar = compiled.matcher() if params.grammar is not None else None
        rid = next(self._ids)
        self._inbox.put(("add", Request(rid, prompt, params, self.tokenizer, self.n_ctx, keep_events, sink,
                                         grammar)))
        self._wake.set()
        return rid

    def add_embedding(self, prompt: list[int], keep_events: bool = True, sink: EventSink | None = None) -> int:
        """Queue an embedding: the prompt is prefilled (batched with other requests' steps) and its
        one event carries the pooled hidden state (pooling.py); nothing is generated."""
        if not getattr(self.runner, "embeddings", False):
            raise PoolingError(f"the {self.runner.backend} backend does not compute embeddings; "
                               "use --backend cpu (or mlx)")
        if self.pooling == "rank" and (self.head is None or not self.head.ranks):
            raise PoolingError(self._no_rank)
        self.check_prompt(prompt)
        budget = self.scheduler.max_batch_tokens
        if not self.causal and len(prompt) > budget:  # llama-server: "input is too large to process"
            raise PoolingError(f"the input has {len(prompt)} tokens but {self.model_name} attends over a whole "
                               f"input in one step of at most {budget} tokens; shorten it, or raise the "
                               "engine's max_batch_tokens (infer's --ubatch-size)")
        rid = next(self._ids)
        pooler = Pooler(self._rows, len(prompt), self.n_embd)
        self._inbox.put(("add", Request(rid, prompt, SamplingParams(max_tokens=1), self.tokenizer, self.n_ctx,
                                         keep_events, sink, pooler=pooler)))
        self._wake.set()
        return rid

    def cancel(self, rid: int) -> None:
        self._inbox.put(("cancel", rid))
        self._wake.set()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

    def num_waiting(self) -> int:
        """Requests not yet running: queued for admission, preempted, or not yet seen by a step
        (a pending cancel counts too, for the moment until the next step drains it)."""
        return len(self.scheduler.waiting) + self._inbox.qsize()

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def usage(self) -> KVUsage:
        return self.blocks.usage()

    def prefix_hit_rate(self) -> float:
        b = self.blocks
        return b.hit_tokens / b.lookup_tokens if b.lookup_tokens else 0.0

    # -- stepping ---------------------------------------------------------------------------------

    def _drain_inbox(self, events: list[Event]) -> None:
        while True:
            try:
                op, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self._requests[arg.seq.id] = arg
                self.scheduler.add(arg.seq)
            else:
                req = self._requests.get(arg)
                if req is not None and not req.done:
                    self.scheduler.finish(req.seq)
                    self._finish(req, "cancelled", events, flush=False)

    def step(self) -> list[Event]:
        """Run one forward pass (if anything is to run) and return the events it produced."""
        with self._step_lock:
            events: list[Event] = []
            try:
                self._drain_inbox(events)
                sched = self.scheduler.schedule()
                if sched.items:
                    self._run(sched, events)
                self.steps += 1
            finally:
                # finishes already decided (cancels, stops) reach their consumers even if the step failed
                self._deliver(events)
            return events

    def _deliver(self, events: list[Event]) -> None:
        for ev in events:
            req = self._requests.get(ev.request_id)
            if req is None:
                continue
            if req.sink is not None:
                try:
                    req.sink(ev)
                except Exception:
                    # its consumer is gone (a closed event loop, say): stop computing for it
                    if ev.finish_reason is None:
                        self.cancel(ev.request_id)
            if req.events is not None:
                req.events.put(ev)  # stream() forgets the request once it has read the finish
            elif ev.finish_reason is not None:
                del self._requests[ev.request_id]

    def fail_all(self, error: BaseException) -> None:
        """End every live request with finish_reason "error" and free its blocks: after a step
        raised, the background loop does this so that no consumer waits forever."""
        with self._step_lock:
            events: list[Event] = []
            self._drain_inbox(events)
            for req in list(self._requests.values()):
                if not req.done:
                    try:
                        self.scheduler.finish(req.seq)
                    except Exception:
                        pass  # the failed step may have left its blocks half-assigned; it ends regardless
                    self._finish(req, "error", events, flush=False)
            # sequences no request owns any more must not make every later step fail again
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                try:
                    self.scheduler.finish(seq)
                except Exception:
                    pass
            self.last_error = error
            self._deliver(events)

    def _batch(self, sched: ScheduledStep) -> tuple[Batch, list[tuple[Sequence, int]], list[tuple[Request, int, int]]]:
        """The step's Batch, the sequences sampled after it (each with its first logits row: a
        sequence with a draft has one row per draft token more), and the embeddings it feeds:
        (request, its first row in batch.hidden, the position after its last)."""
        toks, pos, tok_seq = [], [], []
        rows, sampled = [], []
        hidden_rows: list[int] = []
        pooled = []
        seqs = [s for s, _ in sched.items]
        for i, (seq, n) in enumerate(sched.items):
            start = self.scheduler.num_computed(seq)
            first = len(toks)
            toks.extend((seq.tokens[start:] + seq.draft)[:n] if seq.draft else seq.tokens[start:start + n])
            pos.extend(range(start, start + n))
            tok_seq.extend([i] * n)
            pooler = self._requests[seq.id].pooler
            if pooler is not None:  # an embedding: the hidden states it pools, no logits
                lo, hi = pooler.wanted(start, n)
                pooled.append((self._requests[seq.id], len(hidden_rows), hi))
                hidden_rows.extend(range(first + lo - start, first + hi - start))
            elif start + n == seq.num_scheduled:  # its last token (and draft): sample from these logits
                sampled.append((seq, len(rows)))
                rows.extend(range(len(toks) - 1 - len(seq.draft), len(toks)))
        positions, tok_seq = np.asarray(pos, np.int32), np.asarray(tok_seq, np.int32)
        tables, slots = self.blocks.batch_tables([s.id for s in seqs], tok_seq, positions)
        batch = Batch(np.asarray(toks, np.int32), positions, tok_seq, slots, tables,
                      np.asarray(rows, np.int32), np.asarray([s.id for s in seqs], np.int64),
                      prompt_end=np.asarray([s.num_prompt for s in seqs], np.int32))
        if self.scheduler.states is not None:
            batch.state_slots = np.asarray([self.scheduler.states.slot(s.id) for s in seqs], np.int32)
        if pooled:
            if self._hidden is None:
                self._hidden = np.empty((self.scheduler.max_batch_tokens, self.n_embd), np.float32)
            batch.hidden_rows = np.asarray(hidden_rows, np.int32)
            batch.hidden = self._hidden[:len(hidden_rows)]
        return batch, sampled, pooled

    def _run(self, sched: ScheduledStep, events: list[Event]) -> None:
        now = time.perf_counter()
        for seq, _ in sched.items:
            req = self._requests[seq.id]
            if not req.t_admitted:
                req.t_admitted = now
        for g, src, dst in sched.copies:
            self.pool.copy_block(g, src, dst)
        states = self.states
        for src, dst in sched.state_copies:  # prefix cache hits' states, states before drafts
            states.copy(src, dst)
        batch, sampled, pooled = self._batch(sched)
        try:
            logits = self.runner.forward_batch(batch, self.pool, self.states)
        except Exception as e:
            raise ModelRunError(f"the model's forward pass failed ({type(e).__name__}: {str(e)[:200]}); "
                                "is the model file corrupt?") from e
        ends: list[tuple[Request, str, bool]] = []
        kept: dict[int, int] = {}  # sequences whose drafts were not all accepted: their tokens that stand
        n_of = {seq.id: n for seq, n in sched.items}
        for seq, r in sampled:
            req = self._requests[seq.id]
            draft, seq.draft = seq.draft, []
            accepted, end = 0, None
            for j in range(len(draft) + 1):  # each drafted position sampled as plain decoding would
                tok, end = self._advance(req, logits[r + j], events)
                if end is not None or j == len(draft) or tok != draft[j]:
                    break
                accepted += 1
            if draft:
                req.drafted += len(draft)
                req.accepted += accepted
                self.drafted += len(draft)
                self.accepted += accepted
                kept[seq.id] = n_of[seq.id] - len(draft) + accepted
                if states is not None and accepted < len(draft):
                    # the state went through rejected tokens: back to before the step, whose
                    # tokens the next step computes again (state_slots.py)
                    states.copy(*self.scheduler.restore_before_draft(seq))
                    kept[seq.id] = 0
            if end is not None:
                ends.append((req, *end))
        self.scheduler.commit(sched, kept)  # before any finish frees blocks: they are named for the prefix cache
        for src, dst in self.scheduler.snapshot_saves(sched):  # and states at boundaries kept
            states.copy(src, dst)
        for req, reason, flush in ends:
            self.scheduler.finish(req.seq)
            self._finish(req, reason, events, flush)
        if self.spec.kind:
            self._propose([seq for seq, _ in sampled if not self._requests[seq.id].done])
        for i, (req, at, hi) in enumerate(pooled):
            end = pooled[i + 1][1] if i + 1 < len(pooled) else len(batch.hidden_rows)
            req.pooler.add(batch.hidden[at:end], hi)
            if req.pooler.done:
                self.scheduler.finish(req.seq)
                if not req.t_first:
                    req.t_first = time.perf_counter()
                self._finish(req, "stop", events, flush=False,
                             embedding=apply_head(self.head, self.pooling, req.pooler.vector()))

    def _propose(self, seqs: list[Sequence]) -> None:
        """Drafts for the sequences that keep decoding (speculative.py), within the step's room."""
        room = self.spec.room(len(self.scheduler.running))
        if room == 0:
            return
        wanted = []
        for seq in seqs:
            req = self._requests[seq.id]
            n = seq.num_tokens
            # not past max_tokens or the context: the last drafted position's sample must still fit
            k = max(0, min(room, req.params.max_tokens - len(seq.output) - 1, self.n_ctx - n - 1))
            if self.drafter is not None:
                wanted.append((seq.id, seq.tokens, k, seq.num_prompt))
            elif k:
                seq.draft = ngram_draft(req.history[:n], self.spec.ngram_n, self.spec.draft_max)[:k]
        if wanted:
            drafts = self.drafter.propose(wanted)
            for seq in seqs:
                seq.draft = drafts.get(seq.id, [])

    def _advance(self, req: Request, logits: np.ndarray, events: list[Event]) -> tuple[int | None, tuple[str, bool] | None]:
        """Sample the request's next token from logits and take it: (the token or None, and
        (finish reason, flush) when the request ends here; the caller finishes it)."""
        seq = req.seq
        n = seq.num_tokens
        for tok_id, bias in req.params.logit_bias:  # in place on the row: nothing allocated per token
            logits[tok_id] += bias
        allowed = None if req.grammar is None else req.grammar.restrict(logits, req.logprobs is not None)
        if allowed is not None and allowed.size == 0:
            return None, ("stop", True)  # the grammar allows nothing more, not even the end
        tok = int(req.sample(logits, req.history[:n], req.rng, allowed))
        if not req.t_first:
            req.t_first = time.perf_counter()
        if tok in self.eog and not req.params.ignore_eos:
            return tok, ("stop", True)
        if req.grammar is not None:
            try:
                req.grammar.consume(tok)
            except GrammarError:  # the grammar engine refused its own choice (one of its limits): this request ends
                return tok, ("stop", True)
        seq.tokens.append(tok)
        req.history[n] = tok
        if req.logprobs is not None:
            req.logprobs.append(token_logprob(logits, tok, req.params.logprobs))
        piece = req.detok.add(tok)
        if req.waiting is not None and req.waiting.seen(piece):
            req.grammar, req.waiting = req.waiting.started, None
        text, stopped = req.stop.feed(piece)
        if text:
            events.append(Event(seq.id, text, tok, logprobs=self._take_logprobs(req)))
        if stopped:
            return tok, ("stop", False)
        if req.grammar is not None and req.grammar.done:  # completed: only the end could follow
            return tok, ("stop", True)
        if len(seq.output) >= req.params.max_tokens or seq.num_tokens >= self.n_ctx:
            return tok, ("length", True)
        return tok, None

    def _finish(self, req: Request, reason: str, events: list[Event], flush: bool = True,
                embedding: np.ndarray | None = None) -> None:
        seq = req.seq
        req.done = True
        if self.drafter is not None:
            self.drafter.drop(seq.id)
        tail = ""
        if flush:
            # release bytes the detokenizer and the stop matcher were still holding back
            text, stopped = req.stop.feed(req.detok.flush())
            tail = text if stopped else text + req.stop.flush()
            if stopped:
                reason = "stop"
        t_end = time.perf_counter()
        out = seq.output
        u = Usage(prompt_tokens=seq.num_prompt, completion_tokens=len(out), cached_tokens=seq.num_cached,
                  drafted_tokens=req.drafted, accepted_tokens=req.accepted)
        if req.t_first:
            u.ttft_ms = (req.t_first - req.t_added) * 1000
            u.prefill_tok_s = (seq.num_prompt - seq.num_cached) / max(req.t_first - req.t_admitted, 1e-9)
            if len(out) > 1:
                u.decode_tok_s = (len(out) - 1) / max(t_end - req.t_first, 1e-9)
        events.append(Event(seq.id, tail, None, reason, u, list(out), self._take_logprobs(req), embedding,
                            req.stop.word))

    @staticmethod
    def _take_logprobs(req: Request) -> list[TokenLogprob] | None:
        if req.logprobs is None:
            return None
        taken, req.logprobs = req.logprobs, []
        return taken

    # -- consuming --------------------------------------------------------------------------------

    def stream(self, rid: int) -> Iterator[Event]:
        """The events of request rid until its finish event.  Without a background loop, this
        steps the engine (serving every request) until rid is done."""
        req = self._requests.get(rid)
        if req is None:
            self._drain_pending()
            req = self._requests.get(rid)
        if req is None or req.events is None:
            raise KeyError(f"no request {rid} with kept events")
        try:
            while True:
                if self._thread is None:
                    try:
                        ev = req.events.get_nowait()
                    except queue.Empty:
                        self.step()
                        continue
                else:
                    try:  # a timeout, so a KeyboardInterrupt reaches this thread promptly
                        ev = req.events.get(timeout=0.1)
                    except queue.Empty:
                        continue
                yield ev
                if ev.finish_reason is not None:
                    return
        finally:
            with self._step_lock:  # decided against a step that may be finishing it right now
                if req.done:
                    self._requests.pop(rid, None)
                else:  # the consumer stopped early: cancel; _deliver forgets it at the cancel's finish
                    req.events = None
                    self._inbox.put(("cancel", rid))
                    self._wake.set()
            if not req.done and self._thread is None:
                self.step()

    def _drain_pending(self) -> None:
        with self._step_lock:
            events: list[Event] = []
            self._drain_inbox(events)
            self._deliver(events)  # a cancel drained here still owes its request a finish

    def generate(self, prompt: list[int], params: SamplingParams) -> Iterator[Event]:
        """One request's events, as a generator (the CLI's path and the benchmark's; the server
        instead passes add_request a sink that its event loop drains).  A bad prompt raises here; the request is queued at the first next(), so a generator dropped
        unstarted costs nothing."""
        self.check_prompt(prompt)

        def run() -> Iterator[Event]:
            yield from self.stream(self.add_request(prompt, params))
        return run()

    # -- background loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Step the engine in a background thread whenever there is work."""
        if self._thread is not None:
            return
        self._stop_loop = False
        self._thread = threading.Thread(target=self._loop, name="infer-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop_loop:
            if self.has_work():
                try:
                    self.step()
                except Exception as e:  # a bug, not a request's fault: fail what runs, keep serving
                    self.fail_all(e)
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop_loop = True
        self._wake.set()
        self._thread.join()
        self._thread = None
