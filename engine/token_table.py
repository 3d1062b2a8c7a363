"""Strings of code points in an open-addressing hash table, for numba: a vocabulary looked up by
its tokens' text (SentencePiece merging, WordPiece matching) and a text's repeated pieces.

A table is an int32 (or int64) array of a power-of-two size, -1 in empty slots, each other slot
the index of a string; the strings themselves live elsewhere as code point spans (a vocabulary:
tok_cps[tok_off[i]:tok_off[i + 1]] for token i). Collisions probe the next slot.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


class TokenTable:
    """A vocabulary's token texts as code points, and the table over them."""

    def __init__(self, tokens: list[str]):
        lengths = np.fromiter((len(t) for t in tokens), np.int64, len(tokens))
        self.tok_off = np.zeros(len(tokens) + 1, np.int64)
        np.cumsum(lengths, out=self.tok_off[1:])
        self.tok_cps = np.frombuffer("".join(tokens).encode("utf-32-le", "surrogatepass"), np.uint32)
        self.table = np.full(1 << max(4, int(2 * len(tokens)).bit_length()), -1, np.int32)
        build_table(self.tok_cps, self.tok_off, self.table)


@njit(cache=True, inline="always")
def hash_cps(cps, start, n):
    """FNV-1a over the code points cps[start:start + n] (uint64 arithmetic wraps)."""
    h = _FNV_OFFSET
    for i in range(start, start + n):
        h = (h ^ np.uint64(cps[i])) * _FNV_PRIME
    return h


@njit(cache=True, inline="always")
def same_cps(a, sa, na, b, sb, nb):
    """a[sa:sa + na] and b[sb:sb + nb] hold the same code points."""
    if na != nb:
        return False
    for i in range(na):
        if a[sa + i] != b[sb + i]:
            return False
    return True


@njit(cache=True)
def build_table(tok_cps, tok_off, table):
    """table: (M,) int32, M a power of two > 2 * tokens, all -1; token i is tok_cps[tok_off[i]:tok_off[i+1]].
    A text seen again takes the later id, as llama.cpp's token_to_id (the last assignment wins)."""
    mask = np.uint64(table.shape[0] - 1)
    for t in range(tok_off.shape[0] - 1):
        a, n = tok_off[t], tok_off[t + 1] - tok_off[t]
        slot = hash_cps(tok_cps, a, n) & mask
        while table[slot] >= 0:
            o = table[slot]
            if same_cps(tok_cps, tok_off[o], tok_off[o + 1] - tok_off[o], tok_cps, a, n):
                break
            slot = (slot + np.uint64(1)) & mask
        table[slot] = t


@njit(cache=True)
def lookup(cps, start, n, tok_cps, tok_off, table):
    """The id of the token spelled cps[start:start + n], or -1."""
    mask = np.uint64(table.shape[0] - 1)
    slot = hash_cps(cps, start, n) & mask
    while table[slot] >= 0:
        t = table[slot]
        if same_cps(tok_cps, tok_off[t], tok_off[t + 1] - tok_off[t], cps, start, n):
            return t
        slot = (slot + np.uint64(1)) & mask
    return -1
