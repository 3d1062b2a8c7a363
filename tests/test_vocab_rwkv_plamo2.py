"""RWKV and PLaMo-2 vocabularies: ids, pieces and text identical to llama.cpp (llama-cpp-python).

No vocabulary file of either type ships with llama.cpp, so small ones are written here the way
its converter writes them (convert_hf_to_gguf: _set_vocab_rwkv_world, _set_vocab_plamo), from
frequent byte / character n-grams of a multilingual corpus, plus the oddities the loaders meet:
RWKV's escaped texts (\\n, \\t, \\\\, \\xHH, \\' and a few malformed escapes), control and padding
tokens in the trie; PLaMo-2's byte tokens, tied and rounded scores, [PADn] tokens scored -1000
(which llama.cpp's table takes for sentinels), unusable scores, a malformed byte token; and a
20k-token PLaMo-2 vocabulary of random overlapping strings with every kind of odd score.

token_to_piece and decode go through Tokenizer, which must hand these types' pieces to the
vocabulary's own piece(id, text, attr, special) (llama.cpp renders RWKV's every token unescaped
and PLaMo-2's unused tokens as text); test_model_piece checks piece() itself.
"""
from __future__ import annotations

import math
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers.vocab_gguf import ref_detokenize, ref_piece, write_vocab_gguf
from infer.engine.tokenizer import Tokenizer
from infer.models.gguf_file import read_gguf

pytestmark = pytest.mark.reference

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF token_type

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they'd said: we're here, you've seen.",
    "def f(x):\n    if x:\n\treturn x * 2  # tab\n    return None\n\n",
    "for (int i = 0; i < n; ++i) {\n        sum += a[i];\n}\n",
    "path\\to\\file and a \"quoted\" 'string' with \\n escapes \\x41 and \\\\ backslashes",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストです。カタカナとひらがな、漢字。東京都は日本の首都です。",
    "Привет, мир! Как дела? Спасибо, до свидания.",
    "Mixed: naïve café résumé Ångström ß ﬁ — “curly” quotes… and € £ ¥",
    "Numbers 1234567890 3.14159 -42 1,000,000 and 0x1F; see https://example.com/a?b=c.",
    "whitespace runs:      six, \t\t two tabs,\u00a0nbsp,\u3000ideographic\r\n\r\n",
    "emoji 😀👍🏽 and more text after the emoji, then the end.\n\n",
]


def _ngrams(units, lo: int, hi: int) -> Counter:
    counts: Counter = Counter()
    for n in range(lo, hi + 1):
        for i in range(len(units) - n + 1):
            counts[units[i:i + n]] += 1
    return counts


# ---------------------------------------------------------------- writing the vocabularies


def _rwkv_escape(data: bytes) -> str:
    return repr(data)[2:-1]  # as _set_vocab_rwkv_world: b'\xff' -> "\xff"


def rwkv_vocab(drop_high: bool) -> tuple[list[str], list[int]]:
    """'<s>', the 256 single bytes, frequent byte n-grams (partial UTF-8 included), odd escapes,
    padding; drop_high leaves out every token starting with a byte >= 0xF0 (4-byte sequences)
    so that those bytes become the unknown token."""
    data = "".join(CORPUS).encode("utf-8")
    grams = [g for g, c in _ngrams(data, 2, 10).most_common() if c >= 2][:500]
    pieces = [bytes([b]) for b in range(256)] + grams
    pieces += [b"\n\n", b"\t\t", b"    ", b"\\n", b"\\\\", b"it's", b"'\"", b"\x00\x00", b"\xe4\xbd"]
    pieces = [p for p in dict.fromkeys(pieces) if not (drop_high and p[0] >= 0xF0)]
    tokens, types = ["<s>"], [CONTROL]
    for p in pieces:
        tokens.append(_rwkv_escape(p))
        types.append(NORMAL)
    odd = [  # texts the converter never writes but llama_unescape_rwkv_token still reads
        ("q\\xAB", NORMAL),  # upper-case hex digits: garbage byte '"'
        ("\\x41\\x42", NORMAL),  # unescapes to 'AB', a later id for the same bytes
        ("zz\\", NORMAL),  # trailing lone backslash dropped
        ("\\q\\x4", NORMAL),  # unknown escape and cut-off hex
        ("<|endoftext|>", CONTROL),
        ("<|sep\\t|>", USER_DEFINED),  # split out by its escaped text, rendered unescaped
        ("<0x0A>", BYTE),
        ("\\tabc\\n", 0),  # an undefined type: still its unescaped text
    ]
    for text, kind in odd:
        if text not in tokens:
            tokens.append(text)
            types.append(kind)
    if drop_high:
        tokens.append("<unk>")
        types.append(UNKNOWN)
    for i in range(len(tokens), len(tokens) + 5):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
    return tokens, types


