"""PLaMo-2 vocabulary ('plamo2' GGUF vocab), reproducing llama.cpp's PLaMo-2 tokenizer.

PLaMo-2 picks the segmentation of each text fragment that maximises the summed token scores
(a Viterbi pass from the end of the text), with every code point that no token covers spelled
as its UTF-8 byte tokens <0xXX>. llama.cpp (llm_tokenizer_plamo2) runs it over a flattened
suffix table with scores rounded to int32 units of 1e-4. The table holds, for every string s
that is a token or a suffix of one, a block of rows: the prefixes of s that are themselves
such strings, longest first, then a sentinel row (one code point as bytes). Walking the text
backwards, the state is the block of the longest such string starting at the current code
point, found by trying c + q for each row q of the previous state's block in turn.

This module keeps the same blocks and walks them the same way, so ties (the longer piece wins),
rounding and the table's quirks give the same ids: a token whose score rounds to exactly -1000
(the converter's [PADn] padding) reads as a sentinel row and ends both scans there (shorter
candidates and the byte fallback are then never tried); scores of -2000 or below, or NaN, make
a token unusable; the first code point of a fragment is dropped when it is a BOM; every
non-byte token, control tokens included, can match raw text. Only the block order (which
fixes llama.cpp's row numbers, never the result) is not reproduced: blocks are built on first
use, so loading a 100k-token vocabulary costs only the set of its suffixes.
"""
from __future__ import annotations

import math

import numpy as np

from infer.engine.special_tokens import BYTE, CONTROL, UNKNOWN
from infer.engine.tokenizer_error import TokenizerError

_INVALID_SCORE = -20_000_000  # a string that is only a suffix of tokens, or an unusable score
_UNKNOWN_SCORE = -10_000_000  # the sentinel row: one code point as byte tokens
_SENTINEL = ("", 1, -1, _UNKNOWN_SCORE)  # (piece, length, token id, score code), as in llama.cpp
_HEX = frozenset(b"0123456789abcdefABCDEF")


def byte_token_value(text: str) -> int | None:
    """The byte a '<0xXX>' text stands for, as llama.cpp's checks accept it (6 UTF-8 bytes,
    two hex digits of either case), else None."""
    raw = text.encode("utf-8")
    if len(raw) == 6 and raw[:3] == b"<0x" and raw[5] == 0x3E and raw[3] in _HEX and raw[4] in _HEX:
        return int(raw[3:5], 16)
    return None


def score_code(score: float) -> int:
    """A score as the table's int32: static_cast<int32_t>(std::round(score * 1e4)) in double,
    round half away from zero; non-finite -> the invalid score, and out-of-range values to
    INT32_MIN as x86's conversion gives (also below the invalid score)."""
    if not math.isfinite(score):
        return _INVALID_SCORE
    x = score * 1e4
    a = abs(x)
    f = math.floor(a)
    r = int(f) + (1 if a - f >= 0.5 else 0)
    r = r if x >= 0 else -r
    return r if -2**31 <= r < 2**31 else -2**31


