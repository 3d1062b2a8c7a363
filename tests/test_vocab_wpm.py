"""llama.cpp's WPM vocabulary (BERT WordPiece, tokenizer.ggml.model 'bert'): ids, pieces and text
identical to llama.cpp's (llama-cpp-python's), on its own test vectors and on random text."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers.llama_vocab import vectors
from helpers.vocab_gguf import ref_detokenize, ref_piece, ref_tokenize, reference, write_vocab_gguf
from infer.engine.tokenizer import Tokenizer
from infer.models.gguf_file import read_gguf

pytestmark = pytest.mark.reference

# What random text is made of. Every class llama.cpp's WPM preprocessing treats apart shows up:
# its whitespace set (and 0x1C-0x1F, which Python calls whitespace and llama.cpp a control),
# controls and format characters that vanish inside a word, marks kept or stripped, precomposed
# letters whose "NFD" keeps one code point, case pairs with odd simple mappings, punctuation and
# ASCII symbols that stand alone, CJK inside and outside is_chinese_char's ranges, code points
# Unicode 15 assigned (llama.cpp's tables are 15.1, Python 3.11's are 14), and special-token text.
PIECES = [
    " ", "  ", "   \t ", "\n", "\n\n", "\r\n", "\t", "\v\f", "\x85", "\xa0", "\u1680", "\u2003", "\u2009",
    "\u2028", "\u202f", "\u205f", "\u3000", "\x1c", "\x1f",
    "\x00", "\x07", "\x7f", "\u00ad", "\u200b", "\u200d", "\u2060", "\ufeff", "\ufffd", "\ue000", "\U000f0001",
    "\U00100000", "\U000e0041",
    "hello", "world", "The", "QUICK", "Brown", "fox's", "don't", "unbelievable", "tokenization",
    "antidisestablishmentarianism", "xyzzyqwv", "ab" * 30, "embeddings", "BERT", "WordPiece",
    "0", "42", "3.14159", "1,000,000", "٣٤٥", "½", "Ⅻ", "１２３", "²",
    "café", "naïve", "résumé", "Ångström", "ñandú", "ÀÉÎÕÜ", "ǅ", "ß", "ẞ", "İstanbul", "ΣΊΣΥΦΟΣ",
    "ὈΔΥΣΣΕΎΣ", "Привет", "ЁЛКА", "עברית", "مرحبا", "नमस्ते", "ไทย", "한국어", "カタカナ", "ひらがな",
    "ﾊﾝｶｸ",
    "e\u0301", "a\u0308\u0323", "\u0301", "\u20dd", "\u0903", "\u1ab0", "o\u0338",
    "\u212b", "\u2126", "\u1e9b", "\u0344", "\u1fef", "\u1fee", "\u2000", "\u0958", "\ufb1d",
    "你好", "世界", "漢字", "\u3400", "\u4dbf", "\U00020000", "\U0002a6d6", "\U0002b740", "\U0002b820",
    "\U0002b91f", "\U0002b920", "\U0002ceaf", "\uf900", "\ufa6d", "\U0002f800", "\U0002fa1d", "\U00031350",
    "\U0002ebf0", "。", "、", "「」", "！", "？", "（）", "：",
    "\u0cf3", "\u0ece", "\U00011f00", "\U00011f43", "\U00011b00", "\U00013439", "\U00013440", "\U0001e4ec",
    "\U0001e030", "\U0001fae8", "\u2ffc", "\U00010d40",
    "!", "?", ".", ",", ";", ":", "'", '"', "-", "_", "(", ")", "[", "]", "{", "}", "@", "#", "%", "&", "*",
    "/", "\\", "$", "+", "<", "=", ">", "^", "`", "|", "~", "...", "--", "«", "»", "¿", "¡", "§", "¶",
    "€", "£", "©", "®", "™", "°", "±", "×", "÷", "→", "∑", "√", "∞", "♪", "⛄", "█",
    "😀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "❤️", "🇺🇳", "\U0001f9d1\U0001f3fb",
    "[CLS]", "[SEP]", "[UNK]", "[MASK]", "[PAD]", "[unused7]", "[cls]", "[ SEP ]", "[CLS][SEP]", "▁", "▁hello",
    "##ing", "http://example.com/a?b=c", "foo.bar()", "x_1", "a+b=c", "<html>", "user@mail.io",
]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.8:
            parts.append(rng.choice(PIECES))
        elif r < 0.9:
            parts.append(rng.choice(" \n\t"))
        else:  # any code point at all (no surrogates: the text must be valid UTF-8)
            cpt = rng.randrange(0x110000 - 0x800)
            parts.append(chr(cpt + 0x800 if cpt >= 0xD800 else cpt))
    return "".join(parts)


RANDOM_TEXTS = [random_text(random.Random(seed)) for seed in range(400)]


# ---------------------------------------------------------------- llama.cpp's side


def _write_bert_gguf(path: Path, meta: dict, **normalizer: bool) -> Path:
    """A vocabulary-only 'bert' GGUF with meta's tokens, types and special ids, and the
    tokenizer.ggml.normalizer.* keys given."""
    def kv(w):
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre(meta.get("tokenizer.ggml.pre", "default"))
        w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
        w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
        for key in ("bos", "unknown", "seperator", "padding", "cls", "mask"):
            if f"tokenizer.ggml.{key}_token_id" in meta:
                w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(meta[f"tokenizer.ggml.{key}_token_id"]))
        for name, value in normalizer.items():
            w.add_bool(f"tokenizer.ggml.normalizer.{name}", value)

    return write_vocab_gguf(path, "bert", kv)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bge_path(llama_vocab_dir) -> Path:
    return llama_vocab_dir / "ggml-vocab-bert-bge.gguf"


@pytest.fixture(scope="module")
def bge(bge_path) -> Tokenizer:
    return Tokenizer.from_metadata(read_gguf(bge_path).metadata)


@pytest.fixture(scope="module")
def bge_ref(llama_cpp, bge_path):
    return reference(llama_cpp, bge_path)


# ---------------------------------------------------------------- encoding


def test_llama_cpp_vectors(bge, bge_path):
    """llama.cpp's own test vectors (test-tokenizer-0: no special tokens added or parsed)."""
    cases = vectors(bge_path)
    assert len(cases) >= 40
    for text, ids in cases:
        assert bge.encode(text, add_special=False, parse_special=False) == ids, text


