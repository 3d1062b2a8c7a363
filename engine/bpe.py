"""BPE vocabularies (tokenizer.ggml.model 'gpt2', 'gemma4', 'whitespace', 'hybriddna') encoded
through Hugging Face `tokenizers`, matching llama.cpp's llm_tokenizer_bpe.

llama.cpp splits text with its pre-tokenizer's regexes (each splits the pieces the previous left,
keeping matches and gaps; engine/pretokenizers.py has them all), maps bytes to GPT-2's printable
characters (not for Gemma 4's SentencePiece-style BPE, whose spaces are written as U+2581 and
whose unknown bytes are <0xXX> tokens), and merges by rank; with ignore_merges a word already in the
vocabulary stays whole. A Sequence of Split(isolated) pre-tokenizers, ByteLevel(use_regex=False)
where bytes are mapped, and a BPE model reproduce that pipeline, in Rust.

Oniguruma's matching is most of that pipeline's time, though (about 0.4 s per MB for Llama 3's
regex, twice llama.cpp's whole encode), so where it can the regexes run as a compiled program in
numba (regex_split.py) and the BPE model sees each distinct piece once (pieces.py).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
from tokenizers import PreTokenizedString, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from infer.engine.pieces import encode_pieces
from infer.engine.pretokenizers import DIGIT_GROUPS, PRE_TOKENIZERS, PreTokenizer, onig_regex, split_digit_groups
from infer.engine.regex_split import SplitChain, Unsupported
from infer.engine.spm import ESCAPED_SPACE
from infer.engine.tokenizer_error import TokenizerError

_K = "tokenizer.ggml."
# llama.cpp's whitespace (unicode_set_whitespace: Unicode's White_Space), dropped by the 'whitespace' model
_WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                        "\u200a\u2028\u2029\u202f\u205f\u3000")
_DNA_MARKER = "\ue000"
_PART = 16384  # characters of a long text's parts, encoded side by side
_CUT = re.compile(r"(?<=[^\s])\n(?=[A-Za-z])")
_LINES = "[^\\n]+|[\\n]+"  # Gemma 4's one split: whole lines, too seldom repeated to be worth finding


def byte_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in printable:
        table[b] = chr(b)
    extra = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class _DigitGroups:
    """A custom `tokenizers` pre-tokenizer step: llama.cpp's digit-grouping matcher (pretokenizers.py)."""

    def pre_tokenize(self, pretok: PreTokenizedString) -> None:
        pretok.split(lambda _, piece: [piece[a:b] for a, b in split_digit_groups(str(piece))])


def _split(regex: str) -> Any:
    if regex == DIGIT_GROUPS:
        return pre_tokenizers.PreTokenizer.custom(_DigitGroups())
    return pre_tokenizers.Split(Regex(regex), behavior="isolated")


