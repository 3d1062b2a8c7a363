"""The recurrent state of a hybrid model's sequences on the CPU, beside the paged KV cache.

A fixed number of slots, allocated once: a slot holds one sequence's state for every recurrent
layer (LFM2: each short-convolution layer's last L - 1 inputs). Which slot belongs to which
sequence is the engine's business (engine/state_slots.py); a batch names each sequence's slot
(Batch.state_slots) and the kernel (shortconv.py) reads and updates it in place. Slots past the
running sequences' hold snapshots (engine/state_slots.py): copy() moves a state between slots.
"""
from __future__ import annotations

import numpy as np


class StatePool:
    def __init__(self, cfg, n_slots: int):
        if n_slots < 1:
            raise ValueError("a state pool needs at least one slot")
        rows, width = cfg.state_shape
        self.n_slots = n_slots
        self.layer_at = {il: j for j, il in enumerate(cfg.recurrent_layers)}
        # conv[j]: (n_slots, L - 1, n_embd) f32, recurrent layer j's state of each slot, oldest input first
        self.conv = np.zeros((len(self.layer_at), n_slots, rows, width), np.float32)

    @staticmethod
    def bytes_per_slot(cfg) -> int:
        return cfg.state_bytes()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays())

    def _arrays(self) -> tuple[np.ndarray, ...]:
        # every per-slot array of the pool, slot on axis 1: what copy() moves (a new kind of state joins here)
        return (self.conv,)

    def copy(self, src: int, dst: int) -> None:
        """Slot dst's state becomes slot src's (a snapshot taken or restored), every array of it."""
        for a in self._arrays():
            a[:, dst] = a[:, src]

    def layer(self, il: int) -> np.ndarray:
        """Layer il's states, (n_slots, L - 1, n_embd): a view."""
        return self.conv[self.layer_at[il]]
