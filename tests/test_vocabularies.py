"""Every vocabulary llama.cpp reads, against llama.cpp: its own test files (models/ggml-vocab-*.gguf
and their vectors, tests/helpers/llama_vocab.py) and every pre-tokenizer name it knows, on a small trained
BPE vocabulary written with each name."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from helpers.llama_vocab import vectors
from helpers.vocab_gguf import random_texts, ref_detokenize, ref_piece, reference, train_byte_bpe, write_byte_bpe_gguf
from infer.engine.pretokenizers import PRE_TOKENIZERS
from infer.engine.tokenizer import Tokenizer
from infer.models.gguf_file import read_gguf

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.reference

# the files llama.cpp keeps beside its tokenizer tests (the vendored llama.cpp of llama-cpp-python)
VOCABS = ["aquila", "baichuan", "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
          "gpt-2", "gpt-neox", "llama-bpe", "llama-spm", "mpt", "nomic-bert-moe", "phi-3", "qwen2", "qwen35",
          "refact", "starcoder"]


@pytest.fixture(scope="module")
def vocab(llama_vocab_dir):
    made = {}

    def get(name: str):
        if name not in made:
            path = llama_vocab_dir / f"ggml-vocab-{name}.gguf"
            made[name] = (path, Tokenizer.from_metadata(read_gguf(path).metadata), reference(llama_cpp, path))
        return made[name]

    return get


def test_every_file_is_tested(llama_vocab_dir):
    assert sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in llama_vocab_dir.glob("ggml-vocab-*.gguf")) == VOCABS


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vectors(vocab, name):
    """test-tokenizer-0's protocol: no BOS, no special parsing; every text's ids as llama.cpp's file has them."""
    path, tok, _ = vocab(name)
    cases = vectors(path)
    for text, ids in cases:
        assert tok.encode(text, add_special=False, parse_special=False) == ids, text
    print(f"{name}: {len(cases)} vectors")


def _special_texts(tok: Tokenizer) -> list[str]:
    """Texts the vocabulary's control and user-defined tokens are, cut short, and glued to words."""
    specials = [tok.token_text(i) for i in range(tok.vocab_size) if tok.is_control(i) or tok.is_user_defined(i)][:60]
    return specials + [s[:-1] for s in specials[:20] if len(s) > 2] + [" " + s + " " for s in specials[:10]]


@pytest.mark.parametrize("name", VOCABS)
def test_random_text_matches_llama_cpp(vocab, name):
    """Random text (every script and kind of whitespace, marks, emoji, digits, text that is or looks like
    a special token), with and without BOS and special parsing: the same ids as llama.cpp, and the
    ids decoded to llama.cpp's text (special tokens spelled out or not)."""
    _, tok, ref = vocab(name)
    texts = random_texts(zlib.crc32(name.encode()) % 1000, 150, _special_texts(tok))
    bpe = tok._model if hasattr(tok._model, "numba_from") else None  # byte-level BPE: both its paths
    for i, text in enumerate(texts):
        add, parse = bool(i & 1), bool(i & 2)
        ids = tok.encode(text, add, parse)
        assert ids == ref.tokenize(text.encode(), add_bos=add, special=parse), (text, add, parse)
        if bpe is not None:
            bpe.numba_from = 0  # the regexes in numba however short the text
            try:
                assert tok.encode(text, add, parse) == ids, (text, add, parse)
            finally:
                del bpe.numba_from
        for special in (False, True):
            assert tok.decode(ids, special) == ref_detokenize(llama_cpp, ref, ids, special), (text, special)


@pytest.mark.parametrize("name", ["falcon", "starcoder"])
def test_a_byte_the_vocabulary_lacks_parts_its_neighbours(vocab, name):
    """Falcon has no token for control bytes such as \\x0b, StarCoder none for 0xF1 (a 4-byte
    UTF-8 lead): llama.cpp keeps such a byte in its word, where no merge crosses it, and emits
    nothing for it ("  " around it stays two spaces, not the merged "  " token)."""
    _, tok, ref = vocab(name)
    for text in [" \x0b ", "a \x0b\x0b b", "x\x03y", " \U00040000 ", "\U00040000\U00040000"]:
        assert tok.encode(text, False, False) == ref.tokenize(text.encode(), add_bos=False, special=False), text
        bpe = tok._model
        bpe.numba_from = 0
        try:
            assert tok.encode(text, False, False) == ref.tokenize(text.encode(), add_bos=False, special=False), text
        finally:
            del bpe.numba_from


@pytest.mark.parametrize("name", VOCABS)
def test_pieces_and_flags_match_llama_cpp(vocab, name):
    """token_to_piece of a spread of ids (every non-normal one among them), BOS/EOS/SEP flags and ids."""
    _, tok, ref = vocab(name)
    lv = llama_cpp.llama_model_get_vocab(ref.model)
    assert tok.vocab_size == llama_cpp.llama_vocab_n_tokens(lv)
    assert (tok.add_bos, tok.add_eos) == (llama_cpp.llama_vocab_get_add_bos(lv), llama_cpp.llama_vocab_get_add_eos(lv))
    for ours, theirs in ((tok.bos_id, llama_cpp.llama_vocab_bos(lv)), (tok.eos_id, llama_cpp.llama_vocab_eos(lv))):
        assert (ours if ours is not None else -1) == theirs
    rng = np.random.default_rng(0)
    ids = set(rng.integers(0, tok.vocab_size, 2000).tolist()) | set(range(min(300, tok.vocab_size)))
    ids |= {i for i in range(tok.vocab_size) if tok.is_control(i) or tok.is_user_defined(i)}
    for tid in sorted(ids):
        for special in (False, True):
            assert tok.token_to_piece(tid, special) == ref_piece(llama_cpp, ref, tid, special), (tid, special)


