"""Continuous batching: which tokens of which sequences the next forward pass computes.

Each step takes every running sequence's next tokens (one for a sequence that is decoding, a
chunk for one still in its prompt) and then admits waiting sequences, all under a token budget,
so decode steps keep flowing while a long prompt is prefilled in chunks.  A sequence is
admitted when the KV pool has blocks for it (after its cached prefix); when the pool runs out,
the newest running sequence is preempted: its blocks are freed and it is recomputed later
(its prompt and what it generated so far, much of it found again in the prefix cache).
A hybrid model's sequence also needs a slot of the recurrent state pool to be admitted
(state_slots.py), held until it finishes or is preempted; with the prefix cache, a prefill chunk
ends at the prompt's last block boundary, whose state is kept as a snapshot (StateSnapshots).
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .state_slots import StateSlots, StateSnapshots


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    id: int
    tokens: list[int]  # the prompt, then every generated token
    num_prompt: int
    status: SeqStatus = SeqStatus.WAITING
    num_cached: int = 0  # prompt tokens the prefix cache provided at first admission
    num_preempted: int = 0
    admitted: bool = False
    reuse_prefix: bool = True  # may start from the prefix cache (an embedding that pools every token may not)
    draft: list[int] = field(default_factory=list)  # speculative tokens to verify after tokens (speculative.py)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_scheduled(self) -> int:
        """Tokens to have computed by the end of the next step: its own and its draft."""
        return len(self.tokens) + len(self.draft)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.num_prompt:]


@dataclass
class ScheduledStep:
    items: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens to compute)
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (group, src, dst) before the pass
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) state slots, before the pass
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_seqs: int = 8, max_batch_tokens: int = 512,
                 states: StateSlots | None = None, snapshots: StateSnapshots | None = None, scratch: int = 0,
                 whole_prompts: bool = False):
        if max_seqs < 1 or max_batch_tokens < 1:
            raise ValueError("max_seqs and max_batch_tokens must be positive")
        self.blocks = blocks
        self.states = states  # a hybrid model's recurrent state slots; None: the model has none
        self.snapshots = snapshots  # and its kept states, for the prefix cache (None: it has none)
        self.scratch = scratch  # under speculation: state slot s's state before its draft is at s + scratch
        # a non-causal model (an encoder): each token attends over its whole sequence, so a prompt is
        # admitted only whole, in one step, from no cached prefix (a longer one waits forever:
        # Engine.add_embedding refuses it)
        self.whole_prompts = whole_prompts
        self.max_seqs = max_seqs
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self.n_preempted = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def num_computed(self, seq: Sequence) -> int:
        """Tokens of seq whose K/V are in the cache (the block manager keeps the count)."""
        return self.blocks.num_computed(seq.id) if seq.status == SeqStatus.RUNNING else 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence (finished or cancelled) wherever it is, freeing its blocks at once."""
        if seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq.id)
            self._release_state(seq)
        elif seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.id)
        self._release_state(seq)  # recomputed from its first token or a snapshot, which rebuilds its state
        seq.status = SeqStatus.WAITING
        seq.draft = []
        seq.num_preempted += 1
        self.n_preempted += 1
        self.waiting.appendleft(seq)  # first in line once blocks free up

    def _release_state(self, seq: Sequence) -> None:
        if self.states is not None:
            self.states.release(seq.id)
        if self.snapshots is not None:
            self.snapshots.end(seq.id)

    def _chunk(self, seq: Sequence, computed: int, budget: int) -> int:
        """Tokens of seq to compute next: all it has, within budget, ending at its prompt's last
        block boundary where the computation passes it (a hybrid model's state there is kept)."""
        n = min(seq.num_tokens - computed, budget)
        if self.snapshots is not None:
            bs = self.blocks.block_size
            end = seq.num_prompt // bs * bs
            if computed < end < computed + n:
                n = end - computed
        return n

    def snapshot_saves(self, step: ScheduledStep) -> list[tuple[int, int]]:
        """After the step's commit: the (sequence's slot, snapshot slot) copies that keep the
        states of sequences whose computation now ends at a block boundary (state_slots.py)."""
        out: list[tuple[int, int]] = []
        if self.snapshots is None or self.states is None:
            return out
        bs = self.blocks.block_size
        for seq, _ in step.items:
            if seq.status != SeqStatus.RUNNING:
                continue
            n = self.blocks.num_computed(seq.id)
            name = self.blocks.name_at(seq.id, n) if n else None
            if name is None:
                continue
            dst = self.snapshots.save(seq.id, name, keep=n == seq.num_prompt // bs * bs)
            if dst is not None:
                out.append((self.states.slot(seq.id), dst))
        return out

    def restore_before_draft(self, seq: Sequence) -> tuple[int, int]:
        """The (scratch, slot) copy that takes seq's state back to before its draft was verified:
        a token was rejected, so the step commits none of its tokens (Engine._run)."""
        slot = self.states.slot(seq.id)  # type: ignore[union-attr]  # only a hybrid model's sequences
        return slot + self.scratch, slot

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.max_batch_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n_new = self._chunk(seq, self.blocks.num_computed(seq.id), budget)  # its own tokens first
            while not self.blocks.can_append(seq.id, n_new):
                victim = self.running[-1]
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SeqStatus.RUNNING:
                break  # it was the newest left: nothing after it runs either
            step.copies += self.blocks.append(seq.id, n_new)
            step.items.append((seq, n_new))
            budget -= n_new
            i += 1
        if step.preempted:
            self._fit_drafts(step, 0)  # the pool is full: admit nobody, draft nothing this step
            return step
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            if self.states is not None and self.states.n_free == 0:
                break
            seq = self.waiting[0]
            state_at = None  # a hybrid model's prefix ends where a snapshot keeps its state
            if self.states is not None:
                state_at = self.snapshots.has if self.snapshots is not None else (lambda name: False)
            cached = self.blocks.begin(seq.id, seq.tokens, reuse=seq.reuse_prefix and not self.whole_prompts,
                                       state_at=state_at)
            n_new = self._chunk(seq, cached, budget)
            if (self.whole_prompts and n_new < seq.num_tokens) or not self.blocks.can_append(seq.id, n_new):
                self.blocks.free(seq.id)
                break
            if not seq.admitted:
                seq.num_cached = cached
                seq.admitted = True
            self.waiting.popleft()
            if self.states is not None:
                slot = self.states.take(seq.id)
                if cached and self.snapshots is not None:
                    name = self.blocks.name_at(seq.id, cached)
                    step.state_copies.append((self.snapshots.take(name), slot))
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            step.copies += self.blocks.append(seq.id, n_new)
            step.items.append((seq, n_new))
            budget -= n_new
        self._fit_drafts(step, budget)
        return step

    def _fit_drafts(self, step: ScheduledStep, budget: int) -> None:
        """Drafts ride in what is left of the step once every sequence has its own tokens: each is
        shortened to the budget left and dropped where the free blocks cannot take it, so a draft
        never preempts or delays anyone."""
        for idx, (seq, n) in enumerate(step.items):
            if not seq.draft:
                continue
            computed = self.blocks.num_computed(seq.id)
            if computed + n < seq.num_tokens:  # its own tokens did not all fit: no room for a draft
                seq.draft = []
                continue
            del seq.draft[budget:]
            total = n + len(seq.draft)
            if seq.draft and self.blocks.can_append(seq.id, total):
                step.copies += self.blocks.append(seq.id, total)
                step.items[idx] = (seq, total)
                budget -= len(seq.draft)
                if self.states is not None:  # its state before the draft, to restore on a rejection
                    slot = self.states.slot(seq.id)
                    step.state_copies.append((slot, slot + self.scratch))
            else:
                seq.draft = []

    def commit(self, step: ScheduledStep, kept: dict | None = None) -> None:
        """The forward pass of `step` ran: its sequences' new K/V are in the cache.  kept: for
        sequences whose draft was (partly) rejected, how many of the step's tokens stand; the
        rest's K/V are dropped and the blocks only they used given back."""
        for seq, n in step.items:
            if seq.status == SeqStatus.RUNNING:
                if kept and seq.id in kept:
                    self.blocks.commit(seq.id, seq.tokens, kept[seq.id])
                    self.blocks.trim(seq.id)
                else:
                    self.blocks.commit(seq.id, seq.tokens, n)
