"""The tokenizer of a GGUF model, giving the same ids and text as llama.cpp.

Vocabulary loading mirrors llama.cpp's llama_vocab: token attributes from
token_type, default and metadata special ids, the end-of-generation set found by
token text, and special tokens split out of the text before the model runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable

import numpy as np

from infer.engine.bpe import ByteLevelBPE
from infer.engine.detokenizer import IncrementalDetokenizer, clean_up_spaces
from infer.engine.special_tokens import (
    BYTE,
    CONTROL,
    LSTRIP,
    NORMAL,
    RSTRIP,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    SpecialTokens,
)
from infer.engine.spm import SentencePieceModel
from infer.engine.tokenizer_error import TokenizerError


def _is_int(value: Any) -> bool:
    """An integer metadata value (a hostile file may store a string or an array where an id belongs)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_token_id(token_id: Any, vocab_size: int) -> int:
    """token_id as an int, or a TokenizerError for a non-integer or out-of-range id."""
    try:
        tid = int(token_id)
    except (TypeError, ValueError):
        raise TokenizerError(f"token id must be an integer, got {token_id!r}") from None
    if not 0 <= tid < vocab_size:
        raise TokenizerError(f"token id {tid} out of range for a vocabulary of {vocab_size}")
    return tid


def decode_pieces(tok, ids: Iterable[int], special: bool) -> str:
    """The text of ids for any tokenizer with token_to_piece, add_space_prefix and clean_spaces:
    the first piece loses the space a SentencePiece prefix added; invalid UTF-8 becomes U+FFFD."""
    parts = []
    for i, tid in enumerate(ids):
        piece = tok.token_to_piece(tid, special)
        if i == 0 and tok.add_space_prefix and piece.startswith(b" "):
            piece = piece[1:]
        parts.append(piece)
    data = b"".join(parts)
    if tok.clean_spaces:
        data = clean_up_spaces(data)
    return data.decode("utf-8", errors="replace")


