"""The llama.cpp backend: infer's engine scheduling, llama.cpp's kernels (CPU, CUDA, Metal, Vulkan).

One llama_model and one llama_context through llama-cpp-python's low-level API.  The engine keeps
deciding what runs (continuous batching, paged-KV bookkeeping, prefix cache, preemption); llama.cpp
keeps the K/V in its own unified cache, one sequence slot per engine sequence, which slots.py maps.
The context is made when the engine sizes its pool (new_kv_pool): as many cache cells as the
pool's global-group blocks hold tokens, plus headroom for finished sequences kept as prefix donors.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import weakref
from pathlib import Path

import numpy as np

from infer.backends.base import KV_CACHE_BYTES, BackendError, RunnerOptions, StatePoolLike
from infer.backends.batch import Batch

from .devices import llamacpp_devices
from .slots import SlotPool

GGML_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type of each --cache-type (ggml.h)
HEADROOM = 4  # one cell in 4 more than the engine's blocks hold: donors' cells, and prefix
# positions llama.cpp must recompute where the engine shares blocks
DONOR_SLOTS = 8  # slots beyond the running sequences for finished ones whose cells a prefix can reuse


GGML_LOG_LEVEL_ERROR = 4


@functools.cache
def _error_log_callback():
    """A llama.cpp log callback passing on errors only.  llama-cpp-python's own maps this
    llama.cpp's levels off by one (warnings print as errors, errors are dropped).  Made once and
    never freed: llama.cpp keeps calling it for the life of the process."""
    import llama_cpp

    @llama_cpp.llama_log_callback
    def log(level: int, text: bytes, user_data) -> None:
        if level == GGML_LOG_LEVEL_ERROR:
            sys.stderr.write(text.decode("utf-8", errors="replace"))

    return log


class _Memory:
    """The context's memory (KV cache) operations slots.py uses."""

    def __init__(self, llama_cpp, ctx):
        self.lib = llama_cpp
        self.mem = llama_cpp.llama_get_memory(ctx)

    def rm(self, slot: int, p0: int, p1: int) -> bool:
        return bool(self.lib.llama_memory_seq_rm(self.mem, slot, p0, p1))

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def pos_min(self, slot: int) -> int:
        return int(self.lib.llama_memory_seq_pos_min(self.mem, slot))


class _BatchBuffer:
    """A llama_batch whose arrays are numpy buffers (filled without a Python loop per token);
    every token belongs to exactly one sequence."""

    def __init__(self, llama_cpp, capacity: int):
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.seq = np.zeros(capacity, np.int32)
        self.seq_ptr = (self.seq.ctypes.data + 4 * np.arange(capacity)).astype(np.uintp)  # &seq[i]
        self.logits = np.zeros(capacity, np.int8)
        p = ctypes.POINTER
        self.struct = llama_cpp.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(p(ctypes.c_int32)),
            embd=None,
            pos=self.pos.ctypes.data_as(p(ctypes.c_int32)),
            n_seq_id=self.n_seq_id.ctypes.data_as(p(ctypes.c_int32)),
            seq_id=ctypes.cast(self.seq_ptr.ctypes.data, p(p(ctypes.c_int32))),
            logits=self.logits.ctypes.data_as(p(ctypes.c_int8)),
        )

    def fill(self, tokens, positions, slots, logit_rows=None) -> None:
        n = len(tokens)
        self.token[:n] = tokens
        self.pos[:n] = positions
        self.seq[:n] = slots
        self.logits[:n] = 0
        if logit_rows is not None:
            self.logits[logit_rows] = 1
        self.struct.n_tokens = n


