"""Special tokens (control, user-defined, unknown) found in a text as llama.cpp finds them
(llama_vocab::impl::tokenizer_st_partition), and the token attribute bits that rule it.

Each special token in turn, the longest UTF-8 text first, takes every non-overlapping occurrence
in the text pieces the earlier ones left; LSTRIP and RSTRIP tokens take the whitespace beside them.
A text only tries the tokens whose first two characters it holds.
"""
from __future__ import annotations

import numpy as np

# llama.cpp's token attribute bits (llama_token_attr).
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
_C_SPACE = " \t\n\v\f\r"  # C isspace(), used for the lstrip/rstrip attributes


class SpecialTokens:
    """A vocabulary's special tokens in llama.cpp's matching order, indexed by their first two
    characters. Reads attrs as they are when partition runs (the tokenizer sets them first)."""

    def __init__(self, tokens: list[str], attrs: np.ndarray):
        self._tokens, self._attrs = tokens, attrs
        special = np.nonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN))[0]
        order = sorted(((-len(tokens[t].encode("utf-8")), int(t)) for t in special))
        self._rank = {tid: rank for rank, (_, tid) in enumerate(order)}
        self._by_prefix: dict[str, list[int]] = {}
        for _, tid in order:
            self._by_prefix.setdefault(tokens[tid][:2], []).append(tid)
        self._first = frozenset(key[0] for key in self._by_prefix)
        self._keys: dict[str, list[str]] = {}  # first character -> the prefixes it begins
        for key in self._by_prefix:
            self._keys.setdefault(key[0], []).append(key)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split special tokens out of `text`: each token in turn, longest first, takes
        every non-overlapping occurrence in the text pieces left by the earlier ones."""
        if not text:
            return []
        # the tokens of a prefix (first one or two characters) the text holds; then, where the text
        # is long and those prefixes rare, the windows after them stand in for it in the searches
        first = self._first & set(text) if len(self._first) > 32 else self._first
        keys = [key for c in first if c in text for key in self._keys[c] if key in text]
        candidates = {tid for key in keys for tid in self._by_prefix[key]}
        if not candidates:
            return [text]
        haystack = text
        longest = max(len(self._tokens[tid]) for tid in candidates)
        if (len(text) > 4096 and sum(text.count(k) for k in keys) * (longest + 1) < len(text) // 2
                and not any("\x00" in self._tokens[tid] for tid in candidates)):  # no token spans two windows
            at = sorted({i for k in keys for i in _find_all(text, k)})
            haystack = "\x00".join(text[i:i + longest] for i in at)
        skip = 0 if parse_special else (CONTROL | UNKNOWN)
        attrs, tokens = self._attrs, self._tokens
        frags: list[str | int] = [text]
        for tid in sorted(candidates, key=self._rank.__getitem__):
            attr = int(attrs[tid])
            if attr & skip:
                continue
            tok = tokens[tid]
            if tok not in haystack:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                start = 0
                while True:
                    at = frag.find(tok, start)
                    if at < 0:
                        break
                    left = frag[start:at]
                    if attr & LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    start = at + len(tok)
                    if attr & RSTRIP:
                        while start < len(frag) and frag[start] in _C_SPACE:
                            start += 1
                if start < len(frag):
                    new.append(frag[start:])
            frags = new
        return frags


def _find_all(text: str, key: str) -> list[int]:
    """Every index where key starts in text (overlapping ones too)."""
    out, at = [], text.find(key)
    while at >= 0:
        out.append(at)
        at = text.find(key, at + 1)
    return out
