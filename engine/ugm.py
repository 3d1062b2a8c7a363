"""Unigram ('t5' GGUF vocab, llama.cpp's UGM type: T5, XLM-RoBERTa) encoding, as llama.cpp does it.

llama.cpp does not run SentencePiece: it has its own port (llm_tokenizer_ugm in llama-vocab.cpp),
and ids only match if its quirks are kept, so this follows that code byte for byte:

* normalization walks the input's UTF-8 bytes: a prefix on the path of the user-defined tokens'
  trie is copied as is (even when it is only part of a token, or of a character: the rest of that
  character then becomes U+FFFD); otherwise the longest match in the precompiled charsmap (an
  XOR-compressed double-array trie) is replaced; otherwise one valid UTF-8 character is copied,
  or one invalid byte becomes U+FFFD. Spaces (0x20) of the result become '▁', with a '▁' before
  the first non-space (add_space_prefix) or, with remove_extra_whitespaces, before every run of
  non-spaces and none for the spaces themselves;
* Viterbi over a byte trie of the normal, user-defined and unused tokens, with float32 scores
  summed as doubles, user-defined tokens scoring 0, and a code point no single token covers
  taking the unknown token at (lowest normal score - 10); ties keep the first path found, and
  runs of unknown tokens collapse into one.

Both loops run under numba: a Python loop over a 250k-token vocabulary is far slower than llama.cpp.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from infer.engine.special_tokens import NORMAL, UNUSED, USER_DEFINED
from infer.engine.spm import ESCAPED_SPACE
from infer.engine.tokenizer_error import TokenizerError

_K = "tokenizer.ggml."
_SPACE = np.frombuffer(ESCAPED_SPACE.encode(), dtype=np.uint8)  # the escaped space, E2 96 81
_NEG_DBL_MAX = -float(np.finfo(np.float64).max)
# _normalize's error codes (1, 2, 3), where llama.cpp throws on a malformed charsmap
_ERRORS = ("", "index out of bounds in the charsmap's XCDA array",
           "index out of bounds in the charsmap's replacement strings",
           "unterminated string in the charsmap's replacement strings")


# ---------------------------------------------------------------- byte tries


@njit(cache=True)
def _build_trie(data, offsets, values):
    """A byte trie of the sorted keys data[offsets[k]:offsets[k+1]] (values[k] at each key's end),
    as CSR arrays: node p's children are labels/children[first[p]:first[p+1]], sorted by label."""
    n_keys = len(offsets) - 1
    cap = len(data) + 1
    parent = np.empty(cap, np.int32)
    label = np.empty(cap, np.uint8)
    value = np.full(cap, -1, np.int32)
    max_len = 0
    for k in range(n_keys):
        max_len = max(max_len, offsets[k + 1] - offsets[k])
    path = np.zeros(max_len + 1, np.int32)  # path[d]: the node at depth d of the previous key
    n_nodes = 1
    prev, prev_len = 0, 0
    for k in range(n_keys):
        start, length = offsets[k], offsets[k + 1] - offsets[k]
        lcp = 0  # sorted keys share their first lcp nodes with the previous key
        while lcp < min(length, prev_len) and data[start + lcp] == data[prev + lcp]:
            lcp += 1
        for d in range(lcp, length):  # nodes of one parent appear in label order
            parent[n_nodes] = path[d]
            label[n_nodes] = data[start + d]
            path[d + 1] = n_nodes
            n_nodes += 1
        value[path[length]] = values[k]
        prev, prev_len = start, length
    first = np.zeros(n_nodes + 1, np.int64)
    for node in range(1, n_nodes):
        first[parent[node] + 1] += 1
    for p in range(n_nodes):
        first[p + 1] += first[p]
    fill = first[:-1].copy()
    children = np.empty(max(n_nodes - 1, 1), np.int32)
    labels = np.empty(max(n_nodes - 1, 1), np.uint8)
    for node in range(1, n_nodes):
        e = fill[parent[node]]
        children[e] = node
        labels[e] = label[node]
        fill[parent[node]] += 1
    return first, labels, children, value[:n_nodes].copy()


def _trie(keys: list[bytes], values: list[int]) -> tuple[np.ndarray, ...]:
    if not keys:  # a root without children
        return np.zeros(2, np.int64), np.zeros(1, np.uint8), np.zeros(1, np.int32), np.full(1, -1, np.int32)
    order = sorted(range(len(keys)), key=keys.__getitem__)  # sorted, keys share their prefixes' nodes
    lengths = np.array([len(keys[i]) for i in order], dtype=np.int64)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(keys[i] for i in order), dtype=np.uint8)
    vals = np.array([values[i] for i in order], dtype=np.int32)
    return _build_trie(data, offsets, vals)


@njit(cache=True, inline="always")
def _child(first, labels, children, node, c):
    lo, hi = first[node], first[node + 1]
    while lo < hi:
        mid = (lo + hi) >> 1
        x = labels[mid]
        if x < c:
            lo = mid + 1
        elif x > c:
            hi = mid
        else:
            return children[mid]
    return -1


# ---------------------------------------------------------------- normalization


