"""The pieces a pre-tokenizer cut a text into, each distinct piece encoded once.

A long prompt repeats its words: 1 MB of prose and code is about 250,000 pieces but 13,000
distinct ones. unique_pieces finds, in numba, each piece's first equal piece (a token_table.py
hash table over the code points); the caller's encoder runs once per distinct piece and gather_ids
lays the ids out for every piece in order.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from infer.engine.token_table import hash_cps, same_cps


def encode_pieces(text: str, cps: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  encode: Callable[[list[str]], tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """The ids of text's pieces (spans of cps, text's code points, in order): (ids, offsets),
    piece p's ids being ids[offsets[p]:offsets[p + 1]]. encode(distinct pieces) gives their ids
    one after another and how many each has."""
    if len(starts) == 0:
        return np.zeros(0, np.int32), np.zeros(1, np.int64)
    first = unique_pieces(cps, starts, ends)
    uniq = np.flatnonzero(first == np.arange(len(first)))
    uniq_of = np.empty(len(first), np.int64)
    uniq_of[uniq] = np.arange(len(uniq))
    ids, counts = encode([text[a:b] for a, b in zip(starts[uniq].tolist(), ends[uniq].tolist())])
    offsets = np.zeros(len(uniq) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return gather_ids(first, uniq_of, np.asarray(ids, np.int32), offsets)


@njit(cache=True)
def unique_pieces(cps, starts, ends):
    """cps: (N,) uint32; starts, ends: (M,) int64 pieces. Returns (M,) int64: for each piece, the
    index of the first piece with the same code points."""
    m = starts.shape[0]
    size = 1
    while size < 2 * m + 2:
        size *= 2
    table = np.full(size, -1, np.int64)  # slot -> index of a first piece
    first = np.empty(m, np.int64)
    mask = np.uint64(size - 1)
    for p in range(m):
        a, n = starts[p], ends[p] - starts[p]
        slot = hash_cps(cps, a, n) & mask
        while True:
            q = table[slot]
            if q < 0:
                table[slot] = p
                first[p] = p
                break
            if same_cps(cps, starts[q], ends[q] - starts[q], cps, a, n):
                first[p] = q
                break
            slot = (slot + np.uint64(1)) & mask
    return first


@njit(cache=True)
def gather_ids(first, uniq_of, ids, offsets):
    """first: (M,) int64 each piece's first equal piece; uniq_of: (M,) int64 a first piece's
    index among the unique ones; ids: (T,) int32 the unique pieces' ids, piece u's at
    ids[offsets[u]:offsets[u + 1]]. Returns every piece's ids in order, (R,) int32, and where
    each piece's start, (M + 1,) int64."""
    starts = np.empty(first.shape[0] + 1, np.int64)
    starts[0] = 0
    for p in range(first.shape[0]):
        u = uniq_of[first[p]]
        starts[p + 1] = starts[p] + offsets[u + 1] - offsets[u]
    out = np.empty(starts[-1], np.int32)
    for p in range(first.shape[0]):
        u = uniq_of[first[p]]
        out[starts[p]:starts[p + 1]] = ids[offsets[u]:offsets[u + 1]]
    return out, starts
