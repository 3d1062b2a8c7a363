"""The paged KV cache in MLX arrays: per KV group and layer, K and V rows of n_blocks blocks.

Which block belongs to which sequence is the engine's business; this module holds the arrays,
copies a block (copy-on-write) and reports sizes.  Rows are float16 (as the cpu backend and
llama.cpp keep them); a forward pass scatters new rows in place (MLX reuses an array's buffer
for the update when nothing else holds it, so a step never copies a layer's whole cache).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from infer.backends.base import BlockKVPool

KV_DTYPE = mx.float16


class MlxKVPool(BlockKVPool):
    def __init__(self, cfg, n_blocks: list[int] | tuple[int, ...], block_size: int):
        super().__init__(cfg, n_blocks, block_size)
        groups = cfg.kv_groups
        # each group's own rows (ModelConfig.kv_group_shape)
        shapes = [cfg.kv_group_shape(gi) for gi in range(len(groups))]
        # k[g][j]: (n_blocks * block_size, KV heads, K row) of the j-th layer of group g
        self.k = [[mx.zeros((n * block_size, hkv, dk), KV_DTYPE) for _ in g.layers]
                  for g, n, (hkv, dk, _) in zip(groups, self.n_blocks, shapes)]
        # v likewise; a V row size of 0 (MLA, ModelConfig.kv_v_in_k) keeps no V: its V is the
        # leading head_dim_v of each K row (llama.cpp's K-only cache for it), so v is k itself
        self.v = self.k if all(dv == 0 for _, _, dv in shapes) else [
            [mx.zeros((n * block_size, hkv, dv), KV_DTYPE) for _ in g.layers]
            for g, n, (hkv, _, dv) in zip(groups, self.n_blocks, shapes)]
        mx.eval(self.k, self.v)

    def _sides(self) -> tuple[list[list[mx.array]], ...]:
        return (self.k,) if self.v is self.k else (self.k, self.v)

    def arrays(self) -> list[mx.array]:
        return [a for side in self._sides() for group in side for a in group]

    def copy_block(self, group: int, src: int, dst: int) -> None:
        bs = self.block_size
        for side in self._sides():
            for a in side[group]:
                # The block goes through numpy so the update holds no view of the array itself:
                # then MLX writes in place instead of copying the whole layer.
                blk = mx.array(np.array(a[src * bs:(src + 1) * bs]))
                a[dst * bs:(dst + 1) * bs] = blk
        mx.eval(self.k[group], self.v[group])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    @staticmethod
    def bytes_per_block(cfg, block_size: int) -> tuple[int, ...]:
        """Bytes one block of each KV group takes (K and V of all its layers; K alone for MLA)."""
        return cfg.kv_block_bytes(block_size, KV_DTYPE.size)