def plamo2_vocab() -> tuple[list[str], list[float], list[int]]:
    """PLaMo-2's layout: unk/bos/eos/pad/op control tokens, <0x00>..<0xFF>, character n-grams
    scored by log frequency (some rounded to 0.1 for ties, some near or exactly on a half 1e-4
    rounding step),
    [PADn] padding scored -1000 as the converter pads."""
    tokens = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<|plamo:op|>"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    scores = [0.0] * 5
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(BYTE)
        scores.append(0.0)
    text = "".join(CORPUS)
    counts = _ngrams(text, 1, 6)
    total = sum(counts.values())
    for i, (g, c) in enumerate(counts.most_common()):
        if c < 3 or len(tokens) > 1500:
            break
        if g in tokens:
            continue
        score = math.log(c / total) - 0.3 * len(g)
        if i % 5 == 0:
            score = round(score, 1)
        elif i % 7 == 0:
            score = round(score, 4) - 0.00005
        elif i % 11 == 0:  # an odd multiple of 1/32: score * 1e4 ends in exactly .5
            score = math.floor(score * 16) / 16 + 1 / 32
        tokens.append(g)
        types.append(NORMAL)
        scores.append(score)
    extra = [
        ("</s>", NORMAL, -9.0),  # a normal token in PLaMo (its EOS is <|plamo:eos|>)
        ("<tool>", USER_DEFINED, -5.0),
        ("zzz", NORMAL, -2500.0),  # below llama.cpp's invalid score: never used
        ("qq", NORMAL, float("nan")),
        ("xq", NORMAL, -1000.0),  # scores exactly the sentinel
        ("<0xZZ>", BYTE, 0.0),  # malformed byte token: skipped, rendered as text
        ("<0x0a>", BYTE, 0.0),  # a second '\n' byte token: the later id wins
        ("\ufeffab", NORMAL, -3.0),
        ("[P", NORMAL, -4.0),
        ("ᚠ", NORMAL, -1 / 32),  # -312.5 units: llama.cpp rounds half away from zero, to -313,
        ("ᚢ", NORMAL, -1 / 32),  # so 'ᚠᚢ' (-625) beats 'ᚠ' + 'ᚢ' (-626); half to even would
        ("ᚠᚢ", NORMAL, -1 / 16),  # give -624 and split it
    ]
    for t, kind, s in extra:
        assert t not in tokens
        tokens.append(t)
        types.append(kind)
        scores.append(s)
    for i in range(1, 6):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
        scores.append(-1000.0)
    return tokens, scores, types


def plamo2_random_vocab(size: int = 20000) -> tuple[list[str], list[float], list[int]]:
    """Random strings over a small alphabet (so that tokens overlap and share suffixes), with
    scores of every kind the table treats specially: -1000, NaN, -3000, ties, 1e-5 steps."""
    rng = random.Random(11)
    alphabet = list("abcdefgh ._\n") + list("あいうえおかきく") + list("日本語文字")
    tokens = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<|plamo:op|>"]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    seen = set(tokens)
    while len(tokens) < size:
        t = "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 2, 3, 3, 4, 5, 6, 8, 12])))
        if t in seen:
            continue
        seen.add(t)
        r = rng.random()
        tokens.append(t)
        types.append(UNUSED if r < 0.02 else NORMAL)
        scores.append(-1000.0 if r < 0.03 else math.nan if r < 0.04 else -3000.0 if r < 0.05
                      else round(-rng.random() * 15, 1 if r < 0.5 else 5))
    return tokens, scores, types


