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
  with any position no entry starts at becomes one [UNK]. (In numba, over the vocabulary as a
  token_table.py hash table.)

Character classes come from Python's unicodedata (14.0 on Python 3.11) plus the code points
Unicode 15.0/15.1 assigned to the classes above, since llama.cpp's tables are Unicode 15.1.
On a Python whose unicodedata is newer than 15.1, characters first assigned after 15.1 are
unassigned to llama.cpp but not here, so text using them may tokenize differently.

Speed: the per-code-point work is table lookups over the text's code points (numpy and numba),
and the greedy match runs once per distinct word of a call (pieces.py).
"""
from __future__ import annotations

import unicodedata
from functools import partial
from itertools import compress, filterfalse
from operator import itemgetter, ne
from typing import Any

import numpy as np
from numba import njit

from infer.engine.pieces import encode_pieces
from infer.engine.spm import ESCAPED_SPACE
from infer.engine.token_table import TokenTable, lookup
from infer.engine.tokenizer_error import TokenizerError

_K = "tokenizer.ggml."

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

    def __init__(self, tokens: list[str], unk_id: int | None, meta: dict[str, Any]):
        self._vocab = TokenTable(tokens)  # a text seen twice has its last id, as token_to_id
        self._max_len = max((len(t) for t in tokens), default=1)  # longest entry, in code points
        self._unk = unk_id  # llama.cpp's special_unk_id (its WPM default: 100)
        lowercase = bool(meta.get(_K + "normalizer.lowercase", True))
        strip_accents = bool(meta.get(_K + "normalizer.strip_accents", lowercase))
        self.lowercase, self.strip_accents = lowercase, strip_accents
        space, drop, single = _classes(strip_accents)
        # Code point -> what llama.cpp's preprocessing makes of it, -1 where it vanishes: NFD's
        # first code point, lowercased (lowering keeps a character's class, a letter stays a
        # letter, so whether it vanishes, or what word it makes, is read after it)
        mapped = np.arange(_MAX_CODEPOINT, dtype=np.int32)
        if lowercase or strip_accents:
            lowered = _lower_nfd(lowercase, strip_accents)
            mapped[np.fromiter(lowered, np.int64, len(lowered))] = [ord(c) for c in lowered.values()]
        self._map = np.where(drop[mapped], -1, mapped).astype(np.int32)
        self._kind = np.where(space, 1, np.where(single, 2, 0)).astype(np.uint8)  # 1 space, 2 a word alone

    def _normalize(self, fragment: str) -> tuple[str, np.ndarray]:
        """The fragment's code points as llama.cpp's preprocessing leaves them, and as text."""
        cps = self._map[np.frombuffer(fragment.encode("utf-32-le", "surrogatepass"), dtype="<u4")]
        cps = cps[cps >= 0].astype(np.uint32)  # no surrogate is left: they are \p{C}
        return cps.astype("<u4").tobytes().decode("utf-32-le"), cps

    def _spans(self, cps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts, ends = np.empty(len(cps), np.int64), np.empty(len(cps), np.int64)
        n = _word_spans(cps, self._kind, starts, ends)
        return starts[:n], ends[:n]

    def words(self, fragment: str) -> list[str]:
        """llm_tokenizer_wpm_session::preprocess: the normalized words of `fragment`."""
        text, cps = self._normalize(fragment)
        return [text[a:b] for a, b in zip(*(x.tolist() for x in self._spans(cps)))]

    def encode(self, fragment: str, after_special: bool = False) -> list[int]:
        """Token ids of one raw-text fragment (`after_special` does not matter to WPM)."""
        text, cps = self._normalize(fragment)
        return encode_pieces(text, cps, *self._spans(cps), self._words_ids)[0].tolist()

    def _words_ids(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each word's ids, one after another, and their counts (_wordpiece)."""
        cps = np.frombuffer("".join(words).encode("utf-32-le"), np.uint32)
        off = np.zeros(len(words) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, words), np.int64, len(words)), out=off[1:])
        ids, counts = np.empty(len(cps) + len(words), np.int32), np.empty(len(words), np.int64)
        v = self._vocab
        k = _wordpiece(cps, off, ord(ESCAPED_SPACE), self._max_len, v.tok_cps, v.tok_off, v.table,
                       -1 if self._unk is None else self._unk, ids, counts)
        if k < 0:
            word = words[-1 - k]
            raise TokenizerError(f"word {word!r} has no pieces and the vocabulary has no [UNK]")
        return ids[:k], counts

    @staticmethod
    def normal_piece(text: str) -> bytes:
        """A NORMAL token's bytes: llama.cpp unescapes every '▁' to a space."""
        return text.replace(ESCAPED_SPACE, " ").encode("utf-8")


@njit(cache=True)
def _word_spans(cps, kind, starts, ends):
    # cps: (N,) uint32 code points; kind: (0x110000,) uint8 (see WordPiece.__init__); starts, ends:
    # (N,) int64 receive the words. A word is one kind-2 character or a run of kind 0; returns the count.
    n = 0
    i = 0
    while i < cps.shape[0]:
        k = kind[cps[i]]
        if k == 1:
            i += 1
            continue
        j = i + 1
        if k == 0:
            while j < cps.shape[0] and kind[cps[j]] == 0:
                j += 1
        starts[n], ends[n] = i, j
        n += 1
        i = j
    return n


@njit(cache=True)
def _wordpiece(cps, off, prefix, max_len, tok_cps, tok_off, table, unk, ids, counts):
    # cps: (N,) uint32 the words' code points, word w at off[w]:off[w + 1] ((W + 1,) int64);
    # ids: (N + W,) int32 and counts: (W,) int64 receive each word's ids. Greedy longest match over
    # prefix ('▁') + word; one [UNK] (unk) where some position starts no token. Returns the number
    # of ids, or -1 - w where word w needs an [UNK] the vocabulary lacks (unk < 0).
    buf = np.empty(max(1, cps.shape[0]) + 1, np.uint32)
    k = 0
    for w in range(off.shape[0] - 1):
        n = off[w + 1] - off[w] + 1
        buf[0] = prefix
        buf[1:n] = cps[off[w]:off[w + 1]]
        start = k
        i = 0
        while i < n:
            j = min(n, i + max_len)
            while j > i:
                t = lookup(buf, i, j - i, tok_cps, tok_off, table)
                if t >= 0:
                    ids[k] = t
                    k += 1
                    break
                j -= 1
            if j == i:
                if unk < 0:
                    return -1 - w
                k = start
                ids[k] = unk
                k += 1
                break
            i = j
        counts[w] = k - start
    return k