class Plamo2Vocab:
    """llm_tokenizer_plamo2's Viterbi encode over lazily built blocks of its suffix table."""

    def __init__(self, tokens: list[str], token_to_id: dict[str, int], attrs: np.ndarray, scores: np.ndarray):
        # special ids and flags are the Tokenizer's; the table needs none
        byte_ids = [0] * 256
        score_of: dict[str, float] = {}
        nan = math.nan
        attr_list, score_list = attrs.tolist(), scores.tolist()  # float32 -> the same double
        for tid, text in enumerate(tokens):
            if attr_list[tid] & BYTE:  # byte tokens stay out of the table, well-formed or not
                value = byte_token_value(text)
                if value is not None:
                    byte_ids[value] = tid  # a later '<0x0a>' replaces an earlier '<0x0A>'
                continue
            score_of[text] = score_list[tid]  # a token's own score beats a suffix's NaN
            for k in range(1, len(text)):
                score_of.setdefault(text[k:], nan)
        missing = [b for b in range(256) if byte_ids[b] == 0]  # id 0 counts as unset, as in llama.cpp
        if missing:
            raise TokenizerError(f"PLaMo-2 vocabulary has no byte token <0x{missing[0]:02X}>")
        self._byte_ids = byte_ids
        self._in_table = score_of  # membership: every token and suffix; values read once per row
        self._token_to_id = token_to_id
        # string -> its block; grows on use up to one entry per table string, a pure cache
        # (rebuilding an entry gives the same rows).
        self._blocks: dict[str, list[tuple[str, int, int, int]]] = {"": [_SENTINEL]}

    def _block(self, s: str) -> list[tuple[str, int, int, int]]:
        """The rows of table string s: its prefixes in the table, longest first, then the
        sentinel. A prefix c + q of s can only be in the table if q is a row of s[1:]'s block
        (the table is closed under suffixes), so each block comes from its tail's, built
        from the longest tail already known (iteratively: tokens can be long)."""
        blocks = self._blocks
        block = blocks.get(s)
        if block is not None:
            return block
        pending = []
        while s not in blocks:
            pending.append(s)
            s = s[1:]
        in_table, tok_get = self._in_table, self._token_to_id.get
        for s in reversed(pending):
            head = s[0]
            block = []
            for q, _, _, _ in blocks[s[1:]]:  # the tail's sentinel ("") gives head itself
                p = head + q
                if p in in_table:
                    block.append((p, len(p), tok_get(p, -1), score_code(in_table[p])))
            block.append(_SENTINEL)
            blocks[s] = block
        return block

    def encode(self, fragment: str, after_special: bool) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out); PLaMo-2 adds
        no space prefix, so `after_special` changes nothing."""
        if fragment[:1] == "\ufeff":
            fragment = fragment[1:]
        n = len(fragment)
        if not n:
            return []
        in_table, blocks, block_of = self._in_table, self._blocks, self._block
        unknown, invalid = _UNKNOWN_SCORE, _INVALID_SCORE
        sentinel_only = blocks[""]
        cost = [1 << 60] * n + [0]
        plen = [0] * (n + 1)
        ptok = [0] * (n + 1)
        state = sentinel_only
        for i in range(n - 1, -1, -1):
            c = fragment[i]
            # The longest table string starting at i: c + the longest row of the previous state
            # that extends; a row scored like the sentinel stops the search with nothing.
            new = sentinel_only
            for q, _, _, code in state:
                p = c + q
                if p in in_table:
                    new = blocks.get(p) or block_of(p)
                    break
                if code == unknown:
                    break
            state = new
            best = 1 << 60
            for _, length, tid, code in new:
                if code > invalid:
                    total = cost[i + length] - code
                    if total < best:  # strict: on a tie the longer piece (earlier row) stays
                        best = total
                        plen[i] = length
                        ptok[i] = tid
                if code == unknown:
                    break
            cost[i] = best
        out: list[int] = []
        byte_ids = self._byte_ids
        pos = 0
        while pos < n:
            tid = ptok[pos]
            if tid >= 0:
                out.append(tid)
            else:
                out.extend([byte_ids[b] for b in fragment[pos].encode("utf-8")])
            pos += plen[pos]
        return out

    def normal_piece(self, text: str) -> bytes:
        return text.encode("utf-8")

    def piece(self, token_id: int, text: str, attr: int, special: bool) -> bytes:
        """llama_token_to_piece for PLaMo-2: control and unknown tokens are empty unless
        `special`; a byte token with a well-formed '<0xXX>' text is that byte; every other
        token, whatever its type (unused and undefined included), is its text."""
        del token_id
        if attr & (CONTROL | UNKNOWN) and not special:
            return b""
        if attr & BYTE:
            value = byte_token_value(text)
            if value is not None:
                return bytes([value])
        return text.encode("utf-8")
