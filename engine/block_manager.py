"""Paged KV cache bookkeeping: which blocks of the pool each sequence holds.

Pure bookkeeping, no tensors: the backend owns the pool's memory and is told which rows to
use (block tables) and which blocks to copy.  The model's layers fall into KV groups (see
ModelConfig.kv_groups); each group has its own pool of blocks, all of the same size in tokens:
- full-attention groups keep every block of a sequence;
- sliding-window groups drop the blocks that have fallen out of the window, so a long
  context costs only the full-attention layers' memory.

Prefix caching: a full block is named by a chained hash of its tokens (with every token before
it, and the model), the same name in every group.  A new sequence whose prompt starts with
named blocks takes them instead of recomputing them.  A block is shared by reference count;
one is copied before a sequence writes into it while shared (copy-on-write).  Blocks nobody
holds stay findable until their memory is needed: they are reused least recently freed first.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


class BlockPool:
    """The blocks of one KV group: reference counts, the free list and the prefix cache index."""

    def __init__(self, n_blocks: int):
        if n_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.ref = [0] * n_blocks
        self.hash_of: list[bytes | None] = [None] * n_blocks
        self.by_hash: dict[bytes, int] = {}
        self.free: deque[int] = deque(range(n_blocks))  # unnamed, held by nobody
        self.cached: OrderedDict[int, None] = OrderedDict()  # named, held by nobody; oldest first

    @property
    def n_available(self) -> int:
        return len(self.free) + len(self.cached)

    @property
    def n_used(self) -> int:
        return self.n_blocks - self.n_available

    def allocate(self) -> int:
        if self.free:
            b = self.free.popleft()
        elif self.cached:
            b, _ = self.cached.popitem(last=False)  # evict the least recently freed named block
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
        else:
            raise RuntimeError("KV pool exhausted (the scheduler checks before allocating)")
        self.ref[b] = 1
        return b

    def take(self, b: int) -> None:
        """One more holder of block b (a prefix cache hit)."""
        if self.ref[b] == 0:
            del self.cached[b]
        self.ref[b] += 1

    def release(self, b: int) -> None:
        if self.ref[b] <= 0:
            raise RuntimeError(f"block {b} released more often than taken")
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if self.hash_of[b] is not None:
                self.cached[b] = None
            else:
                self.free.append(b)

    def lookup(self, h: bytes) -> int | None:
        return self.by_hash.get(h)

    def name(self, b: int, h: bytes) -> None:
        """Register full block b under hash h (unless another block already has that name)."""
        if h not in self.by_hash and self.hash_of[b] is None:
            self.by_hash[h] = b
            self.hash_of[b] = h


@dataclass
class _SeqBlocks:
    tables: list[list[int]]  # per group: block of positions i*bs .. i*bs+bs-1, or -1 if dropped
    hashes: list[bytes] = field(default_factory=list)  # names of the leading full blocks
    num_computed: int = 0  # tokens whose K/V are in the cache


@dataclass(frozen=True)
class KVUsage:
    block_size: int
    blocks_total: tuple[int, ...]  # per group
    blocks_used: tuple[int, ...]  # held by some sequence
    blocks_cached: tuple[int, ...]  # held by nobody but still findable by the prefix cache
    bytes_total: int
    bytes_used: int


class BlockManager:
    def __init__(self, n_blocks: list[int] | tuple[int, ...], block_size: int, windows: list[int] | tuple[int, ...],
                 model_key: bytes = b"", block_bytes: tuple[int, ...] | None = None,
                 on_free: Callable[[int], None] | None = None, naming: bool = True, keep_extra: int = 0):
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        if len(n_blocks) != len(windows):
            raise ValueError("one block count per KV group is needed")
        self.block_size = block_size
        self.on_free = on_free
        self.windows = tuple(int(w) for w in windows)
        self.pools = [BlockPool(int(n)) for n in n_blocks]
        self.block_bytes = block_bytes or (0,) * len(self.pools)
        self.model_key = model_key
        # naming: full blocks become findable by their tokens (the prefix cache); a draft model's
        # manager, whose sequences roll back, names nothing.  keep_extra: positions a sliding
        # window keeps beyond what attention needs, so that a rollback finds them still there.
        self.naming, self.keep_extra = naming, keep_extra
        self.seqs: dict[object, _SeqBlocks] = {}
        # prefix cache statistics: prompt tokens looked up, and those found
        self.lookup_tokens = 0
        self.hit_tokens = 0

    # -- names ----------------------------------------------------------------------------------

    def _chain(self, prev: bytes, tokens) -> bytes:
        # the first block's name starts from the model's key, so models never share blocks
        h = hashlib.blake2b(prev or self.model_key, digest_size=16)
        h.update(np.asarray(tokens, np.int64).tobytes())
        return h.digest()

    def _names(self, tokens, start: list[bytes], n_full: int) -> list[bytes]:
        names = list(start)
        bs = self.block_size
        for i in range(len(names), n_full):
            names.append(self._chain(names[-1] if names else b"", tokens[i * bs:(i + 1) * bs]))
        return names

    def _first_kept(self, g: int, n: int) -> int:
        """First block index group g still needs when the next position to compute is n."""
        w = self.windows[g]
        return max(0, n - w + 1 - self.keep_extra) // self.block_size if w > 0 else 0

    # -- prefix cache ---------------------------------------------------------------------------

    def _match(self, tokens, state_at: Callable[[bytes], bool] | None = None) -> tuple[int, int, list[bytes]]:
        """(tokens reusable, leading blocks used, names of the prompt's full blocks). state_at: a
        hybrid model's prefix must also end at a block boundary whose recurrent state is kept
        (state_at(name of the block ending there))."""
        bs = self.block_size
        names = self._names(tokens, [], len(tokens) // bs)
        full = [g for g, w in enumerate(self.windows) if w == 0]
        n_blocks = 0
        for h in names:
            if any(self.pools[g].lookup(h) is None for g in full):
                break
            n_blocks += 1
        # the last token is always computed again: its logits are needed
        for L in range(n_blocks, 0, -1):
            n = min(L * bs, len(tokens) - 1)
            ok = True
            for g, w in enumerate(self.windows):
                if w > 0 and any(self.pools[g].lookup(names[i]) is None
                                 for i in range(self._first_kept(g, n), (n - 1) // bs + 1)):
                    ok = False
                    break
            if ok and n > 0 and (state_at is None or (n == L * bs and state_at(names[L - 1]))):
                return n, L, names
        return 0, 0, names

    def cached_prefix(self, tokens) -> int:
        """How many leading tokens of `tokens` the prefix cache would provide now."""
        return self._match(tokens)[0]

    # -- sequences ------------------------------------------------------------------------------

    def begin(self, seq_id, tokens, reuse: bool = True, state_at: Callable[[bytes], bool] | None = None) -> int:
        """Start tracking a sequence about to compute `tokens`; takes the cached blocks of its
        longest cached prefix (none when not reuse; with state_at, see _match) and returns how many
        tokens need not be computed."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        n, L, names = self._match(tokens, state_at) if reuse else (0, 0, self._names(tokens, [], len(tokens) // self.block_size))
        n_take = -(-n // self.block_size)  # the blocks holding positions < n
        tables: list[list[int]] = []
        for g, pool in enumerate(self.pools):
            first = self._first_kept(g, n)
            table = []
            for i in range(n_take):
                if i < first:
                    table.append(-1)
                else:
                    b = pool.lookup(names[i])
                    pool.take(b)
                    table.append(b)
            tables.append(table)
        self.seqs[seq_id] = _SeqBlocks(tables, names[:L], n)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += n
        return n

    def _needs(self, s: _SeqBlocks, n_new: int) -> list[int]:
        bs = self.block_size
        end = s.num_computed + n_new
        out = []
        for g, pool in enumerate(self.pools):
            table = s.tables[g]
            need = max(0, -(-end // bs) - len(table))
            i = s.num_computed // bs  # the block the first new token goes into
            if i < len(table) and table[i] >= 0 and pool.ref[table[i]] > 1:
                need += 1  # shared: copied before writing
            out.append(need)
        return out

    def can_append(self, seq_id, n_new: int) -> bool:
        s = self.seqs[seq_id]
        return all(n <= pool.n_available for n, pool in zip(self._needs(s, n_new), self.pools))

    def append(self, seq_id, n_new: int) -> list[tuple[int, int, int]]:
        """Give the sequence blocks for its next n_new positions; returns the copies
        (group, source block, destination block) to make before the forward pass writes."""
        s = self.seqs[seq_id]
        if not self.can_append(seq_id, n_new):
            raise RuntimeError("not enough free KV blocks (check can_append first)")
        bs = self.block_size
        end = s.num_computed + n_new
        copies = []
        for g, pool in enumerate(self.pools):
            table = s.tables[g]
            i = s.num_computed // bs
            if i < len(table) and table[i] >= 0 and pool.ref[table[i]] > 1:
                old = table[i]
                table[i] = pool.allocate()
                pool.release(old)
                copies.append((g, old, table[i]))
            while len(table) * bs < end:
                table.append(pool.allocate())
        return copies

    def commit(self, seq_id, tokens, n_new: int) -> None:
        """The forward pass wrote K/V of the next n_new tokens (tokens: the sequence so far, at
        least that long): name the blocks it completed and drop those out of every window."""
        s = self.seqs[seq_id]
        s.num_computed += n_new
        n = s.num_computed
        if self.naming:
            names = self._names(tokens, s.hashes, n // self.block_size)
            for i in range(len(s.hashes), len(names)):
                for g, pool in enumerate(self.pools):
                    if s.tables[g][i] >= 0:
                        pool.name(s.tables[g][i], names[i])
            s.hashes = names
        for g, pool in enumerate(self.pools):
            table = s.tables[g]
            for i in range(min(self._first_kept(g, n), len(table))):
                if table[i] >= 0:
                    pool.release(table[i])
                    table[i] = -1

    def trim(self, seq_id) -> None:
        """Give back the blocks past the sequence's computed tokens (taken for draft tokens that
        were rejected; never named, since commit names only computed blocks)."""
        s = self.seqs[seq_id]
        keep = -(-s.num_computed // self.block_size)
        for g, pool in enumerate(self.pools):
            table = s.tables[g]
            while len(table) > keep:
                b = table.pop()
                if b >= 0:
                    pool.release(b)

    def rollback(self, seq_id, n: int) -> None:
        """Forget the sequence's K/V past its first n tokens (a manager that names no block: the
        draft model's) and give back the blocks only they used."""
        if self.naming:
            raise RuntimeError("rollback needs a manager that names no block")
        s = self.seqs[seq_id]
        s.num_computed = min(n, s.num_computed)
        self.trim(seq_id)

    def free(self, seq_id) -> None:
        """Release every block of a finished, cancelled or preempted sequence."""
        s = self.seqs.pop(seq_id)
        if self.on_free is not None:  # a backend with per-sequence state (llama.cpp) lets it go
            self.on_free(seq_id)
        for g, pool in enumerate(self.pools):
            for b in reversed(s.tables[g]):  # the tail is the least likely to be shared: evicted first
                if b >= 0:
                    pool.release(b)

    def batch_tables(self, seq_ids: list, tok_seq: np.ndarray, positions: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """A forward pass's view of the blocks (backends/batch.py): per group the (S, max_blocks)
        block tables of the sequences (-1: not held), and the (G, T) cache row each token writes,
        for tokens of sequence row tok_seq at positions."""
        bs = self.block_size
        tables = []
        slots = np.empty((len(self.pools), len(positions)), np.int32)
        for g in range(len(self.pools)):
            ts = [self.seqs[sid].tables[g] for sid in seq_ids]
            arr = np.full((len(ts), max(len(t) for t in ts)), -1, np.int32)
            for i, t in enumerate(ts):
                arr[i, :len(t)] = t
            tables.append(arr)
            slots[g] = arr[tok_seq, positions // bs] * bs + positions % bs
        return tables, slots

    def tables(self, seq_id) -> list[list[int]]:
        return self.seqs[seq_id].tables

    def name_at(self, seq_id, n: int) -> bytes | None:
        """The name of the sequence's block ending at position n (a multiple of the block size),
        None where it has none (not yet computed, or a manager that names nothing)."""
        hashes = self.seqs[seq_id].hashes
        i = n // self.block_size - 1
        return hashes[i] if n % self.block_size == 0 and 0 <= i < len(hashes) else None

    def num_computed(self, seq_id) -> int:
        return self.seqs[seq_id].num_computed

    def held(self, seq_id) -> list[int]:
        """Blocks the sequence holds, per group."""
        return [sum(1 for b in t if b >= 0) for t in self.seqs[seq_id].tables]

    def usage(self) -> KVUsage:
        used = tuple(p.n_used for p in self.pools)
        return KVUsage(
            block_size=self.block_size,
            blocks_total=tuple(p.n_blocks for p in self.pools),
            blocks_used=used,
            blocks_cached=tuple(len(p.cached) for p in self.pools),
            bytes_total=sum(p.n_blocks * b for p, b in zip(self.pools, self.block_bytes)),
            bytes_used=sum(u * b for u, b in zip(used, self.block_bytes)),
        )
