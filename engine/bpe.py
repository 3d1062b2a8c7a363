"""Byte-level BPE ('gpt2' GGUF vocab) encoding through HF `tokenizers`, matching llama.cpp.

llama.cpp splits text with a per-`tokenizer.ggml.pre` list of regexes (each one splits
the pieces left by the previous, keeping matches and gaps), maps bytes to GPT-2's
printable characters, and merges by rank. A Sequence of Split(isolated) pre-tokenizers
plus ByteLevel(use_regex=False) and a BPE model reproduce exactly that pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

# llama.cpp's regexes, written as it hands them to its splitter. Where it runs a
# hand-written matcher instead of a regex engine (gpt2, llama3, qwen2 patterns), the
# matcher implements exactly these patterns, so onig in `tokenizers` agrees with it.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# gpt-4o / o200k (gpt-oss, llama4): llama.cpp's form of tokenizer.json's regex, where a "capital"
# letter is any letter but a-z and a "lower-case" one any letter but A-Z
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + r"?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + r"?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's fallback for 'default': its regex engine sees \p{P} as Unicode punctuation
# and [0-9] as ASCII digits only, which is what onig does with the same text.
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


# llama.cpp's character classes come from Unicode 15.1 tables, while the onig engine
# in `tokenizers` knows Unicode 16. Characters new in 16.0 are unassigned to llama.cpp
# (so neither letter, digit nor punctuation); these are the ones onig would put in
# \p{L}, \p{N} or \p{P}, removed from those classes below.
_UNICODE16 = (
    ("L", r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}"
         r"\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}"
         r"\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}"
         r"\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}"),
    ("N", r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}"
         r"\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}"),
    ("P", r"\x{1B4E}-\x{1B4F}\x{1B7F}\x{10D6E}\x{113D4}-\x{113D5}\x{113D7}-\x{113D8}\x{11BE1}"
         r"\x{16D6D}-\x{16D6F}\x{1E5FF}"),
)


def _as_llama_cpp_classes(regex: str) -> str:
    r"""`regex` with \p{L}, \p{N}, \p{P} narrowed to llama.cpp's Unicode version.

    A nested class works both alone and inside [...] (where onig takes the union).
    """
    for cat, extra in _UNICODE16:
        regex = regex.replace(rf"\p{{{cat}}}", rf"[\p{{{cat}}}&&[^{extra}]]")
    return regex


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word already in the vocabulary is kept whole
    clean_spaces: bool = True  # detokenizer removes spaces before punctuation
    add_bos: bool = False  # default when the GGUF has no add_bos_token key


_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,), clean_spaces=False)
PRE_TOKENIZERS: MappingProxyType[str, PreTokenizer] = MappingProxyType({
    "default": PreTokenizer(_DEFAULT),
    "gpt-2": PreTokenizer((_GPT2,)),
    "phi-2": PreTokenizer((_GPT2,)),
    "llama-bpe": _LLAMA3_PRE,
    "llama3": _LLAMA3_PRE,
    "llama-v3": _LLAMA3_PRE,
    "qwen2": _QWEN2_PRE,
    "deepseek-r1-qwen": _QWEN2_PRE,
    "gpt-4o": PreTokenizer((_GPT4O,), clean_spaces=False),
    "llama4": PreTokenizer((_GPT4O,), clean_spaces=False),
})


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


class ByteLevelBPE:
    """BPE over one raw-text fragment (special tokens already split out)."""

    def __init__(self, token_to_id: dict[str, int], merges: list[str], pre: PreTokenizer):
        self.pre = pre
        self._char_to_byte = {c: b for b, c in enumerate(byte_to_unicode())}
        pairs = _usable_merges(token_to_id, merges)
        model = models.BPE(vocab=token_to_id, merges=pairs, ignore_merges=pre.ignore_merges)
        hf = HFTokenizer(model)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_as_llama_cpp_classes(r)), behavior="isolated") for r in pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        self.pipeline = hf  # the tokenizers pipeline that encodes (tokenizer_json.py reuses it)

    def encode(self, fragment: str, after_special: bool = False) -> list[int]:
        if not fragment:
            return []
        return self.pipeline.encode(fragment, add_special_tokens=False).ids

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL vocabulary token: GPT-2 characters mapped back to bytes.

        A character outside the table is rendered as llama.cpp does, as
        '[UNK_BYTE_0x<hex>' + token text + ']', so decoded text stays identical.
        """
        out = bytearray()
        for ch in text:
            b = self._char_to_byte.get(ch)
            if b is not None:
                out.append(b)
            else:
                raw = ch.encode("utf-8")
                out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


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
