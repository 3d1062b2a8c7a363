"""Tokenizer: ids, pieces and text identical to llama.cpp (via llama-cpp-python)."""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.vocab_gguf import (
    ref_detokenize,
    ref_eog,
    ref_piece,
    reference,
    train_byte_bpe,
    write_byte_bpe_gguf,
    write_vocab_gguf,
)
from infer.engine.detokenizer import clean_up_spaces
from infer.engine.tokenizer import Tokenizer, TokenizerError
from infer.models.gguf_file import read_gguf

PROMPTS = [
    "",
    " ",
    "   ",
    "\n",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing spaces   ",
    "multiple\n\nnewlines\n\n\n\nhere\n",
    "\n" * 38 + "forty",
    "def f(x):\n    if x:\n\treturn x * 2  # tab\n    return None\n",
    "for (int i = 0; i < n; ++i) {\n        sum += a[i];\n}\n",
    "\t\tindented with tabs\n\t\t\tdeeper",
    "你好，世界！今天天气很好。",
    "日本語のテキストです。カタカナとひらがな、漢字。",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "ελληνικά και עברית και ไทย และ 한국어",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 done",
    "😀" * 5 + "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "whitespace runs:      six, \t\t two tabs,\u00a0nbsp,\u3000ideographic",
    "numbers 1234567890 3.14159 -42 1,000,000 and 0x1F",
    "URL https://example.com/path?query=1&b=two#frag and mail a.b@c.io",
    "text with <start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn><start_of_turn>",
    "<bos>literal bos and <eos> and <pad> and <unused5>",
    "html <b>bold</b> <table><tr><td>x</td></tr></table> </s> <s>",
    "chat <|im_start|>user\nhi<|im_end|>\n<|endoftext|> [[sep]] x",
    "I'm sure they'll say it's fine, won't they? 'quoted' ' lone , . ! ?",
    "Mixed: naïve café résumé Ångström ß ﬁ",
    "a\r\nwindows\r\nline endings\r\n",
    "zero\u200bwidth\ufeffBOM\u2028sep and a NUL \x00 byte",
    "Special chars: ~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
    "Unicode 16 letters a\U00013460\U00013461 b\u1c89x 7\U00016130",
]

# Text for the small BPE vocabulary: every script and symbol class above shows up.
BPE_CORPUS = PROMPTS + [
    "It's what they'd said: we're here, you've seen, I'll go, he'd gone, she's right.",
    "In 2024, 37 of 1,024 files (3.6%) changed; see https://example.org/a/b?c=d.",
    "class Model:\n    def forward(self, x):\n        return self.proj(x) + 1\n",
    "if (a <= b && c != d) { return a ^ b | ~c; } // $cost = 5 + 3 * 2",
    "Numbers: 0 12 345 6789 101112 and ٣٤٥ and ½ and Ⅻ and １２３",
    "Спасибо, до свидания. Это тест. 谢谢，再见。これはテストです。",
    "tabs\tand\tspaces  mixed \t \n\n  \r\n end   ",
    "a\U00013460b a\U00013460\U00013461 \u1c89\u1c8ax \U00016130\U00016131 9\U00016130",
    "emoji 😀😃😄 👍🏻👍🏿 🇺🇳 and symbols € £ ¥ © ® ™ ° ± × ÷",
]


def _bpe_corpus() -> list[str]:
    rng = random.Random(0)
    lines = list(BPE_CORPUS) * 20
    words = " ".join(BPE_CORPUS).split()
    lines += [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    return lines


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gemma_meta(gemma_path):
    return read_gguf(gemma_path).metadata


@pytest.fixture(scope="module")
def gemma(gemma_meta):
    return Tokenizer.from_metadata(gemma_meta)


@pytest.fixture(scope="module")
def gemma_ref(llama_cpp, gemma_path):
    return reference(llama_cpp, gemma_path)


@pytest.fixture(scope="session")
def trained_bpe():
    """Tokens, types and merges of a ~1000-token byte-level BPE trained on BPE_CORPUS."""
    return train_byte_bpe(_bpe_corpus())


@pytest.fixture(scope="session")
def bpe_gguf(tmp_path_factory, trained_bpe):
    """make(pre) -> path of a gpt2-vocabulary GGUF with that tokenizer.ggml.pre."""
    made: dict[str, Path] = {}

    def explicit(w):  # exercise the explicit keys too
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)

    def make(pre: str) -> Path:
        if pre not in made:
            path = tmp_path_factory.mktemp("bpe") / f"bpe-{pre}.gguf"
            made[pre] = write_byte_bpe_gguf(path, trained_bpe, pre, explicit if pre == "gpt-2" else None)
        return made[pre]

    return make