class ByteLevelBPE:
    """BPE over one raw-text fragment (special tokens already split out), for one pre-tokenizer."""

    # Texts of fewer characters stay with Oniguruma: a few milliseconds there cost less than a
    # process's first call of the numba kernels (about 0.3 s to load them from numba's cache)
    numba_from = 16384

    def __init__(self, token_to_id: dict[str, int], merges: list[str], pre: PreTokenizer, pre_name: str = "",
                 model: str = "gpt2", lowercase: bool | None = None):
        self.pre = pre
        self.pre_name = pre_name
        self.model = model
        self.add_bos, self.clean_spaces, self.add_sep = pre.add_bos, pre.clean_spaces, pre.add_sep
        self.no_default_ids = ("bos",) if pre.no_bos else ()
        self.lowercase = pre.lowercase if lowercase is None else lowercase
        self._vocab = token_to_id
        self._char_to_byte = {c: b for b, c in enumerate(byte_to_unicode())}
        pairs = _usable_merges(token_to_id, merges)
        steps_regexes = [onig_regex(r) for r in pre.regexes]
        steps = [_split(r) for r in steps_regexes]
        if pre.byte_encode:
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf = HFTokenizer(models.BPE(vocab=token_to_id, merges=pairs, ignore_merges=pre.ignore_merges,
                                    byte_fallback=not pre.byte_encode))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        self.pipeline = hf  # the vocabulary's tokenizers pipeline (tokenizer_json.py writes it out)
        # A byte whose character the vocabulary lacks (Falcon's control bytes): llama.cpp keeps it
        # in the word, where no merge crosses it, and then emits nothing for it; `tokenizers`
        # would drop it first and merge its neighbours. An unknown-token stand-in keeps it in place
        # and its id (one past the vocabulary) is taken out of the results.
        self._drop = None
        encoder = hf
        if pre.byte_encode and any(c not in token_to_id for c in byte_to_unicode()):
            unknown = "<|unknown byte|>"
            while unknown in token_to_id:
                unknown += "_"
            self._drop = max(token_to_id.values(), default=-1) + 1
            encoder = HFTokenizer(models.BPE(vocab={**token_to_id, unknown: self._drop}, merges=pairs,
                                             ignore_merges=pre.ignore_merges, unk_token=unknown))
            encoder.pre_tokenizer = pre_tokenizers.Sequence(steps)
        self._encoder = encoder
        # The regexes run here in numba where they can (regex_split.py), and `tokenizers` encodes
        # each distinct piece they leave (pieces.py), sharing the encoder's BPE model
        self._chain = None
        if DIGIT_GROUPS not in steps_regexes and steps_regexes != [_LINES]:
            try:
                self._chain = SplitChain(steps_regexes)
            except Unsupported:
                pass
        self._words = HFTokenizer(encoder.model)
        if pre.byte_encode:
            self._words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self._newline_runs = pre.type == "GEMMA4"
        self._cuttable = DIGIT_GROUPS not in steps_regexes

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], token_to_id: dict[str, int]) -> "ByteLevelBPE":
        model = meta.get(_K + "model")
        pre = "gemma4" if model == "gemma4" else (meta.get(_K + "pre") or "default")  # as llama.cpp's loader
        spec = PRE_TOKENIZERS.get(pre) if isinstance(pre, str) else None
        if spec is None:  # llama.cpp refuses these too ("unknown pre-tokenizer type")
            raise TokenizerError(f"unsupported tokenizer.ggml.pre {pre!r} (llama.cpp knows: {', '.join(PRE_TOKENIZERS)})")
        merges = meta.get(_K + "merges")
        if not isinstance(merges, list):
            if pre != "kimi-k2":
                raise TokenizerError(f"{model} vocabulary has no tokenizer.ggml.merges list")
            merges = []  # Kimi-K2's vocabulary has none (its ids come from whole-word lookups)
        lowercase = meta.get(_K + "normalizer.lowercase")
        return cls(token_to_id, merges, spec, pre, model, None if lowercase is None else bool(lowercase))

    def encode(self, fragment: str, after_special: bool = False) -> list[int]:
        if not fragment:
            return []
        if self.model == "whitespace":  # llama.cpp's whitespace session: runs of the rest, lowercased
            words = "".join(" " if c in _WHITESPACE else c for c in fragment).split(" ")
            return [i for w in words if w for i in self._bpe(_lower(w) if self.lowercase else w)]
        if self.model == "hybriddna" and "<dna>" in fragment:
            return self._dna(fragment)
        return self._bpe(fragment)

    def _bpe(self, text: str) -> list[int]:
        if self.pre.escape_whitespaces:
            text = text.replace(" ", ESCAPED_SPACE)
        if not self._newline_runs or "\n" not in text:
            return self._encode(text)
        # Gemma 4: a run of newlines that is a token stays one (llama.cpp's fix for it, PR 21343)
        out: list[int] = []
        start = 0
        for i in range(1, len(text) + 1):
            if i == len(text) or (text[i] == "\n") != (text[start] == "\n"):
                run = text[start:i]
                tid = self._vocab.get(run) if run[0] == "\n" else None
                out.extend([tid] if tid is not None else self._encode(run))
                start = i
        return out

    def _encode(self, text: str) -> list[int]:
        if self._chain is not None and len(text) >= self.numba_from:
            done = self._encode_fast([text])
            if done is not None:
                return done[0]
        # encode_batch_fast: the same ids without the offsets encode() tracks (half its time), and
        # a long text in parts encoded side by side, cut where every pre-tokenizer's words part
        # anyway: after a newline between a non-space and an ASCII letter (the newline stays with
        # what precedes it, as punctuation's [\r\n]* takes it; not for digit grouping, whose first
        # group takes the text before it)
        parts = [text]
        if len(text) > 2 * _PART and self._cuttable:
            parts, last = [], 0
            for m in _CUT.finditer(text, _PART):
                if m.end() - last >= _PART:
                    parts.append(text[last:m.end()])
                    last = m.end()
            parts.append(text[last:])
        done = self._encoder.encode_batch_fast(parts, add_special_tokens=False)
        ids = done[0].ids if len(done) == 1 else [i for e in done for i in e.ids]
        return ids if self._drop is None else [i for i in ids if i != self._drop]

    def encode_fragments(self, fragments: list[str]) -> list[list[int]]:
        """encode() of each fragment (the raw text between special tokens); for plain byte-level
        BPE in one pass over them all, so that the pieces they share are encoded once."""
        if self._chain is not None and self.model == "gpt2" and sum(map(len, fragments)) >= self.numba_from:
            done = self._encode_fast(fragments)
            if done is not None:
                return done
        return [self.encode(f) for f in fragments]

    def _encode_fast(self, texts: list[str]) -> list[list[int]] | None:
        """Each text's ids: the chain of regexes in numba, each distinct piece encoded once (None
        where a text holds a lone surrogate: tokenizers then says what is wrong with it)."""
        text = "".join(texts)
        bounds = np.zeros(len(texts) + 1, np.int64)
        np.cumsum([len(t) for t in texts], out=bounds[1:])
        try:
            cps, starts, ends = self._chain.pieces(text, bounds[:-1], bounds[1:])
        except UnicodeEncodeError:
            return None
        ids, where = encode_pieces(text, cps, starts, ends, self._encode_words)
        cut = where[np.searchsorted(starts, bounds)].tolist()  # each text's first piece's first id
        ids = ids.tolist()
        return [ids[a:b] for a, b in zip(cut, cut[1:])]

    def _encode_words(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        done = self._words.encode(words, is_pretokenized=True, add_special_tokens=False)
        ids, word = np.array(done.ids, np.int32), np.array(done.word_ids, np.int64)
        if self._drop is not None:
            keep = ids != self._drop
            ids, word = ids[keep], word[keep]
        return ids, np.bincount(word, minlength=len(words))

    def _dna(self, text: str) -> list[int]:
        """llama.cpp's hybriddna session: <dna>...</dna> spans as 6-mers (padded with A), the rest BPE."""
        begin, end, oov = (self._vocab.get(t) for t in ("<dna>", "</dna>", "<oov>"))
        if begin is None or end is None or oov is None:
            return self._bpe(text)
        out: list[int] = []
        pos = 0
        while pos < len(text):
            start = text.find("<dna>", pos)
            if start < 0:
                out.extend(self._bpe(text[pos:]))
                break
            out.extend(self._bpe(text[pos:start]))
            out.append(begin)
            stop = text.find("</dna>", start + 5)
            seq = text[start + 5:len(text) if stop < 0 else stop]
            seq = "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in seq)
            for i in range(0, len(seq), 6):
                kmer = seq[i:i + 6].ljust(6, "A")
                out.append(self._vocab.get(kmer + _DNA_MARKER, oov))
            if stop < 0:
                break
            out.append(end)
            pos = stop + 6
        return out

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL vocabulary token: GPT-2 characters mapped back to bytes (or, for the
        SentencePiece-style BPE, U+2581 as a space).

        A character outside the table is rendered as llama.cpp does, as
        '[UNK_BYTE_0x<hex>' + token text + ']', so decoded text stays identical.
        """
        if self.model == "hybriddna" and text.endswith(_DNA_MARKER) and len(text) > 1:
            text = text[:-1]  # llama.cpp drops the k-mers' marker from their text
        if self.pre.escape_whitespaces:
            return text.replace(ESCAPED_SPACE, " ").encode("utf-8")
        if not self.pre.byte_encode:
            return text.encode("utf-8")
        out = bytearray()
        for ch in text:
            b = self._char_to_byte.get(ch)
            if b is not None:
                out.append(b)
            else:
                raw = ch.encode("utf-8")
                out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


def _lower(word: str) -> str:
    # llama.cpp's unicode_tolower maps one code point to one (simple case mapping); Python's lower()
    # gives two for U+0130 alone, whose simple lowercase is 'i'
    return "".join(low if len(low := c.lower()) == 1 else "i" if c == "\u0130" else c for c in word)


def _usable_merges(token_to_id: dict[str, int], merges: list[str]) -> list[tuple[str, str]]:
    """Merge pairs as llama.cpp ranks them, restricted to what `tokenizers` accepts.

    llama.cpp splits each entry at the first space after position 0 and keeps the first
    rank of a repeated pair. `tokenizers` refuses pairs whose parts or result are not in
    the vocabulary; llama.cpp would apply such a merge and then fall back to per-byte
    tokens. Converted vocabularies never contain such pairs, so they are dropped.
    """
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str]] = []
    for entry in merges:
        if not isinstance(entry, str):
            continue
        cut = entry.find(" ", 1)
        if cut < 0:
            continue
        pair = (entry[:cut], entry[cut + 1:])
        if pair in seen:
            continue
        seen.add(pair)
        if pair[0] in token_to_id and pair[1] in token_to_id and pair[0] + pair[1] in token_to_id:
            pairs.append(pair)
    return pairs
