"""Which slot of the runner's recurrent state pool each running sequence of a hybrid model holds.

A hybrid model (LFM2: short convolutions, Qwen3.5: gated delta nets, beside attention) keeps,
besides its paged K/V, a state per sequence that each step reads and updates (backends/base.py's
StatePoolLike). The runner allocates one slot per sequence that may run at once (--parallel); the
scheduler admits a sequence only with a free slot and gives the slot back when the sequence
finishes, is cancelled or is preempted. A preempted sequence is recomputed from its first token,
which rebuilds its state (the state at position 0 is zero whatever the slot held, so slots are
never cleared).

The prefix cache does not serve such a model: a cached prefix's K/V are of no use without the
recurrent state at the prefix's end, which nothing keeps (snapshots of the state at block
boundaries are the follow-up), so the engine names no block (every prompt is prefilled cold).
Speculative decoding is refused for the same reason: a rejected draft token's update of the
state cannot be taken back.
"""
from __future__ import annotations


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