def check_text(text: Any) -> None:
    """A TokenizerError unless text is a str that UTF-8 can encode (no lone surrogates)."""
    if not isinstance(text, str):
        raise TokenizerError(f"encode() takes str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"text is not valid Unicode: {e.reason} at index {e.start}") from None


# GGUF token_type (0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
_TYPE_TO_ATTR = np.array([0, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE], dtype=np.uint16)
_TYPE_TO_ATTR.flags.writeable = False


@dataclass(frozen=True)
class VocabType:
    """One of llama.cpp's vocabulary types (llama_vocab_type), as its loader sets it up: the model
    over raw text (load(meta, vocab) -> an object with encode(fragment, after_special) and
    normal_piece(text), and optionally encode_fragments(fragments) where after_special plays no
    part and encoding the fragments between special tokens together is faster), the default
    special ids and flags the GGUF's own keys may override, and which special tokens
    encode(add_special=True) adds around the text."""

    name: str  # llama.cpp's name for it (LLAMA_VOCAB_TYPE_*)
    load: Callable[[dict[str, Any], "Vocab"], Any]
    special: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    add_sep: bool = False  # what llama_vocab_get_add_sep reports (a pair's separator; encode adds none)
    bos_always: bool = False  # BOS with every add_special, whatever add_bos says (WPM's [CLS])
    sep_after: bool = False  # SEP after the text with every add_special (WPM)
    adds_special: bool = True  # False: add_special adds nothing (RWKV, PLaMo-2)


@dataclass(frozen=True)
class Vocab:
    """What every vocabulary type's model reads: the token texts, their ids and attributes, scores."""

    tokens: list[str]
    token_to_id: dict[str, int]
    attrs: np.ndarray  # (n,) uint16 llama_token_attr bits
    scores: np.ndarray  # (n,) float32 (zeros where the file has none)
    unk_id: int | None  # the unknown token (special_id), which WPM and UGM encode with


def special_id(meta: dict[str, Any], key: str, default: int | None, n: int) -> int | None:
    """llama.cpp's rule for a special token's id: the metadata's tokenizer.ggml.KEY where it is in
    range (an out-of-range one is ignored), else the vocabulary type's default where that is."""
    value = meta.get(_K + key)
    if _is_int(value) and 0 <= int(value) < n:
        return int(value)
    return default if default is not None and default < n else None


def _spm(meta: dict[str, Any], v: Vocab) -> Any:
    return SentencePieceModel(v.tokens, v.token_to_id, v.scores, bool(meta.get(_K + "add_space_prefix", True)))


def _bpe(meta: dict[str, Any], v: Vocab) -> Any:
    return ByteLevelBPE.from_metadata(meta, v.token_to_id)


def _wpm(meta: dict[str, Any], v: Vocab) -> Any:
    from infer.engine.wpm import WordPiece

    return WordPiece(v.tokens, v.unk_id, meta)


def _ugm(meta: dict[str, Any], v: Vocab) -> Any:
    from infer.engine.ugm import Unigram

    return Unigram(v.tokens, v.attrs, v.scores, v.unk_id, meta)


def _rwkv(meta: dict[str, Any], v: Vocab) -> Any:
    from infer.engine.rwkv import RwkvVocab

    return RwkvVocab(v.tokens, v.unk_id)


def _plamo2(meta: dict[str, Any], v: Vocab) -> Any:
    from infer.engine.plamo2 import Plamo2Vocab

    return Plamo2Vocab(v.tokens, v.token_to_id, v.attrs, v.scores)


_BPE_IDS = {"bos": 11, "eos": 11}
# tokenizer.ggml.model -> its type, with llama.cpp's defaults (llama_vocab::impl::load)
VOCAB_TYPES: MappingProxyType[str, VocabType] = MappingProxyType({
    "llama": VocabType("SPM", _spm, {"bos": 1, "eos": 2, "unk": 0}, add_bos=True, add_space_prefix=True),
    "gpt2": VocabType("BPE", _bpe, _BPE_IDS, clean_spaces=True),
    "gemma4": VocabType("BPE", _bpe, {}, clean_spaces=True),
    "whitespace": VocabType("BPE", _bpe, _BPE_IDS, clean_spaces=True),
    "hybriddna": VocabType("BPE", _bpe, _BPE_IDS, clean_spaces=True),
    "bert": VocabType("WPM", _wpm, {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}, add_bos=True,
                      clean_spaces=True, add_sep=True, bos_always=True, sep_after=True),
    "t5": VocabType("UGM", _ugm, {"eos": 1, "unk": 2, "pad": 0}, add_eos=True),
    "rwkv": VocabType("RWKV", _rwkv, {}, adds_special=False),
    "plamo2": VocabType("PLAMO2", _plamo2, {"bos": 1, "eos": 2, "unk": 0, "pad": 3}, adds_special=False),
})
SUPPORTED_MODELS = tuple(VOCAB_TYPES)

# Token texts llama.cpp's loader recognises when the metadata names no id; a match
# also gains the CONTROL attribute. With several matches llama.cpp takes whichever its
# hash map yields first, which cannot be predicted; this takes the first in list order
# (e.g. <|im_end|> over <|endoftext|>), the turn-ending token chat models stop on.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = (
    ("fim_pre", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>")),
    ("fim_suf", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>")),
    ("fim_mid", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>")),
    ("fim_pad", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("fim_rep", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("fim_sep", ("<|file_sep|>",)),
)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

_K = "tokenizer.ggml."


class Tokenizer:
    """Encode and decode text for one GGUF vocabulary; see `from_metadata`."""

    def __init__(self, meta: dict[str, Any]):
        model = meta.get(_K + "model")
        vtype = VOCAB_TYPES.get(model) if isinstance(model, str) else None
        if vtype is None:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model {model!r} (supported: {', '.join(SUPPORTED_MODELS)})"
            )
        self.model_type: str = model
        self._type = vtype
        tokens = meta.get(_K + "tokens")
        if not isinstance(tokens, list) or not tokens:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens list")
        if "" in tokens:  # llama.cpp renames empty tokens so each text stays unique
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._tokens: list[str] = tokens
        n = len(tokens)
        self.vocab_size: int = n
        self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self._attrs = self._load_attrs(meta.get(_K + "token_type"), n)
        self._pieces: dict[tuple[int, bool], bytes] = {}  # token_to_piece cache, filled on use

        self.add_bos, self.add_eos = vtype.add_bos, vtype.add_eos
        self.add_space_prefix, self.clean_spaces = vtype.add_space_prefix, vtype.clean_spaces
        self.add_sep = vtype.add_sep
        self._default_ids = dict(vtype.special)
        unk = special_id(meta, "unknown_token_id", vtype.special.get("unk"), n)
        self._model = vtype.load(meta, Vocab(tokens, self._token_to_id, self._attrs, self._load_scores(meta, n), unk))
        self.pre: str | None = getattr(self._model, "pre_name", None)
        for flag in ("add_bos", "clean_spaces", "add_space_prefix", "add_sep"):  # a pre-tokenizer's own defaults
            if getattr(self._model, flag, None) is not None:
                setattr(self, flag, getattr(self._model, flag))
        for name in getattr(self._model, "no_default_ids", ()):
            self._default_ids.pop(name, None)
        if _K + "add_space_prefix" in meta:
            self.add_space_prefix = bool(meta[_K + "add_space_prefix"])
        self._load_special_ids(meta)
        self._detect_special_tokens(meta)
        self._special = SpecialTokens(self._tokens, self._attrs)
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self.architecture: str = str(meta.get("general.architecture", ""))

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        return cls(meta)

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _load_attrs(token_type: Any, n: int) -> np.ndarray:
        if token_type is None:
            return np.full(n, NORMAL, dtype=np.uint16)
        types = np.asarray(token_type, dtype=np.int64)
        if types.ndim != 1 or types.size < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
        types = types[:n]
        attrs = np.zeros(n, dtype=np.uint16)  # unknown type values -> undefined, as llama.cpp
        ok = (types >= 0) & (types < len(_TYPE_TO_ATTR))
        attrs[ok] = _TYPE_TO_ATTR[types[ok]]
        return attrs

    @staticmethod
    def _load_scores(meta: dict[str, Any], n: int) -> np.ndarray:
        scores = meta.get(_K + "scores")
        if scores is None:
            return np.zeros(n, dtype=np.float32)
        scores = np.asarray(scores, dtype=np.float32)
        if scores.ndim != 1 or scores.size < n:
            raise TokenizerError(f"tokenizer.ggml.scores has {scores.size} entries for {n} tokens")
        return scores[:n]

    def _load_special_ids(self, meta: dict[str, Any]) -> None:
        n = self.vocab_size
        ids: dict[str, int | None] = {}
        names = ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
                 "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
        keys = {"unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id"}
        for name in names:
            ids[name] = special_id(meta, keys.get(name, f"{name}_token_id"), self._default_ids.get(name), n)
        for name, old in (("fim_pre", "prefix"), ("fim_suf", "suffix"), ("fim_mid", "middle")):
            ids[name] = special_id(meta, f"{old}_token_id", ids[name], n)  # deprecated keys, still honoured
        self._ids = ids
        if _K + "add_bos_token" in meta:
            self.add_bos = bool(meta[_K + "add_bos_token"])
        if _K + "add_eos_token" in meta:
            self.add_eos = bool(meta[_K + "add_eos_token"])
        if _K + "add_sep_token" in meta:
            self.add_sep = bool(meta[_K + "add_sep_token"])

    def _find_text(self, texts: Iterable[str]) -> list[int]:
        found = (self._token_to_id.get(t) for t in texts)
        return sorted(i for i in found if i is not None)

    def _detect_special_tokens(self, meta: dict[str, Any]) -> None:
        ids, attrs = self._ids, self._attrs
        for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS):
            if ids[name] is None:
                found = next((self._token_to_id[t] for t in texts if t in self._token_to_id), None)
                if found is not None:
                    ids[name] = found
                    attrs[found] |= CONTROL
        for tid in np.nonzero(attrs & CONTROL)[0]:
            if "unused" in self._tokens[tid]:
                attrs[tid] |= UNUSED

        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for tid in self._find_text(EOG_TEXTS):
            eog.add(tid)
            attrs[tid] |= CONTROL
        for tid in self._find_text(_ALWAYS_RENDERED):
            attrs[tid] = USER_DEFINED
        eog.update(ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None)

        texts = {self._tokens[t]: t for t in eog}
        # Harmony-style vocabularies use <|end|> between messages, not to stop.
        if "<|end|>" in texts and (
            ("<|return|>" in texts and "<|call|>" in texts)
            or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
        ):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = USER_DEFINED
        # Gemma 4 / PLaMo vocabularies have an ordinary '</s>'.
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

        # llama.cpp's per-model rules (the end of llama_vocab::impl::load), by substrings of names
        name = str(meta.get("general.name", "")).lower()
        pre, arch = str(meta.get(_K + "pre", "")), str(meta.get("general.architecture", ""))
        mask = None
        if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                a in arch for a in ("nomic-bert-moe", "jina-bert-v3")):
            mask = self._token_to_id.get("<mask>")  # eats the whitespace before it
        elif "phi-3" in name or "phi3" in name:
            # llama.cpp's per-model rule: Phi-3 special tokens eat the whitespace after them.
            attrs[(attrs & (CONTROL | USER_DEFINED | UNKNOWN)) != 0] |= RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                tid = self._token_to_id.get(text)
                if tid is not None:
                    attrs[tid] = attrs[tid] | RSTRIP if on else int(attrs[tid]) & ~RSTRIP  # a Python int: ~ is negative
        elif "modern-bert" in name:
            mask = self._token_to_id.get("[MASK]")
        if mask is not None:
            attrs[mask] |= LSTRIP

    # ------------------------------------------------------------------ properties

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self._ids["eot"]

    @property
    def eom_id(self) -> int | None:
        return self._ids["eom"]

    @property
    def sep_id(self) -> int | None:
        return self._ids["sep"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    @property
    def pad_id(self) -> int | None:
        return self._ids["pad"]

    def special(self, name: str) -> int | None:
        """The id of a special token by llama.cpp's name for it ("fim_pre", "fim_suf", "fim_mid",
        "fim_rep", "fim_sep", "fim_pad", ...), or None when the vocabulary has none."""
        return self._ids.get(name)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._check_id(token_id)] & CONTROL)

    def is_user_defined(self, token_id: int) -> bool:
        return bool(self._attrs[self._check_id(token_id)] & USER_DEFINED)

    def token_text(self, token_id: int) -> str:
        return self._tokens[self._check_id(token_id)]

    def token_id(self, text: str) -> int | None:
        """Id of the vocabulary entry spelled exactly `text`, if any."""
        return self._token_to_id.get(text)

    def _check_id(self, token_id: Any) -> int:
        return check_token_id(token_id, self.vocab_size)

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special).

        add_special adds BOS/EOS where the vocabulary asks for them; parse_special lets
        control tokens written in the text (e.g. '<start_of_turn>') become their ids.
        User-defined tokens are always matched as whole tokens.
        """
        check_text(text)
        out: list[int] = []
        add_special = add_special and self._type.adds_special
        if add_special and (self.add_bos or self._type.bos_always):
            out.append(self._required("bos"))
        parts = self._special.partition(text, parse_special)
        fragments = [p for p in parts if isinstance(p, str)]
        if len(fragments) > 1 and hasattr(self._model, "encode_fragments"):  # one pass over them all
            done = iter(self._model.encode_fragments(fragments))
            for part in parts:
                out.extend([part] if isinstance(part, int) else next(done))
        else:
            after_special = True
            for part in parts:
                if isinstance(part, int):
                    out.append(part)
                    after_special = True
                else:
                    out.extend(self._model.encode(part, after_special))
                    after_special = False
        if add_special and self._type.sep_after:
            out.append(self._required("sep"))
        elif add_special and self.add_eos:
            out.append(self._required("eos"))
        return out

    def _required(self, name: str) -> int:
        tid = self._ids[name]
        if tid is None:
            raise TokenizerError(f"vocabulary asks for a {name.upper()} token but defines none")
        return tid

    # ------------------------------------------------------------------ decoding

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """Bytes of one token, as llama_token_to_piece (no leading-space strip).

        Control and unknown tokens are empty unless `special`; byte tokens give their
        byte; user-defined tokens their text; normal tokens their model-specific text.
        """
        key = (token_id, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._make_piece(self._check_id(token_id), special)
            self._pieces[key] = piece
        return piece

    def _make_piece(self, tid: int, special: bool) -> bytes:
        attr = int(self._attrs[tid])
        text = self._tokens[tid]
        own = getattr(self._model, "piece", None)
        if own is not None:  # a vocabulary type whose pieces follow rules of their own (RWKV, PLaMo-2)
            return own(tid, text, attr, special)
        if attr & (CONTROL | UNKNOWN) and not special:
            return b""
        if attr & (CONTROL | UNKNOWN | USER_DEFINED):
            return text.encode("utf-8")
        if attr & NORMAL:
            return self._model.normal_piece(text)
        if attr & BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise TokenizerError(f"byte token {tid} has malformed text {text!r}") from None
        return b""  # unused and undefined tokens render as nothing

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids`, as llama_detokenize(remove_special=False, unparse_special=special);
        invalid UTF-8 (e.g. a cut-off byte sequence) becomes U+FFFD."""
        return decode_pieces(self, ids, special)

    def detokenizer(self, special: bool = False) -> IncrementalDetokenizer:
        """A streaming decoder for generated tokens (see IncrementalDetokenizer)."""
        return IncrementalDetokenizer(self, special)