class LlamaCppRunner:
    """A GGUF model loaded by llama.cpp, computing the engine's batches (see backends/base.py)."""

    backend = "llama.cpp"
    embeddings = False  # its context is built for logits; an embedding context is another llama_context

    def __init__(self, path: str | Path, config, options: RunnerOptions = RunnerOptions(), flash_attn: bool = False):
        import llama_cpp

        self._lib = llama_cpp
        self.path = Path(path)
        self.cfg = config
        self.max_tokens = options.max_tokens
        self.n_threads = options.n_threads or os.cpu_count() or 1
        self.gpu_layers = options.gpu_layers
        self.max_seqs = options.max_seqs
        self.cache_types = (options.cache_type_k, options.cache_type_v)
        # llama.cpp runs a quantized V cache only through flash attention (it refuses it otherwise)
        self.flash_attn = flash_attn or options.cache_type_v != "f16"
        llama_cpp.llama_log_set(_error_log_callback(), ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = options.gpu_layers  # negative: every layer
        params.use_mmap = options.mmap
        params.use_mlock = options.mlock
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise BackendError(f"{self.path}: llama.cpp could not load this model (is llama-cpp-python too old "
                               f"for its architecture {config.arch!r}?)")
        self._model = model
        self._model_free = weakref.finalize(self, llama_cpp.llama_model_free, model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        if self.n_vocab != config.n_vocab:
            raise BackendError(f"{self.path}: llama.cpp reads {self.n_vocab} vocabulary entries, infer {config.n_vocab}")
        self.n_swa = int(llama_cpp.llama_model_n_swa(model)) if any(config.layer_swa) else 0
        self._ctx = None
        self._ctx_free = None
        self._pool: SlotPool | None = None
        self._batch = _BatchBuffer(llama_cpp, self.max_tokens)

    # -- sizes and the pool ---------------------------------------------------------------------

    def _bytes_per_token(self) -> int:
        """llama.cpp's K and V of every layer for one position, in the cache types asked for (with
        swa_full, sliding-window layers keep every position too)."""
        k, v = self.cache_types
        return sum(self.cfg.kv_block_bytes(1, KV_CACHE_BYTES[k], KV_CACHE_BYTES[v]))

    def bytes_per_block(self, block_size: int) -> tuple[int, ...]:
        # llama.cpp's cache grows with positions, which the global group's blocks count (with the
        # headroom new_kv_pool adds); the sliding-window group's blocks cost nothing extra there
        per_block = block_size * self._bytes_per_token() * (HEADROOM + 1) // HEADROOM
        return (per_block,) + (0,) * (len(self.cfg.kv_groups) - 1)

    def _make_context(self, n_ctx: int, n_seq: int):
        lib = self._lib
        p = lib.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = p.n_ubatch = self.max_tokens
        p.n_seq_max = n_seq
        p.n_outputs_max_per_seq = 0  # as many logits rows per sequence as the batch asks
        p.n_threads = p.n_threads_batch = self.n_threads
        p.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.type_k, p.type_v = (GGML_TYPES[t] for t in self.cache_types)
        p.swa_full = True  # sliding-window layers keep every position, so prefixes can be shared later
        p.kv_unified = True  # one cell buffer for all slots: a shared prefix is shared cells
        p.no_perf = True
        ctx = lib.llama_init_from_model(self._model, p)
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context of {n_ctx} cells and {n_seq} sequences "
                               f"(out of memory? lower --ctx, --parallel or --kv-memory)")
        return ctx

    def _set_context(self, ctx) -> None:
        if self._ctx_free is not None:
            self._ctx_free()  # a second pool replaces the first (its engine must not run again)
        self._ctx = ctx
        self._ctx_free = weakref.finalize(self, self._lib.llama_free, ctx)

    def state_bytes_per_seq(self) -> int:
        return 0  # llama.cpp keeps a recurrent model's state in its own sequences, counted in its context

    def new_state_pool(self, n_slots: int) -> StatePoolLike | None:
        return None

    def new_kv_pool(self, n_blocks: list[int], block_size: int) -> SlotPool:
        lib = self._lib
        rows = int(n_blocks[0]) * block_size
        # at least a batch: llama.cpp caps its batch size at the context size
        n_ctx = max(rows + rows // HEADROOM, self.max_tokens)
        # slots for the running sequences and as many prefix donors (at least DONOR_SLOTS): llama.cpp
        # reserves a vocabulary-sized logits row per slot (1 MiB for Gemma's 262144 entries)
        want = self.max_seqs + max(DONOR_SLOTS, self.max_seqs) if self.max_seqs > 0 else self.max_tokens
        n_seq = max(1, min(int(lib.llama_max_parallel_sequences()), int(n_blocks[0]), self.max_tokens, want))
        self._set_context(self._make_context(n_ctx, n_seq))
        n_cells = int(lib.llama_n_ctx(self._ctx))
        self._pool = SlotPool(_Memory(lib, self._ctx), n_seq, rows, block_size, self.n_swa,
                              n_cells * self._bytes_per_token())
        return self._pool

    # -- computing ------------------------------------------------------------------------------

    def _decode(self, tokens, positions, slots, logit_rows, touched: list[int]) -> None:
        """One llama_decode, evicting prefix donors while the cache has no room."""
        pool = self._pool
        b = self._batch
        b.fill(tokens, positions, slots, logit_rows)
        while True:
            rc = self._lib.llama_decode(self._ctx, b.struct)
            if rc == 0:
                pool.commit(tokens, positions, slots)
                return
            if rc == 1 and pool.evict_donor():
                continue
            pool.rollback(touched)
            why = {1: "no room in its KV cache (raise --kv-memory or lower --parallel)", 2: "aborted",
                   -1: "invalid batch"}.get(rc, "fatal error")
            raise RuntimeError(f"llama.cpp decode of {len(tokens)} tokens failed ({rc}: {why})")

    def forward_batch(self, batch: Batch, pool: SlotPool, states: StatePoolLike | None = None) -> np.ndarray:
        """Decode the batch's tokens in the slots of their sequences; logits (R, V) of batch.logit_rows."""
        T = len(batch.tokens)
        if not 0 < T <= self.max_tokens:
            raise ValueError(f"a forward pass takes 1 to {self.max_tokens} tokens, got {T}")
        if pool is not self._pool or self._ctx is None:
            raise ValueError("this KV pool does not belong to the runner's current llama.cpp context")
        prep = pool.prepare(batch)
        cap = self.max_tokens
        n_pre = len(prep.pre_tokens)
        rows = np.asarray(batch.logit_rows, np.int64)
        if n_pre and n_pre + T <= cap:  # recomputed prefixes ride along in the same decode
            self._decode(np.concatenate([prep.pre_tokens, batch.tokens]),
                         np.concatenate([prep.pre_positions, batch.positions]),
                         np.concatenate([prep.pre_slots, prep.slots]), rows + n_pre, prep.touched)
        else:
            for s in range(0, n_pre, cap):
                part = slice(s, s + cap)
                self._decode(prep.pre_tokens[part], prep.pre_positions[part], prep.pre_slots[part], None,
                             prep.touched)
            self._decode(batch.tokens, batch.positions, prep.slots, rows, prep.touched)
        R = len(rows)
        if R == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        # llama_get_logits: the flagged tokens' rows, in batch order (logit_rows ascend).  Returned
        # in place, not copied (a vocabulary-sized row per sequence each step): llama.cpp keeps the
        # buffer until the next decode, as the Runner protocol asks.
        return np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx), shape=(R, self.n_vocab))

    def warmup(self) -> None:
        """Decode one token (loading weights, building the graph), then forget it."""
        lib = self._lib
        own = self._ctx is None
        ctx = self._make_context(256, 1) if own else self._ctx
        try:
            slot = 0
            if not own:
                pool = self._pool
                if not pool.empty and not pool.evict_donor():
                    return  # every slot is running a sequence: it is warm already
                slot = pool.empty[-1]
            b = _BatchBuffer(lib, 1)
            b.fill([0], [0], [slot], [0])
            if lib.llama_decode(ctx, b.struct) != 0:
                raise RuntimeError("llama.cpp warmup decode failed")
            lib.llama_memory_seq_rm(lib.llama_get_memory(ctx), slot, -1, -1)
        finally:
            if own:
                lib.llama_free(ctx)

    def devices(self) -> list[str]:
        devices, gpu = llamacpp_devices()
        where = "cpu" if not gpu or self.gpu_layers == 0 else f"{'all' if self.gpu_layers < 0 else self.gpu_layers} layers offloaded"
        threads = f"{self.n_threads} thread{'s' if self.n_threads != 1 else ''}"
        return [f"llama.cpp ({where}): {threads}"] + devices