# ---------------------------------------------------------------- Gemma (SentencePiece)

FLAGS = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("text", PROMPTS)
def test_gemma_encode_matches_llama_cpp(gemma, gemma_ref, text):
    for add_special, parse_special in FLAGS:
        ours = gemma.encode(text, add_special=add_special, parse_special=parse_special)
        ref = gemma_ref.tokenize(text.encode(), add_bos=add_special, special=parse_special)
        assert ours == ref, (text, add_special, parse_special)


@pytest.mark.parametrize("text", PROMPTS)
def test_gemma_decode_matches_llama_cpp(llama_cpp, gemma, gemma_ref, text):
    for add_special, parse_special in FLAGS:
        ids = gemma.encode(text, add_special, parse_special)
        for special in (False, True):
            ref = ref_detokenize(llama_cpp, gemma_ref, ids, special)
            assert gemma.decode(ids, special=special) == ref
    ids = gemma.encode(text, add_special=False)
    if ref_detokenize(llama_cpp, gemma_ref, ids, False) == text:
        assert gemma.decode(ids) == text


def test_gemma_special_tokens(llama_cpp, gemma, gemma_ref):
    vocab = llama_cpp.llama_model_get_vocab(gemma_ref.model)
    assert gemma.vocab_size == 262144 == llama_cpp.llama_vocab_n_tokens(vocab)
    assert (gemma.bos_id, gemma.eos_id, gemma.eot_id) == (2, 1, 106)
    assert gemma.eot_id == llama_cpp.llama_vocab_eot(vocab)
    assert gemma.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab) is True
    assert gemma.add_eos == llama_cpp.llama_vocab_get_add_eos(vocab) is False
    # <eos>, <end_of_turn> and the user-defined '</s>' that llama.cpp's loader promotes.
    assert gemma.eog_ids == ref_eog(llama_cpp, gemma_ref, gemma.vocab_size) == {1, 106, 212}
    assert gemma.token_text(106) == "<end_of_turn>"


def test_gemma_token_to_piece_matches_llama_cpp(llama_cpp, gemma, gemma_ref, gemma_meta):
    types = gemma_meta["tokenizer.ggml.token_type"]
    sample = set(range(0, gemma.vocab_size, 613)) | set(range(0, 400))
    for t in (2, 3, 4, 5, 6):  # a few of every non-normal type
        sample |= set(np.nonzero(types == t)[0][:20].tolist())
    for tid in sorted(sample):
        for special in (False, True):
            assert gemma.token_to_piece(tid, special) == ref_piece(llama_cpp, gemma_ref, tid, special), tid


def test_gemma_random_text_matches_llama_cpp(gemma, gemma_ref):
    rng = random.Random(1234)
    alphabet = list("abcXYZ  \n\t'\".,!?<>/_-0123\r") + [
        "é", "ß", "你", "😀", "👍🏽", "\u200d", "\u00a0", "▁", "<start_of_turn>", "</s>", "<b>", "\n\n", "    ",
    ]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        add, parse = rng.random() < 0.5, rng.random() < 0.5
        assert gemma.encode(text, add, parse) == gemma_ref.tokenize(text.encode(), add_bos=add, special=parse), text


@pytest.fixture(scope="module")
def spm_prefix_gguf(tmp_path_factory, gemma_meta):
    """Gemma's vocabulary with add_space_prefix and add_eos_token switched on."""
    def kv(w):
        w.add_tokenizer_model("llama")
        w.add_token_list(gemma_meta["tokenizer.ggml.tokens"])
        w.add_token_scores(gemma_meta["tokenizer.ggml.scores"].tolist())
        w.add_token_types(gemma_meta["tokenizer.ggml.token_type"].tolist())
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_add_space_prefix(True)
        w.add_add_eos_token(True)

    return write_vocab_gguf(tmp_path_factory.mktemp("spm") / "spm-prefix.gguf", "llama", kv)


def test_spm_space_prefix_matches_llama_cpp(llama_cpp, spm_prefix_gguf):
    tok = Tokenizer.from_metadata(read_gguf(spm_prefix_gguf).metadata)
    ref = reference(llama_cpp, spm_prefix_gguf)
    assert tok.add_space_prefix and tok.add_eos
    for text in PROMPTS:
        for add_special, parse_special in FLAGS:
            ids = tok.encode(text, add_special, parse_special)
            assert ids == ref.tokenize(text.encode(), add_bos=add_special, special=parse_special), text
            for special in (False, True):
                assert tok.decode(ids, special) == ref_detokenize(llama_cpp, ref, ids, special)


