"""Draft-model speculation (--spec draft --draft MODEL): a small model of the same vocabulary
proposes each decoding sequence's next tokens, which the target then verifies (engine.py, the same
acceptance as prompt lookup).

The draft model has its own runner and paged KV pool; each target sequence has a draft
sequence holding the K/V of the tokens the draft has seen.  To propose, the draft first catches
up on the sequence's new tokens (the prompt at first, then what the target accepted), then
decodes greedily one token per pass, every drafting sequence in the same pass, until it has
draft_max tokens or its top probability falls under draft_p_min (llama.cpp's --draft-p-min).
Afterwards the draft's K/V past what the target keeps are dropped (rollback): the next proposal
starts from the tokens both models agree on.
"""
from __future__ import annotations

import math

import numpy as np

from infer.backends.batch import Batch

from .block_manager import BlockManager
from .speculative import SpeculationError


class DraftModel:
    def __init__(self, runner, model_config, n_ctx: int, max_seqs: int, block_size: int, draft_max: int,
                 draft_min: int = 0, p_min: float = 0.0, target_vocab: int = 0):
        if model_config.recurrent_layers:  # its state cannot roll back past a rejected draft (state_slots.py)
            raise SpeculationError(f"a draft model with recurrent layers ({model_config.arch}) cannot roll back; "
                                   "choose a draft model without them")
        self.runner, self.cfg = runner, model_config
        # token ids both models have: the draft never reads a target-only id, never proposes a draft-only one
        self.n_shared = min(model_config.n_vocab, target_vocab or model_config.n_vocab)
        self.n_ctx, self.bs = n_ctx, block_size
        self.draft_max, self.draft_min, self.p_min = draft_max, draft_min, p_min
        self.budget = runner.max_tokens
        per_block = runner.bytes_per_block(block_size)
        windows = [g.window for g in model_config.kv_groups]
        full = math.ceil(n_ctx / block_size)
        per_seq = [full if w == 0 else min(full, math.ceil((w + self.budget + draft_max) / block_size) + 2)
                   for w in windows]
        n_blocks = [n * max_seqs for n in per_seq]
        # a window keeps draft_max positions more than it needs: a rollback must find them still there
        self.blocks = BlockManager(n_blocks, block_size, windows, b"draft", per_block, naming=False,
                                   keep_extra=draft_max + 1)
        self.pool = runner.new_kv_pool(n_blocks, block_size)
        self.seen: dict[int, list[int]] = {}  # sequence id -> tokens whose K/V the draft holds
        self.prompt_end: dict[int, int] = {}  # sequence id -> its prompt's length (Batch.prompt_end)

    @property
    def nbytes(self) -> int:
        return self.blocks.usage().bytes_total

    def drop(self, seq_id: int) -> None:
        """The target's sequence ended (finished, cancelled or failed): its draft K/V go."""
        self.prompt_end.pop(seq_id, None)
        if self.seen.pop(seq_id, None) is not None:
            self.blocks.free(seq_id)

    def propose(self, wanted: list[tuple[int, list[int], int, int]]) -> dict[int, list[int]]:
        """Drafts for (sequence id, its tokens (the last one just sampled), most tokens to draft,
        its prompt's length: the draft computes each position as the target does, see Batch.prompt_end)."""
        live = {}
        for sid, tokens, k, n_prompt in wanted:
            k = min(k, self.draft_max, self.n_ctx - len(tokens))  # the draft's context may be the shorter
            if len(tokens) >= self.n_ctx or max(tokens) >= self.n_shared:
                self.drop(sid)  # past the draft's context, or holding an id it does not have: no more drafts
                continue
            if k < 1:
                continue
            self._sync(sid, tokens)
            self.prompt_end[sid] = n_prompt
            live[sid] = (list(tokens), k)
        drafts: dict[int, list[int]] = {sid: [] for sid in live}
        # catch up on what the draft has not seen, then one token per pass
        active = dict(live)
        while active:
            feed = {sid: toks[self.blocks.num_computed(sid):] for sid, (toks, _) in active.items()}
            done_now = self._pass(feed, drafts, active)
            for sid in done_now:
                active.pop(sid, None)
        out = {}
        for sid, d in drafts.items():
            # what the draft has computed: a prefix of the tokens and its draft (the last drafted token is not)
            self.seen[sid] = (live[sid][0] + d)[:self.blocks.num_computed(sid)]
            out[sid] = d if len(d) >= max(self.draft_min, 1) else []
        return out

    def _sync(self, sid: int, tokens: list[int]) -> None:
        """Keep the draft's K/V of the longest prefix it shares with tokens; give back the rest."""
        seen = self.seen.get(sid)
        if seen is None:
            self.blocks.begin(sid, tokens, reuse=False)
            self.seen[sid] = []
            return
        n = 0
        limit = min(len(seen), len(tokens) - 1, self.blocks.num_computed(sid))
        while n < limit and seen[n] == tokens[n]:
            n += 1
        if self.blocks.num_computed(sid) - n > self.draft_max and any(self.blocks.windows):
            self.drop(sid)  # further back than a window keeps: start this sequence again
            self.blocks.begin(sid, tokens, reuse=False)
            self.seen[sid] = []
            return
        self.blocks.rollback(sid, n)
        self.seen[sid] = seen[:n]

    def _pass(self, feed: dict[int, list[int]], drafts: dict[int, list[int]], active: dict) -> list[int]:
        """One forward pass of the draft model over each sequence's next tokens (within the budget);
        the sequences that reached their last token draft one more.  Returns those done."""
        budget = self.budget
        items, finished = [], []
        for sid, toks in feed.items():
            n = min(len(toks), budget)
            if n == 0:
                continue
            if not self.blocks.can_append(sid, n):
                finished.append(sid)  # the draft pool is full for it: it drafts no further this step
                continue
            self.blocks.append(sid, n)  # taken now, so the next sequence's check sees what is left
            items.append((sid, toks[:n], n == len(toks)))
            budget -= n
            if budget == 0:
                break
        if not items:
            return list(feed)
        batch, rows = self._batch(items)
        logits = self.runner.forward_batch(batch, self.pool)
        for r, (sid, toks, last) in zip(rows, items):
            self.blocks.commit(sid, (), len(toks))  # names nothing: no tokens needed
            if not last:
                continue
            row = logits[r, :self.n_shared]
            tok = int(np.argmax(row))
            if self.p_min > 0:
                z = row - row[tok]
                if 1.0 / float(np.exp(z).sum()) < self.p_min:
                    finished.append(sid)
                    continue
            drafts[sid].append(tok)
            seq_tokens, k = active[sid]
            if len(drafts[sid]) >= k or len(seq_tokens) + 1 >= self.n_ctx:  # seq_tokens holds the draft so far
                finished.append(sid)
            else:
                active[sid] = (seq_tokens + [tok], k)
        return finished

    def _batch(self, items: list[tuple[int, list[int], bool]]) -> tuple[Batch, list[int]]:
        toks, pos, tok_seq, rows, ends = [], [], [], [], []
        for i, (sid, t, last) in enumerate(items):
            start = self.blocks.num_computed(sid)
            toks.extend(t)
            pos.extend(range(start, start + len(t)))
            tok_seq.extend([i] * len(t))
            rows.append(len(toks) - 1)
            ends.append(self.prompt_end[sid])
        positions, tok_seq = np.asarray(pos, np.int32), np.asarray(tok_seq, np.int32)
        tables, slots = self.blocks.batch_tables([sid for sid, _, _ in items], tok_seq, positions)
        batch = Batch(np.asarray(toks, np.int32), positions, tok_seq, slots, tables,
                      np.asarray(rows, np.int32), np.asarray([sid for sid, _, _ in items], np.int64),
                      prompt_end=np.asarray(ends, np.int32))
        return batch, list(range(len(items)))
