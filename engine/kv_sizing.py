"""How much memory an engine's pools take: the KV blocks per group that --ctx, --parallel and
--kv-memory give, and (a hybrid model) the recurrent state pool beside them."""
from __future__ import annotations

import math

from infer.backends.base import KV_CACHE_BYTES

from .config import EngineConfig, EngineConfigError


def state_snapshots(config: EngineConfig) -> int:
    """Snapshot slots of a hybrid model's state pool (state_slots.py): none without the prefix
    cache; by default four per running sequence (each holds at most two while it runs: its
    prompt's end and its newest boundary; the rest keep finished conversations)."""
    if not config.prefix_cache:
        return 0
    return 4 * config.max_seqs if config.state_snapshots < 0 else config.state_snapshots


def state_slots_needed(config: EngineConfig) -> int:
    """Slots of a hybrid model's state pool: one per running sequence, as many scratch slots
    again under speculation (a state before its draft), then the snapshots."""
    return config.max_seqs * (2 if config.spec.kind else 1) + state_snapshots(config)


def pool_blocks(n_ctx: int, windows: list[int], per_block: tuple[int, ...], config: EngineConfig,
                state_bytes: int = 0) -> list[int]:
    """Blocks per KV group: one sequence of n_ctx tokens needs ceil(n_ctx / bs) blocks in a
    full-attention group and at most its window plus one prefill chunk in a sliding-window group.
    --kv-memory holds the KV pool and a hybrid model's recurrent state pool (state_bytes per
    slot, state_slots_needed of them): the blocks get what the states leave."""
    bs = config.block_size
    full = math.ceil(n_ctx / bs)
    per_seq = [full if w == 0 else min(full, math.ceil((w + config.max_batch_tokens) / bs) + 1) for w in windows]
    if not config.kv_memory:
        return [n * config.max_seqs for n in per_seq]
    seq_bytes = sum(n * b for n, b in zip(per_seq, per_block))
    states = state_bytes * state_slots_needed(config)
    if config.kv_memory - states < seq_bytes:
        also = (f" and the recurrent state of --parallel {config.max_seqs} sequences with its "
                f"{state_slots_needed(config) - config.max_seqs} snapshots" if states else "")
        raise EngineConfigError(
            f"--kv-memory {config.kv_memory / 2**20:.1f} MiB cannot hold one sequence of {n_ctx} tokens{also} "
            f"(needs {(seq_bytes + states) / 2**20:.1f} MiB); raise it or lower --ctx"
        )
    scale = (config.kv_memory - states) / seq_bytes
    return [max(n, int(n * scale)) for n in per_seq]


def kv_pool_bytes(model_config, config: EngineConfig) -> int:
    """Bytes of the KV pool (and a hybrid model's recurrent state pool) an engine of this config
    allocates for this model on a block-pool backend (cpu, mlx): what a server counts before
    loading a model."""
    n_ctx = min(config.n_ctx, model_config.n_ctx_train)
    per_block = model_config.kv_block_bytes(config.block_size, KV_CACHE_BYTES[config.cache_type_k],
                                            KV_CACHE_BYTES[config.cache_type_v])
    state_bytes = model_config.state_bytes()
    blocks = pool_blocks(n_ctx, [g.window for g in model_config.kv_groups], per_block, config, state_bytes)
    return sum(n * b for n, b in zip(blocks, per_block)) + state_bytes * state_slots_needed(config)
