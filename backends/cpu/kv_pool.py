"""The paged KV cache's memory on the CPU: per KV group, a pool of fixed-size blocks.

Which block belongs to which sequence is the engine's business (its block manager); this
module only holds the arrays, copies a block (copy-on-write) and reports sizes.

Keys and values are kept as llama.cpp keeps them for the same --cache-type-k / --cache-type-v:
f16 (uint16 bits per element) or q8_0 (per 32 elements of a head, llama.cpp's 34-byte block: an
f16 scale, then 32 int8 quants), so a row of a head is (D,) uint16 or (D // 32 * 34,) uint8 and the
attention kernel tells the two apart by dtype.  A quantized cache also holds its heads rotated, as
llama.cpp's does (see rotation).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from infer.backends.base import KV_CACHE_BYTES, BackendError, BlockKVPool

from .hugepages import lazy_zeros

Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # a q8_0 block: an f16 scale, then 32 int8 quants


def check_head_size(cache_type: str, flag: str, head_dim: int) -> None:
    if cache_type == "q8_0" and head_dim % Q8_0_BLOCK:
        raise BackendError(f"{flag} q8_0 needs a head size that is a multiple of {Q8_0_BLOCK}; "
                           f"this model's is {head_dim}")


def rotation(cache_type: str, head_dim: int, widest: bool) -> int:
    """The size of the Walsh-Hadamard rotation llama.cpp applies to heads kept in a quantized cache
    (0: none).  An orthonormal rotation spreads an outlier over many elements, so one large value no
    longer sets a whole block's scale: llama.cpp rotates Q and K by the widest power of two (from 64)
    that divides the head size, V in chunks of 64 and the attention output back (the rotation is its
    own inverse); heads whose size is not a multiple of 64 are not rotated (llama.cpp's
    src/llama-kv-cache.cpp, build_input_k_rot / build_input_v_rot; LLAMA_ATTN_ROT_DISABLE=1 turns
    it off there, and then infer's results differ from llama.cpp's)."""
    if cache_type == "f16" or head_dim % 64:
        return 0
    n = 64
    while widest and head_dim % (2 * n) == 0:
        n *= 2
    return n


def _rows(cache_type: str, n_layers: int, n_rows: int, n_head: int, head_dim: int) -> np.ndarray:
    # zeroed lazily in ordinary pages (hugepages.lazy_zeros): a short sequence touches little of it
    if cache_type == "q8_0":
        return lazy_zeros((n_layers, n_rows, n_head, head_dim // Q8_0_BLOCK * Q8_0_BYTES), np.uint8)
    return lazy_zeros((n_layers, n_rows, n_head, head_dim), np.uint16)


def kind_layers(cfg) -> list[int]:
    """A layer of each kind of attention: a global layer (or 0), then a sliding-window layer where
    its shape differs (ModelConfig.attn_shape: Gemma 4's); the runner's per-kind scratch and
    rotations are in that order."""
    swa = [il for il in range(cfg.n_layer) if cfg.layer_swa[il]]
    full = [il for il in range(cfg.n_layer) if not cfg.layer_swa[il]]
    first = full[0] if full else 0
    return [first, swa[0]] if swa and cfg.attn_shape(swa[0]) != cfg.attn_shape(first) else [first]


def layer_kind(cfg, il: int) -> int:
    """Which of kind_layers' kinds layer il's attention is."""
    kinds = kind_layers(cfg)
    return 1 if len(kinds) > 1 and cfg.attn_shape(il) == cfg.attn_shape(kinds[1]) else 0


class KVPool(BlockKVPool):
    def __init__(self, cfg, n_blocks: list[int] | tuple[int, ...], block_size: int,
                 cache_type_k: str = "f16", cache_type_v: str = "f16"):
        super().__init__(cfg, n_blocks, block_size)
        groups = cfg.kv_groups
        # k[g]: (layers in group, n_blocks * block_size, n_head_kv, K row) f16 bits or q8_0 blocks
        # each group's own rows (ModelConfig.kv_group_shape: Gemma 4's sliding-window layers differ)
        shapes = [cfg.kv_group_shape(gi) for gi in range(len(groups))]
        self.k = [_rows(cache_type_k, len(g.layers), n * block_size, hkv, dk)
                  for g, n, (hkv, dk, _) in zip(groups, self.n_blocks, shapes)]
        # v[g]: likewise with V rows; a V row size of 0 (MLA, ModelConfig.kv_v_in_k) keeps no V: its V
        # is the leading head_dim_v of each K row (llama.cpp's K-only cache for it), so v is k itself
        self.v = self.k if all(dv == 0 for _, _, dv in shapes) else [
            _rows(cache_type_v, len(g.layers), n * block_size, hkv, dv)
            for g, n, (hkv, _, dv) in zip(groups, self.n_blocks, shapes)]

    def layer(self, il: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(group, K rows, V rows) of layer il."""
        g, j = self.layer_at[il]
        return g, self.k[g][j], self.v[g][j]

    def copy_block(self, group: int, src: int, dst: int) -> None:
        bs = self.block_size
        for a in self._arrays(group):
            a[:, dst * bs:(dst + 1) * bs] = a[:, src * bs:(src + 1) * bs]

    def _arrays(self, group: int) -> tuple[np.ndarray, ...]:
        """The arrays of a group's blocks: K and V, or K alone where V is K's (MLA)."""
        return (self.k[group],) if self.v is self.k else (self.k[group], self.v[group])

    def block_bytes(self, group: int) -> int:
        return sum(a.nbytes for a in self._arrays(group)) // max(self.n_blocks[group], 1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for g in range(len(self.k)) for a in self._arrays(g))

    @staticmethod
    def bytes_per_block(cfg, block_size: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> tuple[int, ...]:
        """Bytes one block of each KV group takes (K and V of all its layers)."""
        return cfg.kv_block_bytes(block_size, KV_CACHE_BYTES[cache_type_k], KV_CACHE_BYTES[cache_type_v])


class SequenceKV:
    """A KV cache for one sequence, the simple case: a pool with as many blocks as the context
    needs and the identity block table."""

    def __init__(self, cfg, n_ctx: int, block_size: int = 16, cache_type_k: str = "f16", cache_type_v: str = "f16"):
        n = math.ceil(n_ctx / block_size)
        self.n_ctx = n_ctx
        self.pool = KVPool(cfg, [n] * len(cfg.kv_groups), block_size, cache_type_k, cache_type_v)
        self.tables = [np.arange(n, dtype=np.int32)[None, :] for _ in cfg.kv_groups]
        self.states: Any = None  # a hybrid model's one-slot StatePool (CpuRunner.new_kv_cache sets it)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes
