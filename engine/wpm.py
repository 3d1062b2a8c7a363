"""BERT WordPiece ('bert' GGUF vocab, llama.cpp's WPM type) encoding, reproducing llama.cpp.

llama.cpp does not run HF's BertNormalizer/BertPreTokenizer: its llm_tokenizer_wpm_session
normalizes each code point on its own and with its own tables, and those differences decide
the ids, so this module follows its rules (src/llama-vocab.cpp, src/unicode.cpp):

* "NFD" (when strip_accents) maps each code point to the *first* code point of its NFD
  form and nothing else: 'é' -> 'e', but also a Hangul syllable -> its leading consonant
  ('한' -> 'ᄒ'), where a real NFD keeps all the jamo.
* Lowercasing is the one-code-point simple mapping of UnicodeData.txt ('İ' -> 'i').
* Whitespace is llama.cpp's fixed set (not Python's isspace); NUL, U+FFFD and every
  \\p{C} code point (not unassigned ones) vanish without splitting the word, as do all
  \\p{M} marks when strip_accents; each \\p{P} character, each ASCII \\p{S} and each
  "Chinese" ideograph (its is_chinese_char ranges, 0x2B920 quirk included) is a word alone.
* Each word, prefixed with '▁', is cut greedily into the longest vocabulary entries; a word
  with any position no entry starts at becomes one [UNK].

Character classes come from Python's unicodedata (14.0 on Python 3.11) plus the code points
Unicode 15.0/15.1 assigned to the classes above, since llama.cpp's tables are Unicode 15.1.
On a Python whose unicodedata is newer than 15.1, characters first assigned after 15.1 are
unassigned to llama.cpp but not here, so text using them may tokenize differently.

Speed: the text goes through a few whole-text passes that run in C (str.translate, regexes),
and the Python-level greedy match runs once per distinct word of a call, not per character.
"""
from __future__ import annotations

import re
import unicodedata
from functools import partial
from itertools import compress, filterfalse
from operator import itemgetter, methodcaller, ne
from typing import Any

import numpy as np

from infer.engine.tokenizer_error import TokenizerError

ESCAPED_SPACE = "\u2581"  # '▁', the prefix that marks a word's first piece
_K = "tokenizer.ggml."
_UNK_DEFAULT = 100  # llama.cpp's default [UNK] id for 'bert' vocabularies

# llama.cpp's unicode_set_whitespace: PropList's White_Space, no 0x1C-0x1F (Python's isspace has them).
_WHITESPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
# llm_tokenizer_wpm_session::is_chinese_char; 0x2B920 (not 0x2B820) copies HF's Rust code.
_CHINESE = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# Code points Unicode 15.0/15.1 assigned as marks (M), punctuation (P) or controls (C), which
# Python 3.11's Unicode 14 calls unassigned; letters, digits and non-ASCII symbols behave as
# unassigned ones do here, so only these three classes need listing.
_UNICODE15 = {
    "M": ((0x0CF3, 0x0CF3), (0x0ECE, 0x0ECE), (0x10EFD, 0x10EFF), (0x11241, 0x11241),
          (0x11F00, 0x11F01), (0x11F03, 0x11F03), (0x11F34, 0x11F3A), (0x11F3E, 0x11F42),
          (0x13440, 0x13440), (0x13447, 0x13455), (0x1E08F, 0x1E08F), (0x1E4EC, 0x1E4EF)),
    "P": ((0x11B00, 0x11B09), (0x11F43, 0x11F4F)),
    "C": ((0x13439, 0x1343F),),
}
_MAX_CODEPOINT = 0x110000
_CASED_LIMIT = 0x30000  # no case mapping or decomposition lies above (Unicode <= 16)
_LONG_RUN = 256  # a run of this many code points stays in a regex class, not the translate table


def _categories() -> np.ndarray:
    """The first letter of every code point's general category as a byte ('n' for unassigned,
    which Unicode files under C), with llama.cpp's Unicode 15.1 classes where Python's are older.
    Planes 4 to 13 have never held an assigned code point, so only the others are looked up."""
    first = np.full(_MAX_CODEPOINT, ord("n"), dtype=np.uint8)
    for lo, hi in ((0, 0x40000), (0xE0000, _MAX_CODEPOINT)):
        names = "".join(map(unicodedata.category, map(chr, range(lo, hi)))).encode("ascii")
        pairs = np.frombuffer(names, dtype=np.uint8).reshape(-1, 2)
        first[lo:hi] = np.where((pairs[:, 0] == ord("C")) & (pairs[:, 1] == ord("n")), ord("n"), pairs[:, 0])
    for letter, ranges in _UNICODE15.items():
        for lo, hi in ranges:
            span = first[lo:hi + 1]
            span[span == ord("n")] = ord(letter)
    return first


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) code point of each run where mask is true."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return [(int(lo), int(hi) - 1) for lo, hi in zip(edges[::2], edges[1::2])]


def _char_class(runs: list[tuple[int, int]]) -> str:
    """The body of a regex character class matching these runs of code points."""
    return "".join(f"\\U{lo:08X}-\\U{hi:08X}" for lo, hi in runs)


def _lower_nfd(lowercase: bool, strip_accents: bool) -> dict[int, str]:
    """Each code point to lower(first code point of its NFD), as enabled, where that differs."""
    chars = list(map(chr, range(_CASED_LIMIT)))
    out = chars
    if strip_accents:
        decomposed = filterfalse(partial(unicodedata.is_normalized, "NFD"), chars)
        first = {c: unicodedata.normalize("NFD", c)[0] for c in decomposed}
        out = list(map(first.get, out, out))
    if lowercase:
        # The simple (one code point) mapping is the full one's first code point:
        # they differ only for U+0130 'İ', whose full form is 'i' + U+0307.
        out = list(map(itemgetter(0), map(str.lower, out)))
    changed = list(map(ne, chars, out))
    return dict(zip(compress(range(_CASED_LIMIT), changed), compress(out, changed)))