# -- every pre-tokenizer name, on one trained vocabulary ------------------------------------------

CORPUS = ["It's what they'd said: we're here, you've seen, I'll go, he'd gone.",
          "In 2024, 37 of 1,024 files (3.6%) changed; see https://example.org/a/b?c=d.",
          "class Model:\n    def forward(self, x):\n        return self.proj(x) + 1\n",
          "Спасибо, до свидания. 谢谢，再见。これはテストです。 한국어 텍스트 ٣٤٥ ½",
          "emoji 😀😃😄 👍🏻 and symbols € £ ¥ © ® ™ ° ± × ÷ — “quoted” ‘x’ …",
          "tabs\tand\tspaces  mixed \t \n\n  \r\n end   ", "naïve café résumé Ångström ß ﬁ e\u0301"] * 30
# text shapes each name's regexes treat differently
SHAPES = ["Hello world", " Hello  world ", "I'm don't they'LL WE'RE", "1234567 12 3.14159 ٣٤٥٦ ½²",
          "a\nb\r\nc\n\n\nd", "   \t\n  x  ", "你好世界，日本語のテキスト。 한국어!", "emoji 😀👍🏽 done",
          "naïve e\u0301 café", "<|im_end|> [[sep]] <|endoftext|>", "CamelCaseWords and lowerUPPER", "$+<=>^~|`",
          "<sentinel:12> IMGIMGABZ", "x" * 40 + " " + "9" * 20, ""]


@pytest.fixture(scope="module")
def trained():
    return train_byte_bpe(CORPUS)


def _pre_vocab(tmp_path_factory, trained, pre: str):
    path = write_byte_bpe_gguf(tmp_path_factory.mktemp("pre") / f"{pre}.gguf", trained, pre)
    return Tokenizer.from_metadata(read_gguf(path).metadata), reference(llama_cpp, path)


@pytest.mark.parametrize("pre", sorted(n for n, p in PRE_TOKENIZERS.items() if p.byte_encode))
def test_every_pre_tokenizer_name(tmp_path_factory, trained, pre):
    """Each name llama.cpp knows (but the SentencePiece-style ones, whose files hold no GPT-2 bytes:
    the gemma-4 file tests those): its flags, and its splits (the same ids on text of every shape),
    decoded as llama.cpp decodes (its space clean-up or not)."""
    tok, ref = _pre_vocab(tmp_path_factory, trained, pre)
    lv = llama_cpp.llama_model_get_vocab(ref.model)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(lv)
    assert tok.add_sep == llama_cpp.llama_vocab_get_add_sep(lv)
    assert (tok.bos_id if tok.bos_id is not None else -1) == llama_cpp.llama_vocab_bos(lv)
    texts = SHAPES + random_texts(len(pre), 40)
    for i, text in enumerate(texts):
        add, parse = bool(i & 1), bool(i & 2)
        ids = tok.encode(text, add, parse)
        assert ids == ref.tokenize(text.encode(), add_bos=add, special=parse), (pre, text)
        assert tok.decode(ids, True) == ref_detokenize(llama_cpp, ref, ids, True), (pre, text)


def test_a_name_llama_cpp_does_not_know_is_refused_as_it_refuses_it(tmp_path, trained):
    """llama.cpp's loader throws "unknown pre-tokenizer type" for a name it does not know (and uses
    'default' with a warning only when the key is absent): so does infer, naming the ones it knows."""
    from infer.engine.tokenizer_error import TokenizerError

    tokens, types, merges = trained
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "not-a-pre", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.merges": merges}
    with pytest.raises(TokenizerError, match=r"'not-a-pre'.*qwen35.*smollm"):
        Tokenizer.from_metadata(meta)
    del meta["tokenizer.ggml.pre"]
    assert Tokenizer.from_metadata(meta).pre == "default"


def _long_text() -> str:
    """~300 KB of prose and code (this repository's README and sources) with other scripts mixed in."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    parts = [(root / "README.md").read_text(encoding="utf-8")]
    parts += [p.read_text(encoding="utf-8") for p in sorted((root / "engine").glob("*.py"))]
    text = "\n".join(parts)
    lines = text.split("\n")
    mixed = random_texts(7, len(lines) // 20)
    for i, extra in enumerate(mixed):
        lines.insert(20 * i, extra)
    return "\n".join(lines)[:300_000]


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "gpt-2", "gemma-4", "deepseek-llm", "bert-bge",
                                  "nomic-bert-moe", "command-r", "gpt-neox"])
def test_long_text_matches_llama_cpp(vocab, name):
    """A text long enough to be encoded in parts side by side (SentencePiece and BPE cut it where
    no token or word can span) and to have its special tokens looked for in the windows after
    their prefixes, with and without special parsing: the ids of the whole."""
    from helpers.vocab_gguf import ref_tokenize

    _, tok, ref = vocab(name)
    lines = _long_text().split("\n")
    for i, special in enumerate(_special_texts(tok)[:40]):
        lines.insert(97 * i, special)
    text = "\n".join(lines)
    for parse in (False, True):
        assert tok.encode(text, False, parse) == ref_tokenize(llama_cpp, ref, text, False, parse)


def test_readme_lists_what_the_tables_hold():
    """The README's vocabulary list is written from the tables (scripts/readme_vocabularies.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "readme_vocabularies.py"
    spec = importlib.util.spec_from_file_location("readme_vocabularies", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.block() in mod.README.read_text(encoding="utf-8"), "run scripts/readme_vocabularies.py"
