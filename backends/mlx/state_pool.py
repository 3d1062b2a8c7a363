"""The recurrent state of a hybrid model's sequences in MLX arrays, beside the paged KV cache.

A fixed number of slots, allocated once: a slot holds one sequence's state for every recurrent
layer, of each kind the model has (ModelConfig.state_shapes; float32 as the cpu backend's and
llama.cpp's): "conv", a causal convolution's last L - 1 inputs (LFM2's short convolutions: B * x;
Qwen3.5's gated delta nets: Q|K|V; Granite 4.0 H's Mamba-2 mixers: xBC), "delta", a gated delta
net's (S x S) matrix per value head, and "ssm", a Mamba-2 scan's (P x N) state per head.
Which slot belongs to which sequence is the engine's business (engine/state_slots.py); a batch
names each sequence's slot (Batch.state_slots), and MlxPrimitives.shortconv / delta_net / mamba2
gather the rows they need and scatter the new ones in place.
"""
from __future__ import annotations

import mlx.core as mx


class MlxStatePool:
    def __init__(self, cfg, n_slots: int):
        if n_slots < 1:
            raise ValueError("a state pool needs at least one slot")
        shapes = cfg.state_shapes
        rows, width = shapes["conv"]
        self.n_slots = n_slots
        self.rows = rows  # L - 1: a slot's rows in each layer
        self.layer_at = {il: j for j, il in enumerate(cfg.recurrent_layers)}
        # conv[j]: (n_slots * (L - 1), width) f32, recurrent layer j's states, slot s in rows
        # s (L - 1) .. s (L - 1) + L - 2, oldest input first. Flat rows: one index array addresses
        # any slot's rows for a gather or an in-place scatter.
        self.conv = [mx.zeros((n_slots * rows, width), mx.float32) for _ in self.layer_at]
        # delta[j]: (n_slots, Hv, S, S) f32, recurrent layer j's delta-rule matrices (M[j, i]: value
        # component j, key component i); [] for a model without gated delta nets
        self.delta = [mx.zeros((n_slots, *shapes["delta"]), mx.float32) for _ in self.layer_at] \
            if "delta" in shapes else []
        # ssm[j]: (n_slots, H, P, N) f32, recurrent layer j's Mamba-2 scan states (head, row of the
        # head's P, state component); [] for a model without Mamba-2 mixers
        self.ssm = [mx.zeros((n_slots, *shapes["ssm"]), mx.float32) for _ in self.layer_at] \
            if "ssm" in shapes else []
        mx.eval(self.arrays())

    @staticmethod
    def bytes_per_slot(cfg) -> int:
        return cfg.state_bytes()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    def arrays(self) -> list[mx.array]:
        return self.conv + self.delta + self.ssm

    def copy(self, src: int, dst: int) -> None:
        """Slot dst's state becomes slot src's (a snapshot taken or restored), every layer and kind
        of it. Evaluated here: the copy then sits between the pass that wrote src and the next one
        that reads dst, whichever thread runs them."""
        r = self.rows
        for a in self.conv:
            a[dst * r:(dst + 1) * r] = a[src * r:(src + 1) * r]
        for a in self.delta + self.ssm:
            a[dst] = a[src]
        mx.eval(self.arrays())

    def index(self, il: int) -> int:
        """Layer il's position in conv (and delta, ssm)."""
        return self.layer_at[il]