def test_random_text_matches_llama_cpp(llama_cpp, bge, bge_ref):
    for text in RANDOM_TEXTS:
        for add_special in (False, True):
            for parse_special in (False, True):
                ours = bge.encode(text, add_special=add_special, parse_special=parse_special)
                assert ours == ref_tokenize(llama_cpp, bge_ref, text, add_special, parse_special), (
                    text, add_special, parse_special)


@pytest.mark.parametrize("normalizer", [
    {"lowercase": False},  # strip_accents follows lowercase
    {"lowercase": True, "strip_accents": False},
    {"lowercase": False, "strip_accents": True},
])
def test_normalizer_options_match_llama_cpp(llama_cpp, bge_path, tmp_path, normalizer):
    """tokenizer.ggml.normalizer.lowercase / strip_accents, as llama.cpp's loader reads them."""
    path = _write_bert_gguf(tmp_path / "bert.gguf", read_gguf(bge_path).metadata, **normalizer)
    tok = Tokenizer.from_metadata(read_gguf(path).metadata)
    ref = reference(llama_cpp, path)
    model = tok._model
    assert (model.lowercase, model.strip_accents) == (normalizer["lowercase"],
                                                      normalizer.get("strip_accents", normalizer["lowercase"]))
    probe = "Crème Brûlée"
    assert tok.encode(probe) != Tokenizer.from_metadata(read_gguf(bge_path).metadata).encode(probe)
    for text in RANDOM_TEXTS[:150] + [text for text, _ in vectors(bge_path)]:
        assert tok.encode(text, add_special=False) == ref_tokenize(llama_cpp, ref, text, False, False), text


