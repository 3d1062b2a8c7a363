"""Vocabulary tests' tools: vocabulary-only GGUFs written with gguf's writer (llama.cpp loads them
with vocab_only), a small byte-level BPE trained with `tokenizers`, random text that stresses a
tokenizer, and llama.cpp's (llama-cpp-python's) side of every comparison."""
from __future__ import annotations

import ctypes
import json
import random
from pathlib import Path
from typing import Callable


def write_vocab_gguf(path: Path, arch: str, tokenizer_kv: Callable) -> Path:
    """A GGUF with tiny hyperparameters and no tensors: llama.cpp loads it with vocab_only."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    tokenizer_kv(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_byte_bpe_gguf(path: Path, trained: tuple[list[str], list[int], list[str]], pre: str,
                        extra: Callable | None = None) -> Path:
    """A 'gpt2' vocabulary GGUF of train_byte_bpe's tokens, types and merges, with tokenizer.ggml.pre
    `pre`, BOS 0 and EOS 2; extra(writer) adds more keys."""
    tokens, types, merges = trained

    def kv(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(2)
        if extra is not None:
            extra(w)

    return write_vocab_gguf(path, "qwen2", kv)


def train_byte_bpe(corpus: list[str], vocab_size: int = 1000) -> tuple[list[str], list[int], list[str]]:
    """Tokens, GGUF token types and merges of a byte-level BPE trained on corpus, with three control
    tokens and a user-defined one ("[[sep]]", always split out of the text)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(corpus, trainer)
    model = json.loads(hf.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for text, i in model["vocab"].items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tokens.append("[[sep]]")
    types = [3 if t.startswith("<|") else 4 if t == "[[sep]]" else 1 for t in tokens]
    return tokens, types, merges


# what random text is made of: scripts, digits of several kinds, whitespace of every kind and
# length, marks, emoji sequences, punctuation and symbols, controls, contractions
PIECES = [
    " ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u3000", "\u2009", "\x85", "\u2028",
    "a", "Z", "hello", " world", "Hello", "WORLD", "don't", "I'LL", "'s", "'ve", "'", "\"",
    "0", "7", "123", "4567890", "3.14", "1,000", "٣٤٥", "½", "²", "Ⅻ", "１２", "𝟙",
    "你好", "世界", "日本語", "カタカナ", "ひらがな", "한국어", "Привет", "مرحبا", "नमस्ते", "ελληνικά", "עברית", "ไทย",
    "😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "🇺🇳", "e\u0301", "\u0301", "ñ", "ß", "Ω", "ﬁ", "Ａ", "ℌ", "İ", "ǅ",
    ".", ",", "!", "?", "...", "—", "–", "(", ")", "[", "]", "<", ">", "/", "\\", "{", "}", "#", "$", "%",
    "&", "*", "_", "-", "=", "+", "|", "~", "`", "^", "@", "€", "©", "°", "…", "。", "，", "、",
    "\x00", "\x1f", "\u200b", "\u200d", "\ufeff", "\U00013460", "\u1c89", "\U00016130", "\U0010ffff", "▁", "▁▁",
]


def random_texts(seed: int, n: int, extra: list[str] = ()) -> list[str]:
    """n strings of 0-30 random pieces (PIECES, plus `extra`: say, the vocabulary's special tokens),
    a few of them long runs of one piece."""
    rng = random.Random(seed)
    pool = PIECES + list(extra)
    out = []
    for i in range(n):
        if i % 17 == 0:
            out.append(rng.choice(pool) * rng.randint(2, 40))
        else:
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(0, 30))))
    return out


def reference(llama_cpp, path: Path):
    """llama.cpp on path's vocabulary alone."""
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def ref_detokenize(llama_cpp, llm, ids: list[int], special: bool) -> str:
    """llama_detokenize(remove_special=False, unparse_special=special)."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, special)
    assert n >= 0
    return buf.raw[:n].decode("utf-8", errors="replace")


def ref_piece(llama_cpp, llm, token_id: int, special: bool) -> bytes:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, special)
    assert n >= 0
    return buf.raw[:n]


def ref_eog(llama_cpp, llm, n_vocab: int) -> set[int]:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return {i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}


def ref_tokenize(llama_cpp, llm, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llama_tokenize in one pass, with room for every id (Llama.tokenize calls it again when its
    first buffer is short)."""
    data = text.encode("utf-8")
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    size = 2 * len(data) + 8
    buf = (llama_cpp.llama_token * size)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, size, add_special, parse_special)
    assert n >= 0
    return list(buf[:n])
