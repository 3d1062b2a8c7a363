"""The tokenizer of a Hugging Face folder as GGUF vocabulary keys: SentencePiece (tokenizer.model)
or byte-level BPE (tokenizer.json), special tokens and the chat template."""
from __future__ import annotations

import logging
import re
import struct
import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType as VT

from .hf_files import ConvertError, ConvertWarning, Kvs, read_json

logger = logging.getLogger(__name__)

# GGUF token_type values (same numbering as SentencePiece's piece types).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _proto_fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message; length-delimited values as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated message")
        yield field, wire, value


def _read_sentencepiece(path: Path) -> tuple[list[str], list[float], list[int], bool]:
    """Pieces, scores, types and add_dummy_prefix of a SentencePiece ModelProto.

    Only the few fields needed are decoded (ModelProto.pieces = 1 {piece = 1, score = 2, type = 3},
    ModelProto.normalizer_spec = 3 {add_dummy_prefix = 3}), so the sentencepiece package is not needed.
    """
    tokens, scores, types = [], [], []
    add_dummy_prefix = True  # the proto's default
    try:
        for field, wire, value in _proto_fields(path.read_bytes()):
            if field == 1 and wire == 2:
                piece, score, ptype = "", 0.0, NORMAL
                for f, w, v in _proto_fields(value):
                    if f == 1 and w == 2:
                        piece = v.decode("utf-8")
                    elif f == 2 and w == 5:
                        score = struct.unpack("<f", v)[0]
                    elif f == 3 and w == 0:
                        ptype = v
                tokens.append(piece)
                scores.append(score)
                types.append(ptype if 1 <= ptype <= 6 else NORMAL)
            elif field == 3 and wire == 2:
                for f, w, v in _proto_fields(value):
                    if f == 3 and w == 0:
                        add_dummy_prefix = bool(v)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not a SentencePiece model ({e})") from None
    if not tokens:
        raise ConvertError(f"{path}: not a SentencePiece model (no pieces)")
    return tokens, scores, types, add_dummy_prefix


# Far past any real vocabulary (the largest have ~262k tokens): the token lists are sized by the
# largest id, so a corrupt id of 2**40 would otherwise mean a list of 2**40 tokens.
MAX_TOKEN_ID = 1 << 24


def _token_id(v: Any, text: Any, path: Path) -> int:
    if isinstance(v, str) and v.isdecimal():  # added_tokens_decoder's keys are ids as strings
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_TOKEN_ID:
        raise ConvertError(f"{path}: token {str(text)[:40]!r} has id {str(v)[:40]!r}, not an integer in "
                           f"0..{MAX_TOKEN_ID - 1}")
    return v


def _added_tokens(folder: Path) -> dict[int, tuple[str, bool]]:
    """id -> (text, special) from tokenizer_config.json's added_tokens_decoder and tokenizer.json."""
    out: dict[int, tuple[str, bool]] = {}
    tj = folder / "tokenizer.json"
    if tj.is_file():
        for t in read_json(tj, "tokenizer").get("added_tokens") or []:
            if isinstance(t, dict) and "id" in t and "content" in t:
                out[_token_id(t["id"], t["content"], tj)] = (str(t["content"]), bool(t.get("special", False)))
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        decoder = read_json(tc, "tokenizer config").get("added_tokens_decoder")
        for tid, t in (decoder.items() if isinstance(decoder, dict) else ()):
            if isinstance(t, dict) and "content" in t:
                out[_token_id(tid, t["content"], tc)] = (str(t["content"]), bool(t.get("special", False)))
    return out


def _looks_special(text: str) -> bool:
    # Added tokens not flagged special but spelled like control tokens are treated as control
    # tokens by llama.cpp's converter too (e.g. <|im_start|> in some configs).
    return (text.startswith("<|") and text.endswith("|>")) or text in ("<pad>", "<mask>", "<s>", "</s>", "<unk>")


def spm_vocab(folder: Path) -> tuple[list[str], list[float], list[int], bool]:
    path = folder / "tokenizer.model"
    tokens, scores, types, add_prefix = _read_sentencepiece(path)
    for tid, (text, special) in sorted(_added_tokens(folder).items()):
        if tid < len(tokens):
            if tokens[tid] != text or special:
                tokens[tid], types[tid] = text, (CONTROL if special else USER_DEFINED)
        else:
            while len(tokens) < tid:
                tokens.append(f"[PAD{len(tokens)}]")
                scores.append(-1000.0)
                types.append(UNUSED)
            tokens.append(text)
            scores.append(-1000.0)
            types.append(CONTROL if special else USER_DEFINED)
    return tokens, scores, types, add_prefix


