"""What one forward pass computes: tokens of several sequences and where their K/V live.

Built by the engine's scheduler, consumed by any backend.  Positions of a sequence map to cache
rows through its block table: position p is row table[p // bs] * bs + p % bs of the pool.
Each KV group (see ModelConfig.kv_groups) has its own pool and tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Batch:
    tokens: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32
    tok_seq: np.ndarray  # (T,) int32: the row of each table that belongs to the token's sequence
    slots: np.ndarray  # (G, T) int32: the cache row each token's K/V is written to, per group
    tables: list[np.ndarray]  # per group (S, max_blocks) int32 block tables (-1: not held)
    logit_rows: np.ndarray  # (R,) int32, ascending: the tokens whose logits are returned, in this order
    seq_ids: np.ndarray | None = None  # (S,) int64: the engine's id of each table row's sequence
    # embeddings: the tokens whose final hidden state (after the output norm, llama.cpp's
    # "result_norm") the pass copies into `hidden`, in this order; None: none wanted
    hidden_rows: np.ndarray | None = None  # (H,) int32, ascending
    hidden: np.ndarray | None = None  # (H, n_embd) float32, the caller's, written by forward_batch
    # (S,) int32: where each table row's sequence's prompt ends. A token at or past it is a
    # generated one, which llama.cpp computes alone in its batch (a decode step), and the cpu
    # backend's attention sums its products in the order llama.cpp then does; a prompt's tokens
    # in the order of llama.cpp's products over several tokens. It follows the position, not
    # the batch, so chunking, speculation and preemption change no result. None: a sequence's
    # tokens are its prompt where the batch has several of them, else generated.
    prompt_end: np.ndarray | None = None
    # (S,) int32: each table row's sequence's slot in the recurrent state pool (a hybrid model's
    # runner.new_state_pool); None for a model without recurrent layers
    state_slots: np.ndarray | None = None

    @classmethod
    def single(cls, tokens: np.ndarray, pos0: int, tables: list[np.ndarray], block_size: int,
               all_logits: bool = False, prompt_end: int | None = None) -> "Batch":
        """Tokens of one sequence at positions pos0.. (tables: per group (1, max_blocks));
        prompt_end: where its prompt ends (default: here if it is a single token, else after it).
        Its recurrent state, if the model has one, is slot 0 of the state pool."""
        T = len(tokens)
        pos = np.arange(pos0, pos0 + T, dtype=np.int32)
        slots = np.stack([t[0][pos // block_size] * block_size + pos % block_size for t in tables]).astype(np.int32)
        rows = np.arange(T, dtype=np.int32) if all_logits else np.array([T - 1], np.int32)
        if prompt_end is None:
            prompt_end = pos0 if T == 1 else pos0 + T
        return cls(np.ascontiguousarray(tokens, np.int32), pos, np.zeros(T, np.int32), slots, tables, rows,
                   np.zeros(1, np.int64), prompt_end=np.array([prompt_end], np.int32),
                   state_slots=np.zeros(1, np.int32))

    def prompt_ends(self) -> np.ndarray:
        """prompt_end, or where it is None what it then means."""
        if self.prompt_end is not None:
            return self.prompt_end
        S = int(self.tok_seq.max()) + 1 if len(self.tok_seq) else 0
        counts = np.bincount(self.tok_seq, minlength=S)
        last = np.zeros(S, np.int64)
        np.maximum.at(last, self.tok_seq, self.positions.astype(np.int64) + 1)
        return np.where(counts > 1, last, 0).astype(np.int32)

    def seq_last(self) -> np.ndarray:
        """(S,) int32: the last position of each table row's sequence among the batch's tokens (-1:
        none there). A non-causal model's queries see their sequence's keys up to it (its prompt
        is computed in one step)."""
        last = np.full(len(self.tables[0]) if self.tables else 0, -1, np.int32)
        np.maximum.at(last, self.tok_seq, self.positions)
        return last
