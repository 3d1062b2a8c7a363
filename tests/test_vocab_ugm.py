"""UGM ('t5' GGUF) vocabularies: ids, pieces and text identical to llama.cpp (via llama-cpp-python).

Two sources: llama.cpp's own ggml-vocab-nomic-bert-moe.gguf (XLM-RoBERTa's 250k-token Unigram with
the nmt_nfkc charsmap, add_space_prefix and remove_extra_whitespaces) and small T5-style GGUFs built
here from a sentencepiece Unigram the way llama.cpp's conversion/t5.py converts one: unused [PADi]
tokens filling the model's vocab_size, user-defined "added tokens" among them, and three normalizer
settings (nmt_nfkc with both whitespace flags, nmt_nfkc_cf with neither, identity with no charsmap).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from helpers.vocab_gguf import ref_detokenize, ref_piece, reference, write_vocab_gguf
from infer.engine.tokenizer import Tokenizer, TokenizerError
from infer.engine.ugm import Unigram
from infer.models.gguf_file import read_gguf

pytestmark = pytest.mark.reference

FLAGS = [(True, True), (True, False), (False, True), (False, False)]  # (add_special, parse_special)
N_RANDOM = 300  # random texts per vocabulary

# Text pieces the random strings are made of: every class the charsmap treats differently
_WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2002", "\u200b", "\ufeff"]
_PIECES = [
    "the", "quick", "Brown", "fox", "jumps", "über", "naïve", "café", "Ångström", "straße", "ñandú", "kari", "tone",
    "0", "7", "42", "2024", "3.14159", "1,000,000", "٣٤٥", "½", "Ⅻ", "²", "①", "㎏", "™", "…",
    "你好", "世界", "的一是", "日本語", "テキスト", "ｶﾀｶﾅ", "한국어", "가", "Привет", "αβγ", "مرحبا", "नमस्ते", "ไทย",
    "ＡＢＣ", "１２３", "！？", "ﬁ", "ﬀ", "Ǆ", "e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0301", "\u0327c",
    "😀", "👍🏽", "👨\u200d👩\u200d👧", "❤️", "🏳️\u200d🌈", "🇺🇳", "𝔘𝔫𝔦", "𝟙𝟚",
    ".", ",", "!", "?", "'", '"', "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "-", "_", "=", "+", "*", "#",
    "@", "$", "€", "€uro", "–", "—", "«", "»", "▁", "▁▁", "\x00", "\x01", "\x7f", "\u2028", "\ud7ff", "\U0010fffd",
    "<s>", "</s>", "<unk>", "<mask>", "<pad>", "<s", "</", "<mask", "<extra_id_0>", "<extra_id_", "<extra_id_1",
    "[PAD1]", "[PAD250001]", "ñu", "ñ", "a b", "a  b",
]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.45:
            parts.append(rng.choice(_PIECES))
        elif r < 0.75:
            parts.append(rng.choice(_WS))
        elif r < 0.9:  # any scalar value, most of them in the BMP
            hi = 0x3000 if rng.random() < 0.5 else 0x10FFFF
            c = rng.randint(0x20, hi)
            parts.append(chr(c if not 0xD800 <= c < 0xE000 else c - 0x1000))
        else:
            parts.append(rng.choice(_PIECES) * rng.randint(2, 5))
    return "".join(parts)


# ---------------------------------------------------------------- llama.cpp reference


# ---------------------------------------------------------------- a small T5 vocabulary


def _proto_fields(buf: bytes):
    """(field number, value) of one protobuf message: ints for varints, bytes for the rest."""
    i = 0

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while i < len(buf):
        key = varint()
        kind = key & 7
        if kind == 0:
            yield key >> 3, varint()
        elif kind == 2:
            n = varint()
            yield key >> 3, buf[i:i + n]
            i += n
        else:  # fixed 32/64-bit
            size = 4 if kind == 5 else 8
            yield key >> 3, buf[i:i + size]
            i += size


def _normalizer_spec(model: Path) -> tuple[bytes, bool, bool]:
    """(precompiled_charsmap, add_dummy_prefix, remove_extra_whitespaces) of a sentencepiece model
    (ModelProto field 3), read without protobuf; absent flags take their proto defaults (true)."""
    spec = dict(_proto_fields(next(v for n, v in _proto_fields(model.read_bytes()) if n == 3)))
    return bytes(spec.get(2, b"")), bool(spec.get(3, 1)), bool(spec.get(4, 1))


def _corpus(rng: random.Random) -> list[str]:
    syllables = ["ka", "ri", "to", "ne", "su", "mi", "lo", "pa", "an", "er", "in", "on", "qu", "th", "sh",
                 "é", "ñ", "ü", "ø", "ß"]
    alphabets = ["абвгдежзиклмнопрст", "αβγδεζηθικλμνξοπρσ", "的一是不了人我在有他这中大来上个国",
                 "あいうえおかきくけこさしす", "0123456789", ".,;:!?()[]{}<>\"'-_/+*=#@€$%&"]

    def word() -> str:
        if rng.random() < 0.6:
            w = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            return w.capitalize() if rng.random() < 0.2 else w
        a = rng.choice(alphabets)
        return "".join(rng.choice(a) for _ in range(rng.randint(1, 3)))

    words = [word() for _ in range(1500)]
    return [" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)]


# (normalization rule, add_dummy_prefix, remove_extra_whitespaces, byte_fallback)
T5_VARIANTS = {
    "nfkc": ("nmt_nfkc", True, True, False),
    "nfkc_cf": ("nmt_nfkc_cf", False, False, True),
    "identity": ("identity", True, False, False),
}
# added tokens (conversion/t5.py: USER_DEFINED, score -1000): prefixes of them pass normalization
# untouched, even a lone lead byte of 'ñ' or '€' shared with other characters
ADDED = ["<extra_id_0>", "<extra_id_1>", "ñu", "€uro", "a b", "Ωmega"]
N_UNUSED = 12  # vocab_size beyond the sentencepiece model: [PADi] unused tokens


def write_t5_gguf(folder: Path, name: str) -> Path:
    """A vocabulary-only T5 GGUF converted like llama.cpp's conversion/t5.py does a Unigram model."""
    import gguf
    import sentencepiece as spm

    rule, dummy_prefix, remove_ws, byte_fallback = T5_VARIANTS[name]
    corpus = folder / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("\n".join(_corpus(random.Random(0))), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / name), model_type="unigram", vocab_size=1000,
        character_coverage=0.999, normalization_rule_name=rule, add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=remove_ws, byte_fallback=byte_fallback,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(folder / f"{name}.model"))
    charsmap, add_prefix, remove_extra = _normalizer_spec(folder / f"{name}.model")

    n_sp = sp.vocab_size()
    size = n_sp + N_UNUSED
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = [-10000.0] * size
    types = [gguf.TokenType.UNUSED] * size
    for i in range(n_sp):
        tokens[i], scores[i] = sp.IdToPiece(i), sp.GetScore(i)
        types[i] = (gguf.TokenType.UNKNOWN if sp.IsUnknown(i) else gguf.TokenType.CONTROL if sp.IsControl(i)
                    else gguf.TokenType.UNUSED if sp.IsUnused(i) else gguf.TokenType.BYTE if sp.IsByte(i)
                    else gguf.TokenType.NORMAL)
    for k, text in enumerate(ADDED):
        i = n_sp + 2 + k
        tokens[i], scores[i], types[i] = text, -1000.0, gguf.TokenType.USER_DEFINED

    def kv(w):
        w.add_key_length(32)
        w.add_value_length(32)
        w.add_layer_norm_eps(1e-6)
        w.add_relative_attn_buckets_count(32)
        w.add_decoder_start_token_id(0)
        w.add_tokenizer_model("t5")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_add_space_prefix(add_prefix)
        w.add_remove_extra_whitespaces(remove_extra)
        if charsmap:
            w.add_precompiled_charsmap(charsmap)
        w.add_eos_token_id(1)
        w.add_unk_token_id(2)
        w.add_pad_token_id(0)

    return write_vocab_gguf(folder / f"{name}.gguf", "t5", kv)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    pytest.importorskip("sentencepiece")
    return tmp_path_factory.mktemp("t5_vocab")