def test_greedy_match_details_match_llama_cpp(llama_cpp, tmp_path):
    """A made-up vocabulary where the greedy match's corners matter: a bare '▁' entry (the
    word's first piece may be just the prefix), entries of multi-byte characters (llama.cpp
    bounds its search in bytes, this module in code points), no piece for some characters (the
    whole word becomes [UNK]). (A duplicated text would make llama.cpp's loader abort.)"""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normal = ["▁", "a", "b", "ab", "abc", "▁a", "▁ab", "▁abcab", "bca", "c", "▁c", "中", "▁中", "文字", "中文字",
              "▁e", "e", "ss", "▁ß", "ß", "▁#", "#", "##", "▁,", "▁abc", "x" * 12, "▁" + "x" * 11, "▁éa"]
    meta = {"tokenizer.ggml.tokens": special + normal, "tokenizer.ggml.token_type": [3] * 5 + [1] * len(normal),
            "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.unknown_token_id": 1,
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.seperator_token_id": 3,
            "tokenizer.ggml.mask_token_id": 4}
    for normalizer in ({}, {"lowercase": False}):
        path = _write_bert_gguf(tmp_path / f"tiny{len(normalizer)}.gguf", meta, **normalizer)
        tok = Tokenizer.from_metadata(read_gguf(path).metadata)
        ref = reference(llama_cpp, path)
        rng = random.Random(3)
        alphabet = ["a", "b", "c", "ab", "abc", "A", "中", "文", "字", "é", "É", "e", "ß", "ss", "#", ",", "x" * 11,
                    "xxxxx", "\u0301", "▁", " ", "  ", "\n", "[SEP]", "[UNK]"]
        for _ in range(300):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            for add_special in (False, True):
                ours = tok.encode(text, add_special=add_special, parse_special=True)
                assert ours == ref_tokenize(llama_cpp, ref, text, add_special, True), text


def test_words_follow_llama_cpp_rules(bge):
    """llama.cpp's preprocessing quirks, spelled out."""
    words = bge._model.words
    assert words("Héllo,\u00a0WORLD!") == ["hello", ",", "world", "!"]
    assert words("한국") == ["\u1112\u1100"]  # a Hangul syllable keeps only its first jamo
    assert words("İΣ") == ["iσ"]  # simple lowercase: no combining dot, no final sigma
    assert words("a\x00b\u200dc\x1cd\ue000e\U000f0000f") == ["abcdef"]  # controls vanish in place
    assert words("a\U00011f43b\u0cf3c\U00013439d") == ["a", "\U00011f43", "bcd"]  # Unicode 15 classes
    assert words("x\u4e00y\U0002b820z\U0002b920") == ["x", "\u4e00", "y\U0002b820z", "\U0002b920"]
    assert words("a$b£c") == ["a", "$", "b£c"]  # only ASCII symbols stand alone
    assert words("\x1c \u3000\u2028") == []


# ---------------------------------------------------------------- decoding


def test_decode_matches_llama_cpp(llama_cpp, bge, bge_ref):
    rng = random.Random(7)
    sequences = [bge.encode(text, add_special=True) for text in RANDOM_TEXTS]
    sequences += [[rng.randrange(bge.vocab_size) for _ in range(rng.randint(1, 30))] for _ in range(200)]
    sequences.append(bge.encode("it 's don't , ' re ' ll I 'm . ? ! 've 'd 't ' x", add_special=False))
    for ids in sequences:
        for special in (False, True):
            assert bge.decode(ids, special) == ref_detokenize(llama_cpp, bge_ref, ids, special), (ids, special)


def test_token_to_piece_matches_llama_cpp(llama_cpp, bge, bge_ref):
    for tid in range(bge.vocab_size):
        for special in (False, True):
            assert bge.token_to_piece(tid, special) == ref_piece(llama_cpp, bge_ref, tid, special), tid


# ---------------------------------------------------------------- speed

