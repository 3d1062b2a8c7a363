"""The backend interface: what the engine asks of any compute backend (cpu, mlx, llama.cpp).

A backend turns a loaded model into a Runner.  The engine owns every decision about which
sequence runs and where its K/V live (block tables, see batch.py); a runner only computes.
Nothing here knows the scheduler, the tokenizer, a terminal or HTTP.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, TypeVar

import numpy as np

from infer.quant.errors import InferError

from .batch import Batch


class BackendError(InferError, ValueError):
    """A backend that cannot run here or cannot run this model; the message says what to do."""


# llama.cpp's --cache-type-k / --cache-type-v values infer runs, and the bytes one cached value takes
# (q8_0: llama.cpp's block of 32 int8 quants and an f16 scale)
KV_CACHE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}


def check_cache_type(flag: str, value: str) -> None:
    """One clear line for a KV cache type infer does not run."""
    if value not in KV_CACHE_BYTES:
        raise BackendError(f"{flag}: unknown KV cache type {value!r} (choose from {', '.join(KV_CACHE_BYTES)})")


@dataclass(frozen=True)
class RunnerOptions:
    n_threads: int = 0  # 0: every core
    max_tokens: int = 512  # most tokens one forward pass takes
    gpu_layers: int = -1  # llama.cpp: layers offloaded to the GPU (-1: all)
    max_seqs: int = 0  # sequences the engine runs at once (0: not said); llama.cpp sizes its slots by it
    mmap: bool = True  # False (--no-mmap): weights read into process memory, nothing read from the file later
    mlock: bool = False  # --mlock: the weights pinned in RAM
    cache_type_k: str = "f16"  # --cache-type-k: how the KV cache keeps keys (KV_CACHE_BYTES)
    cache_type_v: str = "f16"  # --cache-type-v: and values

    def __post_init__(self) -> None:
        check_cache_type("--cache-type-k", self.cache_type_k)
        check_cache_type("--cache-type-v", self.cache_type_v)


class KVPoolLike(Protocol):
    """A backend's paged KV memory: per KV group n_blocks blocks of block_size token rows."""

    @property
    def nbytes(self) -> int:
        """Bytes the pool takes (read only: block pools sum their arrays)."""

    def copy_block(self, group: int, src: int, dst: int) -> None:
        """Copy-on-write: block dst of the group gets block src's K/V."""

    def free_sequence(self, seq_id: int) -> None:
        """The engine dropped this sequence's blocks (finished, cancelled or preempted).
        Backends that keep per-sequence state (llama.cpp) release it; block pools ignore it."""


class BlockKVPool:
    """The part of a block pool (cpu, MLX) that is the same everywhere: n_blocks[g] blocks of
    block_size rows for KV group g, each group's window, and where each layer's K/V live."""

    def __init__(self, cfg, n_blocks: list[int] | tuple[int, ...], block_size: int):
        groups = cfg.kv_groups
        if len(n_blocks) != len(groups):
            raise ValueError(f"{len(groups)} KV groups but {len(n_blocks)} block counts")
        self.block_size = block_size
        self.n_blocks = tuple(int(n) for n in n_blocks)
        self.windows = tuple(g.window for g in groups)
        self.chunked = tuple(g.chunked for g in groups)  # each group's window a chunk (llama4)
        self.layer_at = cfg.kv_layer_index  # layer -> (group, index within group)

    def free_sequence(self, seq_id: int) -> None:
        pass  # blocks are all such a pool knows; the engine's block manager already took them back


# The kinds of recurrent state (models' ModelConfig.state_shapes) each backend's own kernels keep: a
# model with another kind is refused there (MlxRunner) and auto does not send it there
# (registry.choose_backend). llama.cpp keeps its own.
STATE_KINDS = MappingProxyType({"cpu": frozenset({"conv", "delta", "ssm"}), "mlx": frozenset({"conv", "delta", "ssm"})})


class StatePoolLike(Protocol):
    """A backend's recurrent state of a hybrid model's sequences (LFM2's short convolutions):
    n_slots slots, each one sequence's state for all its recurrent layers, allocated once. The
    engine gives each running sequence a slot (Batch.state_slots); the state at a sequence's
    position 0 is zero whatever its slot held, so a slot needs no clearing between sequences.
    The engine also keeps snapshots of states in slots no sequence runs in (prefix caching and
    speculation on such a model, engine/state_slots.py), through copy()."""

    n_slots: int

    def copy(self, src: int, dst: int) -> None:
        """Make slot dst's state (all its recurrent layers, every kind of state) a copy of slot
        src's. Called between forward passes only; a backend with asynchronous compute (mlx) must
        order it after the pass that wrote src and before the next one that reads dst."""

    @property
    def nbytes(self) -> int:
        """Bytes the pool takes."""


P = TypeVar("P", bound=KVPoolLike)  # a runner's own pool type: it computes only on the pools it made
S = TypeVar("S", bound=StatePoolLike)  # and its own state pool type


class Runner(Protocol[P, S]):
    """A model's weights uploaded to a backend, ready for batched forward passes."""

    backend: str  # "cpu", "mlx", "llama.cpp"
    max_tokens: int  # most tokens one forward_batch takes
    n_threads: int  # CPU threads it uses (reported by bench and the stats lines)
    embeddings: bool  # forward_batch fills batch.hidden (the engine's embedding requests need it)

    def bytes_per_block(self, block_size: int) -> tuple[int, ...]:
        """Bytes one block of each KV group takes (for sizing the pool from --kv-memory)."""

    def new_kv_pool(self, n_blocks: list[int], block_size: int) -> P:
        """Allocate the KV pool: n_blocks[g] blocks for KV group g."""

    def state_bytes_per_seq(self) -> int:
        """Bytes one sequence's recurrent state takes in this runner's state pool (0: the model has
        no recurrent layers, and needs no state pool)."""

    def new_state_pool(self, n_slots: int) -> S | None:
        """Allocate the recurrent state of n_slots sequences (None where the model has none)."""

    def forward_batch(self, batch: Batch, pool: P, states: S | None = None) -> np.ndarray:
        """Run batch (tokens of several sequences, at most max_tokens), writing each token's K/V
        to its slot, and return float32 logits (R, V) of batch.logit_rows, valid until the next call;
        with batch.hidden_rows, also copy those tokens' final hidden states into batch.hidden. A
        hybrid model also reads and updates each sequence's recurrent state in `states`, at its
        slot batch.state_slots, continuing from its tokens before the batch's (which must be the
        previous ones the state saw: a sequence steps back only by a restored snapshot, StatePoolLike.copy)."""

    def warmup(self) -> None:
        """Compile / load kernels now rather than inside the first request."""

    def devices(self) -> list[str]:
        """What this runner computes on, for stats lines ("cpu: 2 threads", "cuda:0 NVIDIA H100")."""