@pytest.fixture(scope="module", params=["nomic-bert-moe", *T5_VARIANTS])
def vocab(request, llama_cpp, llama_vocab_dir, t5_dir):
    """(name, infer Tokenizer, llama.cpp reference) of each UGM vocabulary."""
    if request.param == "nomic-bert-moe":
        path = llama_vocab_dir / "ggml-vocab-nomic-bert-moe.gguf"
    else:
        path = write_t5_gguf(t5_dir, request.param)
    tok = Tokenizer.from_metadata(read_gguf(path).metadata)
    return request.param, tok, reference(llama_cpp, path)


# ---------------------------------------------------------------- encoding


def test_encode_matches_llama_cpp(vocab):
    """Random texts under every add_special / parse_special pair: the same ids as llama_tokenize."""
    name, tok, ref = vocab
    rng = random.Random(f"ugm-{name}")
    texts = ["", " ", "   ", "\n", " a", "a ", "  a  b  ", "ñ", "ñe", "€", "€u", "–", "\t<s>\t", "<mask> x </s>"]
    texts += [random_text(rng) for _ in range(N_RANDOM)]
    failures = []
    for text in texts:
        for add_special, parse_special in FLAGS:
            ours = tok.encode(text, add_special=add_special, parse_special=parse_special)
            want = ref.tokenize(text.encode(), add_bos=add_special, special=parse_special)
            if ours != want:
                failures.append((text, add_special, parse_special, ours, want))
    print(f"\n{name}: {len(texts) * len(FLAGS) - len(failures)}/{len(texts) * len(FLAGS)} encodings match llama.cpp")
    assert not failures, failures[:5]