# ---------------------------------------------------------------- gpt2 byte-level BPE

PRE_TYPES = ["default", "llama-bpe", "qwen2", "gpt-2", "gpt-4o"]


@pytest.fixture(scope="module")
def bpe_pair(llama_cpp, bpe_gguf):
    cache = {}

    def get(pre: str):
        if pre not in cache:
            path = bpe_gguf(pre)
            cache[pre] = (Tokenizer.from_metadata(read_gguf(path).metadata), reference(llama_cpp, path))
        return cache[pre]

    return get


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_bpe_encode_matches_llama_cpp(bpe_pair, pre):
    tok, ref = bpe_pair(pre)
    assert tok.vocab_size > 900
    for text in PROMPTS + BPE_CORPUS:
        for add_special, parse_special in FLAGS:
            ours = tok.encode(text, add_special, parse_special)
            assert ours == ref.tokenize(text.encode(), add_bos=add_special, special=parse_special), (
                text, add_special, parse_special)


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_bpe_random_text_matches_llama_cpp(bpe_pair, pre):
    tok, ref = bpe_pair(pre)
    rng = random.Random(99)
    pieces = list("abcXYZ  \n\t'\".,!?<>/_-0123$+|~^=`\r") + [
        "'s", "'LL", "é", "ß", "你", "😀", "👍🏽", "\u200d", "\u00a0", "\u3000", "\x85", "٣", "½", "€", "\u0301",
        "\U00013460", "\u1c89", "\U00016130", "<|im_end|>", "[[sep]]", "    ", "\n\n",
    ]
    corpus = "".join(BPE_CORPUS)
    for i in range(400):
        if i % 2:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        else:
            at = rng.randrange(len(corpus))
            text = corpus[at:at + rng.randint(0, 60)]
        add, parse = rng.random() < 0.5, rng.random() < 0.5
        assert tok.encode(text, add, parse) == ref.tokenize(text.encode(), add_bos=add, special=parse), text


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_bpe_decode_matches_llama_cpp(llama_cpp, bpe_pair, pre):
    tok, ref = bpe_pair(pre)
    for text in PROMPTS:
        ids = tok.encode(text, add_special=True, parse_special=True)
        for special in (False, True):
            assert tok.decode(ids, special) == ref_detokenize(llama_cpp, ref, ids, special), text
    rng = random.Random(5)  # arbitrary id sequences exercise the clean-up passes
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
        assert tok.decode(ids, True) == ref_detokenize(llama_cpp, ref, ids, True), ids


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_bpe_special_tokens_match_llama_cpp(llama_cpp, bpe_pair, pre):
    tok, ref = bpe_pair(pre)
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(vocab)
    assert (tok.bos_id, tok.eos_id) == (0, 2)
    assert tok.eot_id == llama_cpp.llama_vocab_eot(vocab) == tok.token_id("<|im_end|>")
    assert tok.eog_ids == ref_eog(llama_cpp, ref, tok.vocab_size) == {0, 2}
    for tid in range(tok.vocab_size):
        for special in (False, True):
            assert tok.token_to_piece(tid, special) == ref_piece(llama_cpp, ref, tid, special), tid


def test_bpe_pre_type_defaults(bpe_pair):
    assert bpe_pair("llama-bpe")[0].add_bos  # llama.cpp's default for llama3 vocabularies
    assert not bpe_pair("qwen2")[0].add_bos
    assert bpe_pair("default")[0].clean_spaces and not bpe_pair("qwen2")[0].clean_spaces


# ---------------------------------------------------------------- incremental detokenizer


def test_detokenizer_streams_complete_characters(gemma):
    text = "Emoji 😀👍🏽👨‍👩‍👧‍👦 中文字符 日本語 𝔘𝔫𝔦 \U00013460 ꙮ done"
    for special in (False, True):
        ids = gemma.encode(text, add_special=True)
        stream = gemma.detokenizer(special)
        parts = [stream.add(i) for i in ids] + [stream.flush()]
        assert all("\ufffd" not in p for p in parts)
        assert "".join(parts) == gemma.decode(ids, special)
    assert gemma.decode(gemma.encode(text, add_special=False)) == text