# The Split regexes of known pre-tokenizers, as tokenizer.json spells them, and the
# tokenizer.ggml.pre name llama.cpp uses for each. llama.cpp's converter identifies a pre-tokenizer
# by hashing a test text's token ids; that needs the real vocabulary, so this matches the regex
# itself, which also recognises retrained or resized vocabularies with the same pre-tokenizer.
_CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_KNOWN_SPLITS = {
    _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    # o200k's (GPT-4o's, Llama 4's: llama.cpp reads "gpt-4o" and "llama4" alike)
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTR + "?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTR + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": "gpt-4o",
}


def _flatten(pt: Any) -> list[dict[str, Any]]:
    if not isinstance(pt, dict):
        return []
    if pt.get("type") == "Sequence":
        return [p for sub in pt.get("pretokenizers") or [] for p in _flatten(sub)]
    return [pt]


def detect_pre_tokenizer(tokenizer_json: dict[str, Any]) -> str | None:
    """The tokenizer.ggml.pre name for a byte-level BPE tokenizer.json, or None if unrecognised."""
    parts = _flatten(tokenizer_json.get("pre_tokenizer"))
    splits = [p for p in parts if p.get("type") == "Split"]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    if len(byte_level) != 1:
        return None
    if not splits and byte_level[0].get("use_regex", True):
        return "gpt-2"  # ByteLevel's own regex is GPT-2's
    if len(splits) == 1 and not byte_level[0].get("use_regex", True):
        pattern = (splits[0].get("pattern") or {}).get("Regex")
        if splits[0].get("behavior") == "Isolated" and not splits[0].get("invert", False):
            return _KNOWN_SPLITS.get(pattern)
    return None


def bpe_vocab(folder: Path, kv: Kvs, n_rows: int | None) -> int:
    path = folder / "tokenizer.json"
    tj = read_json(path, "tokenizer")
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ConvertError(f"{path}: tokenizer model {model.get('type')!r} is not supported (byte-level BPE only)")
    if not any(p.get("type") == "ByteLevel" for p in _flatten(tj.get("pre_tokenizer"))):
        raise ConvertError(
            f"{path}: a BPE tokenizer without a ByteLevel pre-tokenizer (SentencePiece-style) needs "
            "tokenizer.model, which this folder lacks"
        )
    pre = detect_pre_tokenizer(tj)
    if pre is None:
        msg = (f"{path}: unrecognised pre-tokenizer; writing tokenizer.ggml.pre = 'default', so llama.cpp "
               "and infer may split text differently from the original tokenizer")
        warnings.warn(msg, ConvertWarning, stacklevel=3)
        logger.warning(msg)
        pre = "default"
    by_id: dict[int, str] = {_token_id(i, t, path): t for t, i in model["vocab"].items()}
    added = _added_tokens(folder)
    n = max([*by_id, *added, -1]) + 1
    if n_rows is not None:
        n = max(n, n_rows)
    tokens, types = [], []
    for i in range(n):
        if i in added:
            text, special = added[i]
            tokens.append(text)
            types.append(CONTROL if special or _looks_special(text) else USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(NORMAL)
        else:  # ids the embedding has but the tokenizer never produces
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    merges = []
    for m in model.get("merges") or []:
        merges.append(m if isinstance(m, str) else " ".join(m))  # newer tokenizers store [a, b] pairs
    kv.add("tokenizer.ggml.model", VT.STRING, "gpt2")
    kv.add("tokenizer.ggml.pre", VT.STRING, pre)
    kv.add("tokenizer.ggml.tokens", VT.ARRAY, tokens)
    kv.add("tokenizer.ggml.token_type", VT.ARRAY, np.asarray(types, dtype=np.int32))
    kv.add("tokenizer.ggml.merges", VT.ARRAY, merges)
    return len(tokens)


_SPECIAL_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                 "unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
                 "pad": "tokenizer.ggml.padding_token_id", "cls": "tokenizer.ggml.cls_token_id",
                 "mask": "tokenizer.ggml.mask_token_id", "eot": "tokenizer.ggml.eot_token_id",
                 "eom": "tokenizer.ggml.eom_token_id"}


