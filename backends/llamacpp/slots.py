"""The llama.cpp backend's KV pool: which llama.cpp sequence slot holds which engine sequence.

llama.cpp keeps K/V in its own cache, addressed by (sequence slot, position), not by the engine's
blocks.  This pool maps each running engine sequence to a slot and remembers, per slot, the tokens
whose K/V it holds (K/V at a position depend only on the tokens up to it), so that:
- a sequence that starts at position p0 > 0 (the engine found its prefix in its block cache)
  shares the longest matching prefix of another slot's cells (llama_memory_seq_cp shares cells in
  a unified cache), and the positions below p0 it could not share are recomputed from the tokens
  the engine's blocks hold (this pool sees every token written, by cache row);
- a finished, cancelled or preempted sequence's slot stays as a "donor" whose cells later
  sequences can share, until its slot or its cells are needed (least recently used first).
Nothing here calls llama.cpp directly: the runner passes the few memory operations in.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Memory(Protocol):
    """The llama.cpp memory operations the pool needs (llama_memory_seq_*)."""

    def rm(self, slot: int, p0: int, p1: int) -> bool: ...

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def pos_min(self, slot: int) -> int: ...


@dataclass
class _Slot:
    seq: int | None = None  # the engine's id of the sequence running in it; None: donor or empty
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(64, np.int32))  # K/V held at 0..n-1
    n: int = 0

    def set(self, pos: np.ndarray, tok: np.ndarray) -> None:
        end = int(pos.max()) + 1
        if end > len(self.tokens):
            grown = np.zeros(max(end, 2 * len(self.tokens)), np.int32)
            grown[:self.n] = self.tokens[:self.n]
            self.tokens = grown
        self.tokens[pos] = tok
        self.n = max(self.n, end)


@dataclass
class Prepared:
    """What one forward pass must decode: first the recomputed prefix tokens (no logits), then
    the batch's own tokens, each with its slot."""

    pre_tokens: np.ndarray
    pre_positions: np.ndarray
    pre_slots: np.ndarray
    slots: np.ndarray  # (T,) the slot of each batch token
    touched: list[int]  # slots this pass writes to


class SlotPool:
    def __init__(self, memory: Memory, n_slots: int, n_rows: int, block_size: int, n_swa: int, nbytes: int):
        self.memory = memory
        self.block_size = block_size
        self.n_swa = n_swa  # sliding window of the model's SWA layers (0: none)
        self.nbytes = nbytes
        self.slots = [_Slot() for _ in range(n_slots)]
        self.empty = list(range(n_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.donors: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.slot_of: dict[int, int] = {}  # engine sequence id -> slot
        # the token last written to each cache row of KV group 0 (-1: none yet)
        self.row_tokens = np.full(n_rows, -1, np.int32)
        # statistics: prefix positions shared from other slots, and recomputed
        self.shared_tokens = 0
        self.recomputed_tokens = 0
        self.evictions = 0  # donors dropped for their slot or their cells

    # -- the engine's KV pool interface --------------------------------------------------------

    def copy_block(self, group: int, src: int, dst: int) -> None:
        if group == 0:  # K/V live in llama.cpp's cache; only the record of tokens is copied
            bs = self.block_size
            self.row_tokens[dst * bs:(dst + 1) * bs] = self.row_tokens[src * bs:(src + 1) * bs]

    def free_sequence(self, seq_id: int) -> None:
        slot = self.slot_of.pop(int(seq_id), None)
        if slot is None:
            return  # never ran a forward pass here
        s = self.slots[slot]
        s.seq = None
        if s.n > 0:
            self.donors[slot] = None
        else:
            self.empty.append(slot)

    # -- slots ----------------------------------------------------------------------------------

    @property
    def n_live(self) -> int:
        return len(self.slot_of)

    def evict_donor(self, keep: int = -1) -> bool:
        """Drop the least recently used donor's cells (but not slot `keep`); False if none."""
        for slot in self.donors:
            if slot != keep:
                del self.donors[slot]
                self.memory.rm(slot, -1, -1)
                self.evictions += 1
                s = self.slots[slot]
                s.n = 0
                self.empty.append(slot)
                return True
        return False

    def _new_slot(self, keep: int) -> int | None:
        if not self.empty and not self.evict_donor(keep):
            return None
        return self.empty.pop()

    def _usable(self, slot: int, n: int) -> bool:
        """Whether positions 0..n-1 of slot can be shared with a sequence continuing at n: in the
        sliding-window layers llama.cpp reuses cells beyond a sequence's window (and forgets the
        positions below them), so the window before n must still be there."""
        first = self.memory.pos_min(slot)
        need = max(0, n - self.n_swa + 1) if self.n_swa > 0 else 0
        return 0 <= first <= need

    def _best_source(self, want: np.ndarray) -> tuple[int, int]:
        """(slot, positions) of the longest usable shared prefix of `want` in any slot."""
        best, best_n = -1, 0
        for i, s in enumerate(self.slots):
            m = min(s.n, len(want))
            if m <= best_n:
                continue
            diff = np.flatnonzero(s.tokens[:m] != want[:m])
            n = int(diff[0]) if len(diff) else m
            if n > best_n and self._usable(i, n):
                best, best_n = i, n
        return best, best_n

    def _prefix_tokens(self, table: np.ndarray, n: int) -> np.ndarray:
        """The tokens at positions 0..n-1 of a sequence, from the blocks of its group-0 table."""
        bs = self.block_size
        pos = np.arange(n)
        blocks = table[pos // bs]
        if (blocks < 0).any():
            raise RuntimeError("llama.cpp backend: a prefix block of the global KV group is not held")
        tok = self.row_tokens[blocks * bs + pos % bs]
        if (tok < 0).any():
            raise RuntimeError("llama.cpp backend: a cached prefix block holds tokens this pool never saw")
        return tok

    def _start(self, seq: int, table: np.ndarray, p0: int, pre: list) -> int:
        """A slot for a sequence not running here yet, holding (or about to recompute) 0..p0-1."""
        want = self._prefix_tokens(table, p0) if p0 > 0 else np.zeros(0, np.int32)
        src, n = self._best_source(want) if p0 > 0 else (-1, 0)
        dst = self._new_slot(keep=src)
        if dst is None:
            if src in self.donors:  # no other slot free: take the donor over
                del self.donors[src]
                dst = src
            else:
                raise RuntimeError(f"llama.cpp backend: more than {len(self.slots)} sequences at once")
        d = self.slots[dst]
        if dst == src:
            self.memory.rm(dst, n, -1)
            d.n = n
        elif n > 0:
            self.memory.cp(src, dst, 0, n)
            d.set(np.arange(n), want[:n])
            if src in self.donors:
                self.donors.move_to_end(src)
        d.seq = seq
        self.slot_of[seq] = dst
        self.shared_tokens += n
        if n < p0:
            pre.append((dst, n, want[n:]))
        return dst

    def prepare(self, batch) -> Prepared:
        """Bind each of the batch's sequences to a slot holding exactly the positions before its
        first token (sharing or recomputing a prefix, dropping positions about to be rewritten)."""
        T = len(batch.tokens)
        self.row_tokens[batch.slots[0]] = batch.tokens
        seq_rows = batch.tok_seq
        starts = np.flatnonzero(np.r_[True, seq_rows[1:] != seq_rows[:-1]])
        if len(np.unique(seq_rows[starts])) != len(starts):
            raise ValueError("llama.cpp backend: each sequence's tokens must be contiguous in the batch")
        ids = batch.seq_ids if batch.seq_ids is not None else np.arange(len(batch.tables[0]))
        slots = np.empty(T, np.int32)
        pre: list[tuple[int, int, np.ndarray]] = []
        ends = list(starts[1:]) + [T]
        for a, b in zip(starts, ends):
            row = int(seq_rows[a])
            p0 = int(batch.positions[a])
            if not np.array_equal(batch.positions[a:b], np.arange(p0, p0 + b - a)):
                raise ValueError("llama.cpp backend: a sequence's positions must be consecutive")
            seq = int(ids[row])
            slot = self.slot_of.get(seq)
            if slot is None:
                slot = self._start(seq, batch.tables[0][row], p0, pre)
            else:
                s = self.slots[slot]
                if s.n > p0:  # positions computed again (a resumed or rewound sequence)
                    if not self.memory.rm(slot, p0, -1):
                        raise RuntimeError(f"llama.cpp could not drop positions {p0}.. of slot {slot}")
                    s.n = p0
                elif s.n < p0:
                    gap = self._prefix_tokens(batch.tables[0][row], p0)[s.n:]
                    pre.append((slot, s.n, gap))
            slots[a:b] = slot
        self.recomputed_tokens += sum(len(t) for _, _, t in pre)
        if pre:
            pre_tokens = np.concatenate([t for _, _, t in pre]).astype(np.int32)
            pre_positions = np.concatenate([np.arange(n, n + len(t)) for _, n, t in pre]).astype(np.int32)
            pre_slots = np.concatenate([np.full(len(t), s) for s, _, t in pre]).astype(np.int32)
        else:
            pre_tokens = pre_positions = pre_slots = np.zeros(0, np.int32)
        return Prepared(pre_tokens, pre_positions, pre_slots, slots, sorted(set(slots.tolist())))

    def commit(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray) -> None:
        """llama.cpp decoded these tokens into these slots."""
        for slot in np.unique(slots):
            m = slots == slot
            self.slots[int(slot)].set(positions[m], tokens[m])

    def rollback(self, touched: list[int]) -> None:
        """A decode failed: drop whatever it left beyond what the slots record."""
        for slot in touched:
            self.memory.rm(slot, self.slots[slot].n, -1)