def test_special_ids_match_llama_cpp(vocab, llama_cpp):
    name, tok, ref = vocab
    v = llama_cpp.llama_model_get_vocab(ref.model)
    assert tok.vocab_size == llama_cpp.llama_vocab_n_tokens(v)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(v)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(v)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(v)


# ---------------------------------------------------------------- decoding


def test_decode_matches_llama_cpp(vocab, llama_cpp):
    """decode == llama_detokenize for encoded texts and random id lists; token_to_piece for
    thousands of ids (every special one, and random others)."""
    name, tok, ref = vocab
    rng = random.Random(f"ugm-decode-{name}")
    n = tok.vocab_size
    id_lists = [tok.encode(random_text(rng), add_special=True, parse_special=True) for _ in range(100)]
    id_lists += [[rng.randrange(n) for _ in range(rng.randint(1, 12))] for _ in range(100)]
    for ids in id_lists:
        for special in (False, True):
            assert tok.decode(ids, special) == ref_detokenize(llama_cpp, ref, ids, special), (ids, special)
    sample = set(range(min(n, 300))) | set(range(n - 60, n)) | {rng.randrange(n) for _ in range(2500)}
    for tid in sorted(sample):
        for special in (False, True):
            assert tok.token_to_piece(tid, special) == ref_piece(llama_cpp, ref, tid, special), (tid, special)


# ---------------------------------------------------------------- speed


# ---------------------------------------------------------------- without llama.cpp


def _tiny_meta(**extra) -> dict:
    tokens = ["<pad>", "</s>", "<unk>", "\u2581a", "a", "b", "\u2581"]
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array([0, 0, 0, -1, -2, -3, -4], np.float32),
            "tokenizer.ggml.token_type": np.array([3, 3, 2, 1, 1, 1, 1], np.int32), **extra}


def test_unknown_runs_merge_and_flags():
    tok = Tokenizer.from_metadata(_tiny_meta())
    assert tok.encode("ab", add_special=False) == [4, 5]
    assert tok.encode("xyzb", add_special=False) == [2, 5]  # one <unk> for the whole unknown run
    assert tok.encode(" a", add_special=True) == [3, 1]  # no flags: the space kept, no prefix added
    assert tok.encode("a", add_special=False) == [4]
    tok = Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.add_space_prefix": True,
                                               "tokenizer.ggml.remove_extra_whitespaces": True}))
    assert tok.encode("  a  a ", add_special=False) == [3, 3]


def test_bad_charsmap_is_a_tokenizer_error():
    for blob in (np.zeros(2, np.uint8), np.array([200, 0, 0, 0, 1, 2], np.uint8)):
        with pytest.raises(TokenizerError):
            Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.precompiled_charsmap": blob}))
    # an XCDA whose root points outside it fails on use, as llama.cpp throws then
    bad = np.concatenate([np.array([4, 0, 0, 0], np.uint8), np.array([0xFFFFFC00], "<u4").view(np.uint8),
                          np.zeros(4, np.uint8)])
    tok = Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.precompiled_charsmap": bad}))
    with pytest.raises(TokenizerError):
        tok.encode("a")


def test_normal_piece_unescapes_spaces():
    m = Unigram(["\u2581a\u2581b"], np.array([4], np.uint16), np.zeros(1, np.float32), None, {})
    assert m.normal_piece("\u2581a\u2581b") == b" a b"