def special_kvs(folder: Path, kv: Kvs, n_vocab: int, by_text: tuple[tuple[str, str], ...] = ()) -> None:
    """The special tokens' ids, add_bos/add_eos and the chat template, as gguf's SpecialVocab
    reads them; by_text: (kind, token text) of tokens an architecture's converter names where the
    settings do not (Architecture.hf_special_tokens), each an added token of the tokenizer."""
    # gguf's SpecialVocab reads tokenizer_config.json / tokenizer.json / config.json /
    # chat_template.jinja exactly as llama.cpp's converter does (it is the converter's own helper).
    try:
        sv = gguf.vocab.SpecialVocab(folder, load_merges=False, n_vocab=n_vocab)
    except (ValueError, AttributeError, TypeError, KeyError) as e:
        # Its only ways of meeting a malformed file: a negative id (ValueError), an object that is
        # a list or a string where it expects a dict (AttributeError, TypeError, KeyError).
        raise ConvertError(f"{folder}: malformed special-token settings in tokenizer.json, tokenizer_config.json "
                           f"or config.json ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    ids = dict(sv.special_token_ids)
    if by_text:
        added = {text: tid for tid, (text, _) in _added_tokens(folder).items()}
        for typ, text in by_text:
            if text not in added:
                raise ConvertError(f"{folder}: the tokenizer has no added token {text!r} (the {typ} token)")
            if added[text] < n_vocab:
                ids.setdefault(typ, added[text])  # as SpecialVocab's own: the settings' id first
    for typ, tid in ids.items():
        if typ in _SPECIAL_KEYS and tid is not None:
            kv.u32(_SPECIAL_KEYS[typ], tid)
    for typ in ("bos", "eos"):
        if sv.add_special_token.get(typ) is not None:
            kv.add(f"tokenizer.ggml.add_{typ}_token", VT.BOOL, bool(sv.add_special_token[typ]))
    tmpl = sv.chat_template
    if isinstance(tmpl, str):
        kv.add("tokenizer.chat_template", VT.STRING, tmpl)
    elif isinstance(tmpl, (list, tuple)):  # named templates: 'default' plus e.g. 'tool_use'
        names = []
        for t in tmpl:
            name, text = t.get("name"), t.get("template")
            if not isinstance(name, str) or not isinstance(text, str):
                continue
            if name == "default":
                kv.add("tokenizer.chat_template", VT.STRING, text)
            else:
                names.append(name)
                kv.add(f"tokenizer.chat_template.{name}", VT.STRING, text)
        if names:
            kv.add("tokenizer.chat_templates", VT.ARRAY, names)



# Gemma 4's markers its chat parser must read: llama.cpp's converter makes them USER_DEFINED, so
# they are rendered in the text, whatever the tokenizer calls them.
GEMMA4_VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                  '<|"|>')


def gemma4_vocab(folder: Path, kv: Kvs) -> int:
    """Gemma 4's tokenizer.json (a SentencePiece-style BPE with byte fallback) as llama.cpp's Gemma4
    converter writes it, through gguf's LlamaHfVocab: the model's vocabulary in id order, then the
    added tokens past it; byte tokens BYTE, special ones CONTROL, other added ones USER_DEFINED,
    GEMMA4_VISIBLE USER_DEFINED; every score -1000; tokenizer model "gemma4" with the merges.
    (LlamaHfVocab asks transformers which ids are special; here: the added tokens marked special.)"""
    path = folder / "tokenizer.json"
    tj = read_json(path, "tokenizer")
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict) or not model.get("byte_fallback"):
        raise ConvertError(f"{path}: Gemma 4 needs a BPE tokenizer with byte fallback, got {model.get('type')!r}")
    by_id: dict[int, str] = {_token_id(i, t, path): t for t, i in model["vocab"].items()}
    n_base = len(by_id)
    if sorted(by_id) != list(range(n_base)):
        raise ConvertError(f"{path}: the vocabulary's ids are not 0..{n_base - 1}")
    added = _added_tokens(folder)
    special = {i for i, (_, s) in added.items() if s}
    tokens, types = [], []
    for i in range(n_base):
        text = by_id[i]
        tokens.append(text)
        types.append(BYTE if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text) else CONTROL if i in special else NORMAL)
    for i in sorted(t for t in added if t >= n_base):
        if i != len(tokens):
            raise ConvertError(f"{path}: added token ids past the vocabulary are not consecutive (at {i})")
        tokens.append(added[i][0])
        types.append(CONTROL if added[i][1] else USER_DEFINED)
    types = [USER_DEFINED if t in GEMMA4_VISIBLE else ty for t, ty in zip(tokens, types)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    kv.add("tokenizer.ggml.model", VT.STRING, "gemma4")
    kv.add("tokenizer.ggml.tokens", VT.ARRAY, tokens)
    kv.add("tokenizer.ggml.scores", VT.ARRAY, np.full(len(tokens), -1000.0, dtype=np.float32))
    kv.add("tokenizer.ggml.token_type", VT.ARRAY, np.asarray(types, dtype=np.int32))
    if merges:
        kv.add("tokenizer.ggml.merges", VT.ARRAY, merges)
    kv.add("tokenizer.ggml.add_space_prefix", VT.BOOL, False)
    return len(tokens)
