"""The engine's settings (EngineConfig), checked when made: what the CLI's flags become and what
every backend and the scheduler are sized by."""
from __future__ import annotations

from dataclasses import dataclass

from infer.backends.base import check_cache_type
from infer.backends.registry import BACKEND_CHOICES
from infer.quant.errors import InferError

from .pooling import PoolingError, choose_pooling
from .speculative import SpecConfig

DEFAULT_CTX = 4096
BLOCK_SIZE = 16


class EngineConfigError(InferError, ValueError):
    """Engine settings that cannot work (a KV pool too small for one sequence, say)."""


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = DEFAULT_CTX  # most tokens of one sequence; capped at the model's training context
    n_threads: int = 0  # 0: every core
    backend: str = "auto"  # cpu, mlx, llama.cpp or auto (see infer.backends.registry)
    gpu_layers: int = -1  # llama.cpp backend: layers offloaded to the GPU (-1: all)
    max_seqs: int = 8  # sequences running at once (--parallel)
    max_batch_tokens: int = 512  # tokens one forward pass takes: decodes first, then prefill chunks
    # bytes for the KV pool (and a hybrid model's recurrent state pool); 0: room for max_seqs sequences of n_ctx tokens
    kv_memory: int = 0
    block_size: int = BLOCK_SIZE
    prefix_cache: bool = True  # False: no block is found again by its tokens (every prompt prefilled cold)
    mmap: bool = True  # --no-mmap sets False: weights read into memory, the file not read after loading
    mlock: bool = False  # --mlock: weights pinned in RAM
    cache_type_k: str = "f16"  # --cache-type-k / --cache-type-v: f16 or q8_0 (see backends.base.KV_CACHE_BYTES)
    cache_type_v: str = "f16"
    pooling: str = ""  # --pooling: how embeddings pool ("mean", "cls", "last", "rank"); "": the file's, else mean
    # a hybrid model's recurrent state snapshots for its prefix cache (engine/state_slots.py); -1: 4 per --parallel
    state_snapshots: int = -1
    spec: SpecConfig = SpecConfig()  # --spec ngram|draft: speculative decoding (speculative.py, draft.py)

    def __post_init__(self) -> None:
        if self.n_ctx < 8:
            raise EngineConfigError(f"--ctx must be at least 8, got {self.n_ctx}")
        if self.n_threads < 0:
            raise EngineConfigError(f"--threads must be positive, got {self.n_threads}")
        check_cache_type("--cache-type-k", self.cache_type_k)
        check_cache_type("--cache-type-v", self.cache_type_v)
        if self.backend not in BACKEND_CHOICES:
            raise EngineConfigError(f"unknown backend {self.backend!r} (choose from {', '.join(BACKEND_CHOICES)})")
        if self.max_seqs < 1:
            raise EngineConfigError(f"--parallel must be at least 1, got {self.max_seqs}")
        if self.max_batch_tokens < 1:
            raise EngineConfigError(f"the batch token budget must be positive, got {self.max_batch_tokens}")
        if self.kv_memory < 0:
            raise EngineConfigError(f"--kv-memory must be positive, got {self.kv_memory}")
        if self.state_snapshots < -1:
            raise EngineConfigError(f"the state snapshot count must be -1 (auto) or more, got {self.state_snapshots}")
        if self.block_size < 1:
            raise EngineConfigError(f"the KV block size must be positive, got {self.block_size}")
        try:
            choose_pooling("", self.pooling)
        except PoolingError as e:
            raise EngineConfigError(str(e)) from None