def _pair(llama_cpp, path: Path):
    tok = Tokenizer.from_metadata(read_gguf(path).metadata)
    return tok, llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def rwkv(llama_cpp, tmp_path_factory):
    tokens, types = rwkv_vocab(drop_high=False)
    eot = tokens.index("\\n\\n")

    def kv(w):
        w.add_tokenizer_model("rwkv")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
        w.add_eot_token_id(eot)

    return _pair(llama_cpp, write_vocab_gguf(tmp_path_factory.mktemp("rwkv") / "rwkv.gguf", "rwkv6", kv))


@pytest.fixture(scope="module")
def rwkv_unk(llama_cpp, tmp_path_factory):
    tokens, types = rwkv_vocab(drop_high=True)

    def kv(w):
        w.add_tokenizer_model("rwkv")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_unk_token_id(tokens.index("<unk>"))

    return _pair(llama_cpp, write_vocab_gguf(tmp_path_factory.mktemp("rwkv") / "rwkv-unk.gguf", "rwkv7", kv))


@pytest.fixture(scope="module")
def plamo2(llama_cpp, tmp_path_factory):
    tokens, scores, types = plamo2_vocab()

    def kv(w):
        w.add_tokenizer_model("plamo2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(3)
        w.add_eot_token_id(4)

    return _pair(llama_cpp, write_vocab_gguf(tmp_path_factory.mktemp("plamo2") / "plamo2.gguf", "plamo2", kv))


@pytest.fixture(scope="module")
def plamo2_random(llama_cpp, tmp_path_factory):
    tokens, scores, types = plamo2_random_vocab()

    def kv(w):
        w.add_tokenizer_model("plamo2")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)

    path = tmp_path_factory.mktemp("plamo2") / "plamo2-random.gguf"
    return _pair(llama_cpp, write_vocab_gguf(path, "plamo2", kv))


VOCABS = ["rwkv", "rwkv_unk", "plamo2", "plamo2_random"]


@pytest.fixture(params=VOCABS)
def pair(request):
    return request.getfixturevalue(request.param)


# ---------------------------------------------------------------- llama.cpp through ctypes


# ---------------------------------------------------------------- random text


def _random_texts(tok: Tokenizer, seed: int, count: int) -> list[str]:
    """Corpus slices, runs of token texts and awkward pieces, and random code points (bytes the
    vocabulary lacks, controls, CJK, emoji, BOMs, text that looks like special tokens)."""
    rng = random.Random(seed)
    corpus = "".join(CORPUS)
    texts = [tok.token_text(i) for i in range(tok.vocab_size)]
    pieces = list("abcXYZ  \n\t\r'\"\\.,!?<>/_-0123[]|") + [
        "é", "ß", "你", "😀", "👍🏽", "\u200d", "\u00a0", "\u3000", "\ufeff", "\x00", "\x7f", "\U0010fffd",
        "<s>", "</s>", "<|endoftext|>", "<|sep\\t|>", "<|plamo:bos|>", "<|plamo:eos|>", "<tool>", "<unk>",
        "[PAD1]", "[PAD", "ᚠᚢ", "<0x0A>", "\\n", "\\x41", "q\"", "AB", "zzz", "qq", "xq", "    ", "\n\n",
    ]
    ranges = [(0x20, 0x7F), (0x00, 0x20), (0x80, 0x800), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0x1F300, 0x1FAFF), (0xE000, 0xF8FF), (0x10000, 0x10FFFF)]
    out = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            at = rng.randrange(len(corpus))
            text = corpus[at:at + rng.randint(0, 80)]
        elif kind == 1:
            text = "".join(rng.choice(texts) if rng.random() < 0.5 else rng.choice(pieces)
                           for _ in range(rng.randint(0, 20)))
        elif kind == 2:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        else:
            chars = []
            for _ in range(rng.randint(0, 30)):
                lo, hi = rng.choice(ranges)
                c = rng.randrange(lo, hi)
                chars.append(chr(c) if not 0xD800 <= c < 0xE000 else "?")
            text = "".join(chars)
        if rng.random() < 0.1:
            text = "\ufeff" + text
        out.append(text)
    return out


