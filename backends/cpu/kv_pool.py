"""The paged KV cache's memory on the CPU: per KV group, a pool of fixed-size blocks.

Which block belongs to which sequence is the engine's business (its block manager); this
module only holds the arrays, copies a block (copy-on-write) and reports sizes.
"""
from __future__ import annotations

import math

import numpy as np

from infer.backends.base import BlockKVPool


class KVPool(BlockKVPool):
    def __init__(self, cfg, n_blocks: list[int] | tuple[int, ...], block_size: int):
        super().__init__(cfg, n_blocks, block_size)
        groups = cfg.kv_groups
        # k[g]: (layers in group, n_blocks * block_size, n_head_kv, head_dim) uint16 f16 bits
        self.k = [np.zeros((len(g.layers), n * block_size, cfg.n_head_kv, cfg.head_dim), np.uint16)
                  for g, n in zip(groups, self.n_blocks)]
        self.v = [np.zeros((len(g.layers), n * block_size, cfg.n_head_kv, cfg.head_dim_v), np.uint16)
                  for g, n in zip(groups, self.n_blocks)]

    def layer(self, il: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(group, K rows, V rows) of layer il."""
        g, j = self.layer_at[il]
        return g, self.k[g][j], self.v[g][j]

    def copy_block(self, group: int, src: int, dst: int) -> None:
        bs = self.block_size
        for a in (self.k[group], self.v[group]):
            a[:, dst * bs:(dst + 1) * bs] = a[:, src * bs:(src + 1) * bs]

    def block_bytes(self, group: int) -> int:
        return (self.k[group].nbytes + self.v[group].nbytes) // max(self.n_blocks[group], 1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    @staticmethod
    def bytes_per_block(cfg, block_size: int) -> tuple[int, ...]:
        """Bytes one block of each KV group takes (K and V of all its layers, f16)."""
        return cfg.kv_block_bytes(block_size, 2)


class SequenceKV:
    """A KV cache for one sequence, the simple case: a pool with as many blocks as the context
    needs and the identity block table."""

    def __init__(self, cfg, n_ctx: int, block_size: int = 16):
        n = math.ceil(n_ctx / block_size)
        self.n_ctx = n_ctx
        self.pool = KVPool(cfg, [n] * len(cfg.kv_groups), block_size)
        self.tables = [np.arange(n, dtype=np.int32)[None, :] for _ in cfg.kv_groups]

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes
