"""Which slot of the runner's recurrent state pool each running sequence of a hybrid model holds.

A hybrid model (LFM2: short convolutions, Qwen3.5: gated delta nets, beside attention) keeps,
besides its paged K/V, a state per sequence that each step reads and updates (backends/base.py's
StatePoolLike). The runner allocates one slot per sequence that may run at once (--parallel); the
scheduler admits a sequence only with a free slot and gives the slot back when the sequence
finishes, is cancelled or is preempted. A preempted sequence is recomputed from its first token,
which rebuilds its state (the state at position 0 is zero whatever the slot held, so slots are
never cleared).

Prefix caching (a chat's next turn). A cached prefix's K/V are of no use without the recurrent
state at the prefix's end, so the engine keeps snapshots of states, each at a block boundary and
named by the block manager's chained hash of the block that ends there (block_manager.py): a new
sequence whose prompt matches cached blocks up to a snapshot takes those blocks, has the snapshot
copied into its slot, and prefills only the rest (BlockManager.begin's state_at; a longer match
falls back to the newest snapshot inside it, or to zero). This is vLLM's choice for hybrid models
(state at block boundaries, so a snapshot pairs with named full blocks) kept as sparse as
llama.cpp's server checkpoints: not every boundary, only
- the last boundary of each prompt: the scheduler ends a prefill chunk there, so that the next
  turn, whose prompt starts with this one, finds it (kept until evicted);
- the newest boundary a sequence's computation landed on (a prefill chunk's end, a decode step):
  one per sequence, replaced as it moves on, so a finished sequence leaves its last full block's
  boundary (its conversation so far, for the turn after).
Snapshots live in slots of the backend's state pool past the running sequences' (a fixed number,
counted in --kv-memory, kv_sizing.state_slots_needed), least recently used evicted first.

Speculative decoding: before a step verifies a sequence's draft its state is copied to a scratch
slot of its own; when a draft token is rejected the state (which went through every draft token)
is restored and the step's tokens are not committed, so the next step recomputes the kept ones
from the restored state along with the new token (the same K/V written again, the state now
through the kept tokens only). Greedy output is the same as plain decoding's.
"""
from __future__ import annotations

from collections import OrderedDict


class StateSlots:
    def __init__(self, n_slots: int):
        if n_slots < 1:
            raise ValueError("a state pool needs at least one slot")
        self.n_slots = n_slots
        self._free = list(range(n_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._of: dict[int, int] = {}  # sequence id -> its slot

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self, seq_id: int) -> int:
        """A free slot for a sequence being admitted (the caller checked n_free)."""
        if seq_id in self._of:
            raise ValueError(f"sequence {seq_id} already holds state slot {self._of[seq_id]}")
        slot = self._free.pop()
        self._of[seq_id] = slot
        return slot

    def release(self, seq_id: int) -> None:
        """The sequence finished, was cancelled or preempted: its slot is free (nothing if it held none)."""
        slot = self._of.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    def slot(self, seq_id: int) -> int:
        return self._of[seq_id]

    def held(self) -> dict[int, int]:
        """Sequence id -> slot, for every slot taken."""
        return dict(self._of)


class StateSnapshots:
    """Which snapshot slot holds the state at which block boundary (by the name of the block
    ending there), least recently used first; pure bookkeeping, the engine copies the states."""

    def __init__(self, first_slot: int, n: int):
        self.n = n
        self._free = list(range(first_slot + n - 1, first_slot - 1, -1))
        self._at: OrderedDict[bytes, int] = OrderedDict()  # block name -> snapshot slot, oldest use first
        self._kept: set[bytes] = set()  # prompt ends: no sequence's moving on replaces them
        self._moving: dict[int, bytes] = {}  # sequence id -> its newest boundary's snapshot
        self.restored = 0  # snapshots copied into a sequence's slot (statistics)
        self.evicted = 0  # snapshots dropped for want of a slot

    def __len__(self) -> int:
        return len(self._at)

    def has(self, name: bytes) -> bool:
        return name in self._at

    def take(self, name: bytes) -> int:
        """The slot of the snapshot named `name` (has() said so), now the most recently used."""
        self._at.move_to_end(name)
        self.restored += 1
        return self._at[name]

    def _drop(self, name: bytes) -> None:
        self._free.append(self._at.pop(name))
        self._kept.discard(name)

    def save(self, seq_id: int, name: bytes, keep: bool) -> int | None:
        """Sequence seq_id's state is at the boundary named `name`: the slot to copy it into, or
        None where that snapshot exists already (the same tokens give the same state). keep: a
        prompt's end; else the sequence's previous moving snapshot is given up for this one."""
        if name in self._at:
            self._at.move_to_end(name)
            if keep:
                self._kept.add(name)
            return None
        if not keep:
            old = self._moving.pop(seq_id, None)
            if old is not None and old in self._at and old not in self._kept:
                self._drop(old)
            self._moving[seq_id] = name
        if not self._free:
            self._drop(next(iter(self._at)))
            self.evicted += 1
        slot = self._free.pop()
        self._at[name] = slot
        if keep:
            self._kept.add(name)
        return slot

    def end(self, seq_id: int) -> None:
        """The sequence finished, was cancelled or preempted: its moving snapshot stays, as any other."""
        self._moving.pop(seq_id, None)