def _classes(strip_accents: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks over all code points of llama.cpp's preprocessing classes, in the order it tests
    them: whitespace; dropped (NUL, U+FFFD, controls, and marks when strip_accents); words of
    one character (punctuation, ASCII symbols, is_chinese_char). Anything else joins a word."""
    cats = _categories()
    cpts = np.arange(_MAX_CODEPOINT)
    space = np.zeros(_MAX_CODEPOINT, dtype=bool)
    space[[ord(c) for c in _WHITESPACE]] = True
    drop = (cats == ord("C")) | (cpts == 0) | (cpts == 0xFFFD)
    if strip_accents:
        drop |= cats == ord("M")
    drop &= ~space  # '\t', '\n' and U+0085 are controls too, but whitespace comes first
    single = (cats == ord("P")) | ((cats == ord("S")) & (cpts < 0x7F))
    for lo, hi in _CHINESE:
        single[lo:hi + 1] = True
    return space, drop, single & ~drop & ~space


class WordPiece:
    """llama.cpp's WPM tokenizer over one raw-text fragment (special tokens already split out).

    Normalizer options come from tokenizer.ggml.normalizer.lowercase (default true) and
    .strip_accents (default: whatever lowercase is), as llama_vocab::impl::load reads them.
    Token attributes and scores play no part: WPM matches token texts only.
    """

    def __init__(self, tokens: list[str], token_to_id: dict[str, int], attrs: np.ndarray,
                 scores: np.ndarray, meta: dict[str, Any]):
        self._vocab = token_to_id
        self._max_len = max((len(t) for t in tokens), default=1)  # longest entry, in code points
        self._unk = _unk_id(meta, len(tokens))
        lowercase = bool(meta.get(_K + "normalizer.lowercase", True))
        strip_accents = bool(meta.get(_K + "normalizer.strip_accents", lowercase))
        self.lowercase, self.strip_accents = lowercase, strip_accents
        space, drop, single = _classes(strip_accents)

        # The per-code-point work is one str.translate: NFD and lowercase (lowering keeps a
        # character's class, a letter stays a letter, so the classes are read after it), and
        # deleting dropped characters or setting apart by spaces the one-character words above
        # U+FFFF: re tests the ranges of a class up there one by one (below, it is one bitmap
        # lookup), so short runs there would slow every character. Long runs (private use,
        # surrogates, CJK ideographs) are few ranges but too many table entries: regexes take them.
        drop_runs, single_runs = _runs(drop), _runs(single)
        short_drop = [cpt for lo, hi in drop_runs if hi - lo + 1 < _LONG_RUN for cpt in range(lo, hi + 1)]
        short_single = {cpt for lo, hi in single_runs if lo > 0xFFFF and hi - lo + 1 < _LONG_RUN
                        for cpt in range(lo, hi + 1)}
        lowered = _lower_nfd(lowercase, strip_accents) if lowercase or strip_accents else {}
        table: dict[int, str | None] = {}
        for cpt in {*lowered, *short_drop, *short_single}:
            out = lowered.get(cpt, chr(cpt))
            table[cpt] = None if drop[ord(out)] else f" {out} " if ord(out) in short_single else out
        self._table = table
        self._ascii = {c: table[c] for c in range(0x80) if c in table}  # 1:1 or delete: C's fast path
        self._non_ascii = re.compile("([^\\x00-\\x7f]+)")
        self._drop = re.compile(f"[{_char_class([(lo, hi) for lo, hi in drop_runs if hi - lo + 1 >= _LONG_RUN])}]+")
        singles = _char_class([(lo, hi) for lo, hi in single_runs if lo <= 0xFFFF or hi - lo + 1 >= _LONG_RUN])
        # A word is one member of the one-character class, or a run of anything else but space.
        self._words = re.compile(f"[{singles}]|[^{singles}{_char_class(_runs(space))}]+")

    def words(self, fragment: str) -> list[str]:
        """llm_tokenizer_wpm_session::preprocess: the normalized words of `fragment`.
        ASCII stretches take a small 1:1 table that str.translate runs in C; only the rest
        pays for the full table's per-character lookups."""
        if fragment.isascii():
            return self._words.findall(fragment.translate(self._ascii))
        pieces = self._non_ascii.split(fragment)  # ASCII, other, ASCII, ..., ASCII
        pieces[0::2] = map(methodcaller("translate", self._ascii), pieces[0::2])
        pieces[1::2] = map(partial(self._drop.sub, ""), map(methodcaller("translate", self._table), pieces[1::2]))
        return self._words.findall("".join(pieces))

    def encode(self, fragment: str, after_special: bool = False) -> list[int]:
        """Token ids of one raw-text fragment (`after_special` does not matter to WPM)."""
        memo: dict[str, list[int]] = {}
        out: list[int] = []
        for word in self.words(fragment):
            ids = memo.get(word)
            if ids is None:
                ids = memo[word] = self._word_ids(word)
            out += ids
        return out

    def _word_ids(self, word: str) -> list[int]:
        """Greedy longest match over '▁' + word; one [UNK] if any position has no match."""
        text = ESCAPED_SPACE + word
        n, get, max_len = len(text), self._vocab.get, self._max_len
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + max_len), i, -1):
                tid = get(text[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                if self._unk is None:
                    raise TokenizerError(f"word {word!r} has no pieces and the vocabulary has no [UNK]")
                return [self._unk]
        return ids

    @staticmethod
    def normal_piece(text: str) -> bytes:
        """A NORMAL token's bytes: llama.cpp unescapes every '▁' to a space."""
        return text.replace(ESCAPED_SPACE, " ").encode("utf-8")


def _unk_id(meta: dict[str, Any], n: int) -> int | None:
    """llama.cpp's special_unk_id: the metadata's id when in range, else its default 100."""
    value = meta.get(_K + "unknown_token_id")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= int(value) < n:
        return int(value)
    return _UNK_DEFAULT if _UNK_DEFAULT < n else None