@njit(cache=True, inline="always")
def _utf8_len(src, i):
    """Length of the valid UTF-8 character at src[i], 0 if invalid (unicode_cpt_from_utf8, which
    checks only the lead and continuation bits: no overlong or surrogate checks)."""
    n = len(src)
    b = src[i]
    if b & 0x80 == 0:
        return 1
    if b & 0x40 == 0:
        return 0
    k = 2 if b & 0x20 == 0 else 3 if b & 0x10 == 0 else 4 if b & 0x08 == 0 else 0
    if k == 0 or i + k - 1 >= n:
        return 0
    for j in range(i + 1, i + k):
        if src[j] & 0xC0 != 0x80:
            return 0
    return k


@njit(cache=True)
def _normalize(src, ud_first, ud_labels, ud_children, xcda, repl, space, prepend, merge):
    """llm_tokenizer_ugm_session::normalize over UTF-8 bytes -> (normalized bytes, error code)."""
    out = np.empty(len(src) * 3 + 16, np.uint8)
    n_out = 0
    n = len(src)
    processing_non_ws = False
    space_prepended = False
    i = 0
    while i < n:
        # normalize_prefix: the piece of output for src[i:i + consumed]
        piece, p_start, p_len, consumed = src, i, 0, 0
        node = 0  # user-defined tokens: the trie path walked, complete token or not
        while i + p_len < n:
            node = _child(ud_first, ud_labels, ud_children, node, src[i + p_len])
            if node < 0:
                break
            p_len += 1
        consumed = p_len
        if consumed == 0:
            match_len, match_at = 0, 0
            if len(xcda) > 0:
                idx = np.int64((xcda[0] >> 10) << ((xcda[0] & 0x200) >> 6))
                for j in range(i, n):
                    c = np.int64(src[j])
                    if c == 0:
                        break
                    idx ^= c
                    if idx >= len(xcda):
                        return out[:0], 1
                    unit = xcda[idx]
                    if np.int64(unit & 0x800000FF) != c:  # LCHECK (bit 31 set: a value node)
                        break
                    leaf = (unit >> 8) & 1
                    idx ^= np.int64((unit >> 10) << ((unit & 0x200) >> 6))  # BASE
                    if leaf:
                        if idx >= len(xcda):
                            return out[:0], 1
                        match_len = j - i + 1
                        match_at = np.int64(xcda[idx] & 0x7FFFFFFF)
            if match_len > 0:
                if match_at >= len(repl):
                    return out[:0], 2
                end = match_at
                while end < len(repl) and repl[end] != 0:
                    end += 1
                if end == len(repl):
                    return out[:0], 3
                piece, p_start, p_len, consumed = repl, match_at, end - match_at, match_len
            else:
                k = _utf8_len(src, i)
                if k > 0:
                    p_len, consumed = k, k
                else:  # one invalid byte -> U+FFFD
                    piece, p_start, p_len, consumed = np.array([0xEF, 0xBF, 0xBD], np.uint8), 0, 3, 1
        if n_out + 3 * p_len + 3 > len(out):
            grown = np.empty(2 * len(out) + 3 * p_len + 3, np.uint8)
            grown[:n_out] = out[:n_out]
            out = grown
        for j in range(p_start, p_start + p_len):
            c = piece[j]
            if c != 0x20:
                if not processing_non_ws:
                    processing_non_ws = True
                    if (prepend and not space_prepended) or merge:
                        out[n_out:n_out + 3] = space
                        n_out += 3
                        space_prepended = True
                out[n_out] = c
                n_out += 1
            else:
                processing_non_ws = False
                if not merge:
                    out[n_out:n_out + 3] = space
                    n_out += 3
        i += consumed
    return out[:n_out], 0


# ---------------------------------------------------------------- Viterbi


@njit(cache=True)
def _viterbi(text, first, labels, children, values, token_score, unk_id, unk_score):
    """llm_tokenizer_ugm_session::tokenize's best path over normalized bytes, as token ids."""
    n = len(text)
    best_score = np.full(n + 1, _NEG_DBL_MAX)  # -DBL_MAX: below every sum
    best_id = np.full(n + 1, unk_id, np.int32)
    best_from = np.zeros(n + 1, np.int64)
    best_score[0] = 0.0
    lead_len = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4], np.int64)  # unicode_len_utf8
    at = 0
    while at < n:
        n_units = min(lead_len[text[at] >> 4], n - at)
        single_found = False
        current = best_score[at]
        node = _child(first, labels, children, 0, text[at])
        p = at + 1
        while node >= 0:
            tid = values[node]
            if tid >= 0:
                if p - at == n_units:
                    single_found = True
                score = current + token_score[tid]
                if score > best_score[p]:
                    best_score[p] = score
                    best_id[p] = tid
                    best_from[p] = at
            if p >= n:
                break
            node = _child(first, labels, children, node, text[p])
            p += 1
        if not single_found:
            score = current + unk_score
            p = at + n_units
            if score > best_score[p]:
                best_score[p] = score
                best_id[p] = unk_id
                best_from[p] = at
        at += n_units
    ids = np.empty(n, np.int32)
    n_ids = 0
    prev_unknown = False
    pos = n
    while True:  # backtrack; consecutive unknown tokens merge into one
        tid = best_id[pos]
        unknown = tid == unk_id
        if not (prev_unknown and unknown):
            ids[n_ids] = tid
            n_ids += 1
        if best_from[pos] == 0:
            break
        prev_unknown = unknown
        pos = best_from[pos]
    return ids[:n_ids][::-1].copy()