def test_detokenizer_holds_byte_fallback_until_complete(gemma):
    ids = gemma.encode("\U00013460", add_special=False)
    assert [gemma.token_text(i) for i in ids] == ["<0xF0>", "<0x93>", "<0x91>", "<0xA0>"]
    stream = gemma.detokenizer()
    assert [stream.add(i) for i in ids] == ["", "", "", "\U00013460"]
    assert stream.flush() == ""
    stream.add(ids[0])
    assert stream.flush() == "\ufffd"  # a cut-off character is replaced at the end


@pytest.mark.parametrize("pre", ["default", "qwen2"])
def test_detokenizer_matches_decode_with_space_clean_up(bpe_pair, pre):
    tok, _ = bpe_pair(pre)
    rng = random.Random(7)
    pool = [" ", "'", "s", "m", "re", "ve", "t", ".", ",", "?", "!", "a", "你", "😀", "\n", "' ", " '"]
    for i in range(300):
        if i % 2:
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
        else:
            ids = tok.encode("".join(rng.choice(pool) for _ in range(rng.randint(0, 15))), False)
        stream = tok.detokenizer(special=True)
        parts = [stream.add(t) for t in ids] + [stream.flush()]
        assert "".join(parts) == tok.decode(ids, special=True), ids


def test_clean_up_spaces_rules():
    assert clean_up_spaces(b"Hi , there . ok ! why ?") == b"Hi, there. ok! why?"
    assert clean_up_spaces(b"it ' s") == b"it's"
    assert clean_up_spaces(b"he 's I 'm we 're you 've") == b"he's I'm we're you've"
    assert clean_up_spaces(b"don 't I 'd we 'll") == b"don 't I 'd we 'll"
    assert clean_up_spaces(b"") == b""


# ---------------------------------------------------------------- errors and speed


def test_unknown_model_is_rejected(gemma_meta):
    meta = dict(gemma_meta, **{"tokenizer.ggml.model": "no-such-model"})
    with pytest.raises(TokenizerError, match=r"'no-such-model'.*llama.*gpt2.*bert.*t5.*rwkv"):
        Tokenizer.from_metadata(meta)


def test_unknown_pre_is_rejected(trained_bpe):
    tokens, types, merges = trained_bpe
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
    }
    with pytest.raises(TokenizerError, match=r"'no-such-pre'.*default.*llama-bpe.*qwen2"):
        Tokenizer.from_metadata(meta)


def test_bad_inputs_are_rejected(gemma):
    with pytest.raises(TokenizerError, match="out of range"):
        gemma.decode([gemma.vocab_size])
    with pytest.raises(TokenizerError, match="out of range"):
        gemma.token_to_piece(-1)
    with pytest.raises(TokenizerError, match="str"):
        gemma.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match="not valid Unicode"):
        gemma.encode("lone \ud800 surrogate")
    with pytest.raises(TokenizerError, match="no tokenizer.ggml.tokens"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama"})


def _best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_speed(gemma, gemma_meta):
    build = _best_of(3, lambda: Tokenizer.from_metadata(gemma_meta))
    text = ("".join(PROMPTS) * 4)[:4000]
    encode = _best_of(3, lambda: gemma.encode(text, parse_special=True))
    print(f"\nTokenizer.from_metadata (262k vocab): {build * 1e3:.1f} ms; encode 4000 chars: {encode * 1e3:.1f} ms")
    assert build < 0.5
    assert encode < 0.1


def test_hf_tokenizer_larger_than_the_embedding_is_refused():
    """A model folder whose tokenizer.json has ids past the embedding's rows: those ids would index
    outside it (MLX's take checks nothing), so the folder is refused at load."""
    from tokenizers import Tokenizer as Core
    from tokenizers import models

    from infer.engine.hf_tokenizer import HFTokenizer as Ours

    core = Core(models.WordLevel({f"w{i}": i for i in range(40)}, unk_token="w0"))
    with pytest.raises(TokenizerError, match="40 tokens but the model's embedding only 32 rows"):
        Ours(core.to_str(), n_vocab=32)
    assert Ours(core.to_str(), n_vocab=48).vocab_size == 48  # padding rows past the tokenizer are fine


def test_gemma_long_text_matches_llama_cpp(gemma, gemma_ref):
    """Long enough to be encoded in parts; Gemma's vocabulary has a token with '▁' inside ('>▁</'),
    so no cut falls after a '>'."""
    import llama_cpp

    from helpers.vocab_gguf import ref_tokenize

    text = ("<html>\n<body> </body> x >  y >▁</b " + " ".join(PROMPTS) + "\n") * 400
    assert gemma.encode(text, False, False) == ref_tokenize(llama_cpp, gemma_ref, text, False, False)
