"""A GGUF vocabulary as Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json,
generation_config.json) that tokenize exactly as engine.tokenizer.Tokenizer does on that vocabulary.

- 'gpt2' (byte-level BPE) vocabularies: the `tokenizers` pipeline engine/bpe.py already runs
  (llama.cpp's split regexes, ByteLevel, BPE over the GGUF merges), serialized, plus a ByteLevel decoder.
- 'llama' (SentencePiece) vocabularies, e.g. Gemma: a BPE with byte fallback whose merges are made
  from the scores the way HF's SentencePiece converters do (every split of a piece into two pieces,
  ordered by the merged piece's score), so merging by rank is llama.cpp's merging by score; the
  normalizer writes spaces as '▁' (and prepends one where the GGUF asks for a space prefix); the
  decoder undoes that (Replace, ByteFallback, Fuse, Strip).
In both, control tokens become special added tokens (matched only when special tokens are parsed)
and user-defined tokens plain added tokens (always matched), as llama.cpp treats them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, decoders, models, normalizers, processors
from tokenizers import Tokenizer as HFTokenizerCore

from infer.engine.bpe import ByteLevelBPE
from infer.engine.chat_template import builtin_template
from infer.engine.pretokenizers import PRE_TOKENIZERS
from infer.engine.spm import ESCAPED_SPACE
from infer.engine.tokenizer import Tokenizer, TokenizerError

_K = "tokenizer.ggml."
_USER_DEFINED, _UNKNOWN = 4, 2  # GGUF token_type values


def spm_merges(tokens: list[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """BPE merges equivalent to score-ordered SentencePiece merging: for every piece, each split
    into two vocabulary pieces, pieces by descending score (vocabulary order on ties), splits of one
    piece by the ids of their halves (HF's SentencePieceExtractor order)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    get = vocab.get
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    merges: list[tuple[str, str]] = []
    for tid in order.tolist():
        piece = tokens[tid]
        local = []
        for k in range(1, len(piece)):
            left = get(piece[:k])
            if left is not None:
                right = get(piece[k:])
                if right is not None:
                    local.append((left, right))
        if len(local) > 1:
            local.sort()
        merges.extend((tokens[a], tokens[b]) for a, b in local)
    return merges


def _spm_tokenizer(meta: dict[str, Any], tokens: list[str], add_prefix: bool, unk: str | None) -> HFTokenizerCore:
    scores = np.asarray(meta.get(_K + "scores", np.zeros(len(tokens))), dtype=np.float32)
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores), byte_fallback=True, unk_token=unk,
                       fuse_unk=True)
    tok = HFTokenizerCore(model)
    space = normalizers.Replace(" ", ESCAPED_SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(ESCAPED_SPACE), space]) if add_prefix else space
    steps = [decoders.Replace(ESCAPED_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def _bpe_tokenizer(meta: dict[str, Any], tokens: list[str]) -> HFTokenizerCore:
    pre = meta.get(_K + "pre") or "default"
    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
    bpe = ByteLevelBPE({t: i for i, t in enumerate(tokens)}, list(meta.get(_K + "merges") or []), PRE_TOKENIZERS[pre])
    tok = bpe.pipeline  # the very pipeline infer encodes with; only the decoder is missing
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_json(meta: dict[str, Any]) -> str:
    """tokenizer.json text for a GGUF vocabulary."""
    ref = Tokenizer.from_metadata(meta)  # validates the vocabulary and works out the special tokens
    tokens = list(meta[_K + "tokens"])
    if "" in tokens:  # as engine.tokenizer: empty texts renamed so each text is unique
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        raise TokenizerError("the vocabulary has duplicate token texts, which tokenizer.json cannot hold")
    types = np.asarray(meta.get(_K + "token_type", np.ones(len(tokens))), dtype=np.int64)
    if ref.model_type == "llama":
        unk = tokens[ref.unk_id] if ref.unk_id is not None else None
        tok = _spm_tokenizer(meta, tokens, ref.add_space_prefix, unk)
    else:
        tok = _bpe_tokenizer(meta, tokens)
    added = []
    for i, text in enumerate(tokens):
        special = ref.is_control(i) or types[i] == _UNKNOWN
        if special or types[i] == _USER_DEFINED:
            # llama.cpp matches these in the raw text, before any space escaping: normalized=False.
            added.append(AddedToken(text, special=special, normalized=False))
    tok.add_tokens(added)
    single = ([f"{tokens[ref.bos_id]}:0"] if ref.add_bos and ref.bos_id is not None else []) + ["$A:0"]
    if ref.add_eos and ref.eos_id is not None:
        single.append(f"{tokens[ref.eos_id]}:0")
    specials = [(tokens[i], i) for i in {ref.bos_id, ref.eos_id} if i is not None]
    tok.post_processor = processors.TemplateProcessing(single=" ".join(single), pair=" ".join(single + ["$B:1"]),
                                                       special_tokens=specials)
    return tok.to_str()


def write_tokenizer_files(meta: dict[str, Any], folder: Path) -> None:
    """tokenizer.json, tokenizer_config.json (BOS/EOS, chat template: the GGUF's, else infer's
    built-in one for the architecture) and generation_config.json (the end-of-generation ids)."""
    ref = Tokenizer.from_metadata(meta)
    folder = Path(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json(meta), encoding="utf-8")
    arch = str(meta.get("general.architecture", ""))
    template = meta.get("tokenizer.chat_template") or builtin_template(arch, ref.model_type, ref.pre)
    text = ref.token_text
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": ref.add_bos,
        "add_eos_token": ref.add_eos,
        "bos_token": text(ref.bos_id) if ref.bos_id is not None else None,
        "eos_token": text(ref.eos_id) if ref.eos_id is not None else None,
        "unk_token": text(ref.unk_id) if ref.unk_id is not None else None,
        "pad_token": text(ref.pad_id) if ref.pad_id is not None else None,
        "clean_up_tokenization_spaces": ref.clean_spaces,
        "model_max_length": int(meta.get(f"{arch}.context_length", 2048)),
        "chat_template": template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    gen = {"bos_token_id": ref.bos_id, "eos_token_id": sorted(ref.eog_ids)}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