# ---------------------------------------------------------------- tests


def test_special_ids_match_llama_cpp(llama_cpp, pair):
    tok, ref = pair
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    assert tok.vocab_size == llama_cpp.llama_vocab_n_tokens(vocab)
    pairs = ((tok.bos_id, llama_cpp.llama_vocab_bos), (tok.eos_id, llama_cpp.llama_vocab_eos),
             (tok.eot_id, llama_cpp.llama_vocab_eot), (tok.pad_id, llama_cpp.llama_vocab_pad))
    for ours, theirs in pairs:
        assert (-1 if ours is None else ours) == theirs(vocab)
    eog = {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert tok.eog_ids == eog


def test_encode_random_text_matches_llama_cpp(pair):
    tok, ref = pair
    n = 0
    for text in _random_texts(tok, 1, 300):
        for add_special in (True, False):
            for parse_special in (True, False):
                ours = tok.encode(text, add_special, parse_special)
                assert ours == ref.tokenize(text.encode(), add_bos=add_special, special=parse_special), (
                    text, add_special, parse_special)
                n += 1
    assert n == 1200


def test_encode_corpus_matches_llama_cpp(pair):
    tok, ref = pair
    for text in CORPUS + ["", "\ufeff", "\ufeff\ufeff", "<s>", "<|plamo:bos|>\ufeffab", "[PAD1][PAD2]x"]:
        for parse_special in (True, False):
            assert tok.encode(text, False, parse_special) == ref.tokenize(text.encode(), add_bos=False,
                                                                          special=parse_special), text


def test_model_piece_matches_llama_cpp(llama_cpp, pair):
    """The vocabulary's own piece(), for every id: what the Tokenizer must use for these types."""
    tok, ref = pair
    model = tok._model
    for tid in range(tok.vocab_size):
        attr = int(tok._attrs[tid])
        for special in (False, True):
            assert model.piece(tid, tok.token_text(tid), attr, special) == ref_piece(llama_cpp, ref, tid, special), (
                tid, tok.token_text(tid), special)


def test_token_to_piece_matches_llama_cpp(llama_cpp, pair):
    tok, ref = pair
    for tid in range(tok.vocab_size):
        for special in (False, True):
            assert tok.token_to_piece(tid, special) == ref_piece(llama_cpp, ref, tid, special), (
                tid, tok.token_text(tid), special)


def test_decode_matches_llama_cpp(llama_cpp, pair):
    tok, ref = pair
    rng = random.Random(5)
    seqs = [tok.encode(t, True, True) for t in _random_texts(tok, 2, 100)]
    seqs += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 20))] for _ in range(200)]
    for ids in seqs:
        for special in (False, True):
            assert tok.decode(ids, special) == ref_detokenize(llama_cpp, ref, ids, special), (ids, special)


def test_speed_against_llama_cpp(pair):
    """~200 KB of text through both; prints the times (no assertion on them)."""
    tok, ref = pair
    rng = random.Random(3)
    parts, size = [], 0
    while size < 200_000:
        part = rng.choice(CORPUS) if rng.random() < 0.8 else "".join(_random_texts(tok, rng.randrange(99), 4))
        parts.append(part)
        size += len(part.encode())
    text = "".join(parts)
    t0 = time.perf_counter()
    ours = tok.encode(text, False, False)
    t1 = time.perf_counter()
    theirs = ref.tokenize(text.encode(), add_bos=False, special=False)
    t2 = time.perf_counter()
    assert ours == theirs
    print(f"\n[{tok.model_type}] {len(text.encode()) / 1e3:.0f} KB -> {len(ours)} tokens: "
          f"infer {t1 - t0:.3f} s, llama.cpp {t2 - t1:.3f} s ({(t1 - t0) / max(t2 - t1, 1e-9):.1f}x)")
