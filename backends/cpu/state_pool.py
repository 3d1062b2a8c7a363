"""The recurrent state of a hybrid model's sequences on the CPU, beside the paged KV cache.

A fixed number of slots, allocated once: a slot holds one sequence's state for every recurrent
layer, of each kind the model has (ModelConfig.state_shapes: LFM2's short convolution keeps its
last L - 1 inputs, "conv"; Qwen3.5's gated delta net its convolution's inputs and a delta-rule
matrix per value head, "conv" and "delta"; Mamba-2's its convolution's inputs and a scan state per
head, "conv" and "ssm"). Which slot belongs to which sequence is the engine's
business (engine/state_slots.py); a batch names each sequence's slot (Batch.state_slots) and the
kernels (shortconv.py, delta_net.py, mamba.py) read and update it in place. Slots past the running
sequences' hold snapshots (engine/state_slots.py): copy() moves a state between slots.
"""
from __future__ import annotations

import numpy as np


class StatePool:
    def __init__(self, cfg, n_slots: int):
        if n_slots < 1:
            raise ValueError("a state pool needs at least one slot")
        self.n_slots = n_slots
        self.layer_at = {il: j for j, il in enumerate(cfg.recurrent_layers)}
        # kinds[kind]: (n_recurrent_layers, n_slots, *shape) f32, recurrent layer j's state of each slot
        self.kinds = {kind: np.zeros((len(self.layer_at), n_slots, *shape), np.float32)
                      for kind, shape in cfg.state_shapes.items()}

    @staticmethod
    def bytes_per_slot(cfg) -> int:
        return cfg.state_bytes()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kinds.values())

    def copy(self, src: int, dst: int) -> None:
        """Slot dst's state becomes slot src's (a snapshot taken or restored), every kind of it
        (each kind's array: (recurrent layers, n_slots, *shape), the slot on axis 1)."""
        for a in self.kinds.values():
            a[:, dst] = a[:, src]

    def layer(self, il: int, kind: str = "conv") -> np.ndarray:
        """Layer il's states of one kind, (n_slots, *shape): a view."""
        return self.kinds[kind][self.layer_at[il]]