# ---------------------------------------------------------------- the model


class Unigram:
    """llama.cpp's UGM tokenizer for one vocabulary: `encode` one raw-text fragment (special tokens
    already split out), `normal_piece` the text of a NORMAL token."""

    def __init__(self, tokens: list[str], attrs: np.ndarray, scores: np.ndarray, unk_id: int | None,
                 meta: dict[str, Any]):
        n = len(tokens)
        # llama.cpp builds its tokenizer before it marks special tokens by text, so the
        # attributes as they are now (not after the Tokenizer's later edits) pick the trie's tokens
        attrs = np.asarray(attrs)[:n]
        self._live_attrs = attrs  # user-defined scores are read per call in llama.cpp: see _scores
        scores = np.asarray(scores, dtype=np.float32)[:n]
        normal = scores[(attrs & NORMAL) != 0]
        normal = normal[~np.isnan(normal)]  # std::min skips NaN; with no normal token, FLT_MAX
        min_score = normal.min() if normal.size else np.float32(np.finfo(np.float32).max)
        self._unk_score = float(np.float32(min_score - np.float32(10.0)))  # float arithmetic, as llama.cpp
        self._scores32 = scores
        self._token_score: np.ndarray | None = None

        in_trie = np.nonzero(attrs & (NORMAL | USER_DEFINED | UNUSED))[0]
        user = np.nonzero(attrs & USER_DEFINED)[0]
        self._tokens = _trie([tokens[i].encode() for i in in_trie], in_trie.tolist())
        self._user = _trie([tokens[i].encode() for i in user], [0] * len(user))[:3]
        self._xcda, self._repl = self._charsmap(meta.get(_K + "precompiled_charsmap"))

        # flags as llama_vocab::impl::load sets them for UGM (escape_whitespaces stays true and
        # treat_whitespace_as_suffix false: no GGUF key changes them)
        self._prepend = bool(meta.get(_K + "add_space_prefix", False))
        self._merge = bool(meta.get(_K + "remove_extra_whitespaces", False))
        self._unk_id = -1 if unk_id is None else unk_id  # llama.cpp's special_unk_id (UGM's default: 2)

    @staticmethod
    def _charsmap(blob: Any) -> tuple[np.ndarray, np.ndarray]:
        """(XCDA units, replacement strings) of a precompiled charsmap: a little-endian uint32
        size of the XCDA, the XCDA, then NUL-terminated replacements (llm_tokenizer_ugm)."""
        if blob is None:
            return np.zeros(0, np.uint32), np.zeros(0, np.uint8)
        raw = np.asarray(blob)
        if raw.dtype not in (np.uint8, np.int8):
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap is not an int8/uint8 array")
        raw = raw.view(np.uint8)
        if raw.size < 4:
            raise TokenizerError("precompiled_charsmap too small for its XCDA size header")
        size = int(raw[:4].view("<u4")[0])
        if size + 4 >= raw.size:
            raise TokenizerError("index out of bounds in precompiled_charsmap")
        xcda = raw[4:4 + size // 4 * 4].view("<u4").astype(np.uint32)
        return xcda, raw[4 + size:].copy()

    def _scores(self) -> np.ndarray:
        """Token scores as Viterbi adds them: doubles, 0 for user-defined tokens. llama.cpp checks
        is_user_defined when it tokenizes, after the vocabulary's attributes were final, so this
        is built on first use from the Tokenizer's (since edited) attribute array."""
        if self._token_score is None:
            score = self._scores32.astype(np.float64)
            score[(self._live_attrs & USER_DEFINED) != 0] = 0.0
            self._token_score = score
        return self._token_score

    def encode(self, fragment: str, after_special: bool = True) -> list[int]:
        """Token ids of one raw-text fragment. UGM normalizes every fragment on its own, the space
        prefix included, so `after_special` (used by SPM) plays no part."""
        src = np.frombuffer(fragment.encode("utf-8"), dtype=np.uint8).copy()  # writable: one numba type
        if src.size == 0:
            return []
        text, err = _normalize(src, *self._user, self._xcda, self._repl, _SPACE, self._prepend, self._merge)
        if err:
            raise TokenizerError(_ERRORS[err])
        if text.size == 0:
            return []
        ids = _viterbi(text, *self._tokens, self._scores(), self._unk_id, self._unk_score)
        if self._unk_id < 0 and (ids < 0).any():
            raise TokenizerError("text needs the unknown token, but the vocabulary has none")
        return ids.tolist()

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL token: '▁' back to a space (llama_unescape_whitespace)."""
        return text.replace(ESCAPED_SPACE, " ").encode("utf-8")
