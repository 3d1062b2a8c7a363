"""Turning token ids back into text, whole or one token at a time, as llama.cpp does."""
from __future__ import annotations

import codecs
from typing import Protocol


class Pieces(Protocol):
    """What the detokenizer needs of a tokenizer (Tokenizer and HFTokenizer have it)."""

    add_space_prefix: bool
    clean_spaces: bool

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes: ...

_SPACE, _APOS = 0x20, 0x27
_PUNCT = frozenset(b"?!.,")


def clean_up_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: three in-place passes over the bytes.

    1. drop a space before ? ! . ,
    2. " ' " becomes "'"
    3. drop the space in " 's", " 'm", " 're", " 've" (not " 't", " 'd", " 'll")
    Each pass reads the buffer it is rewriting, including pass 2's NUL marker, so
    the quirks of the original carry over (e.g. "a ' ' b").
    """
    text = bytearray(data)
    n = _pass_punct(text, len(text))
    n = _pass_lone_apostrophe(text, n)
    n = _pass_contractions(text, n)
    return bytes(text[:n])


def _pass_punct(t: bytearray, n: int) -> int:
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == _SPACE and x in _PUNCT:
            total -= 1
        t[total] = x
        total += 1
    return total


def _pass_lone_apostrophe(t: bytearray, n: int) -> int:
    total = 1 if n else 0
    i = 1
    while i < n:
        x = t[i]
        if x == _APOS and i + 1 < n and t[i - 1] == _SPACE and t[i + 1] == _SPACE:
            total -= 1
            i += 1
            t[i] = 0  # the following space is skipped, and later reads see NUL
        t[total] = x
        total += 1
        i += 1
    return total


def _pass_contractions(t: bytearray, n: int) -> int:
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == _SPACE and x == _APOS and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, t[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):  # 're 've
                total -= 1
        t[total] = x
        total += 1
    return total


def _safe_cut(data: bytearray) -> int:
    """Largest prefix length whose cleaned form no later byte can change.

    The passes look back one byte and ahead two, and only ever at spaces and
    apostrophes, so a prefix ending in two other bytes cleans the same on its own.
    """
    for c in range(len(data), 1, -1):
        if data[c - 1] not in (_SPACE, _APOS) and data[c - 2] not in (_SPACE, _APOS):
            return c
    return 0


class IncrementalDetokenizer:
    """Streams text for generated ids: `add` returns only complete UTF-8 characters,
    holding back the bytes of a character split over several tokens (byte fallback),
    and what it returns over a whole stream concatenates to `Tokenizer.decode`."""

    def __init__(self, tokenizer: Pieces, special: bool = False):
        self._tok = tokenizer
        self._special = special
        self._first = True
        self._pending = bytearray()  # raw bytes not yet cleaned (clean_spaces only)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        piece = self._tok.token_to_piece(token_id, self._special)
        if self._first:
            # llama.cpp strips one leading space from the first token's piece.
            if self._tok.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            self._first = False
        if not self._tok.clean_spaces:
            return self._utf8.decode(piece)
        self._pending += piece
        cut = _safe_cut(self._pending)
        if cut == 0:
            return ""
        ready = clean_up_spaces(bytes(self._pending[:cut]))
        del self._pending[:cut]
        return self._utf8.decode(ready)

    def flush(self) -> str:
        """Everything still held back; incomplete UTF-8 at the end becomes U+FFFD."""
        ready = clean_up_spaces(bytes(self._pending)) if self._pending else b""
        self._pending.clear()
        text = self._utf8.decode(ready, final=True)
        self._utf8.reset()
        return text
