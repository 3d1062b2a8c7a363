"""The BERT encoder family (models/arch/bert.py: bert, nomic-bert): embeddings of tiny random
models with real vocabularies (tests/helpers/tiny_encoders.py) against llama.cpp's, on the cpu and
mlx backends; their tokenization; a batch of texts against each alone."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.embeddings import cos_distance, embed, llama_cpp_embed
from helpers.tiny_encoders import ENCODER_ARCHS, write_tiny_encoder
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.models.arch import architecture
from infer.models.loader import load_model
from infer.models.weights import ModelLoadError

# long enough to mix many positions, short enough for the tiny models' 128 positions
TEXTS = ["Hello world, this is a test.", "Another sentence", "The quick brown fox jumps over the lazy dog. " * 5,
         "naïve café: résumé of 2024's Ünïcode, with punctuation!?"]


# Measured (cpu and MLX's CPU build): up to 2.1e-4 cosine from llama.cpp's, whose flash attention on
# and off differ by up to 8e-5 here; attention that is causal where it should not be is 1e-1 off
FLOOR = 5e-4


def check(ours: list[np.ndarray], ref: list[np.ndarray], ref_fa: list[np.ndarray], what: str) -> None:
    """Within FLOOR cosine of llama.cpp's default path, or of its own spread (flash attention on
    against off) where that is wider."""
    for i, (o, r, f) in enumerate(zip(ours, ref, ref_fa)):
        d, spread = cos_distance(o, r), cos_distance(f, r)
        print(f"{what} input {i}: ours {d:.2e}, llama.cpp fa on/off {spread:.2e}")
        assert d <= max(FLOOR, spread), f"{what} input {i}: cosine distance {d:.2e} (llama.cpp's spread {spread:.2e})"


def _backends() -> list:
    out = ["cpu"]
    try:
        import mlx.core  # noqa: F401
        out.append("mlx")
    except ImportError:
        out.append(pytest.param("mlx", marks=pytest.mark.skip(reason="mlx is not installed")))
    return out


@pytest.fixture(scope="module", params=ENCODER_ARCHS)
def encoder(request, llama_vocab_dir, tmp_path_factory):
    arch = request.param
    return arch, write_tiny_encoder(tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf", arch, llama_vocab_dir)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embeddings_match_llama_cpp(encoder, pooling, backend):
    """The texts embedded together, within llama.cpp's own spread (flash attention on against off)
    or FLOOR."""
    arch, path = encoder
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, pooling=pooling, backend=backend))
    prompts = [llm.encode_raw(t) for t in TEXTS]
    ours = embed(llm, prompts)
    assert all(v.shape == (64,) and v.dtype == np.float32 for v in ours)
    refs = [llama_cpp_embed(path, pooling, TEXTS, fa, n_ctx=128) for fa in (False, True)]
    check(ours, *refs, f"{arch} {pooling} {backend}")


def test_tokens_match_llama_cpp(encoder, llama_cpp):
    """[CLS] text [SEP] (bge's WordPiece), <s> text </s> (XLM-R's Unigram), as llama.cpp tokenizes
    for an embedding."""
    arch, path = encoder
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2))
    ref = llama_cpp.Llama(str(path), embedding=True, n_ctx=128, verbose=False, vocab_only=True)
    try:
        for text in TEXTS:
            ids = llm.encode_raw(text)
            assert ids == ref.tokenize(text.encode(), add_bos=True, special=False), text
            assert ids[0] == llm.tokenizer.bos_id  # bge's [CLS], XLM-R's <s>
    finally:
        ref.close()


@pytest.mark.parametrize("backend", _backends())
def test_batch_equals_each_alone(encoder, backend):
    """Many texts in one step, each attending to its own tokens only: the same vectors as each
    text embedded by itself (to the bit on the cpu backend)."""
    arch, path = encoder
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, pooling="mean", backend=backend,
                                      max_batch_tokens=128))
    prompts = [llm.encode_raw(t) for t in TEXTS]
    together = embed(llm, prompts)
    for p, v in zip(prompts, together):
        alone = embed(llm, [p])[0]
        if backend == "cpu":
            np.testing.assert_array_equal(v, alone)
        else:
            np.testing.assert_allclose(v, alone, rtol=1e-5, atol=1e-5)


def test_reranker_head_is_loaded_beside_the_layers(llama_vocab_dir, tmp_path):
    """A file with a classification head (cls, cls.output) loads; the head is in ModelWeights, not
    in a layer, and the embeddings are those of the same file without it."""
    path = write_tiny_encoder(tmp_path / "rerank.gguf", "bert", llama_vocab_dir, cls_head=True)
    w = load_model(path).weights
    assert w.cls.shape == (64, 64) and w.cls_b.shape == (64,)
    assert w.cls_out.shape == (1, 64) and w.cls_out_b.shape == (1,)
    plain = write_tiny_encoder(tmp_path / "plain.gguf", "bert", llama_vocab_dir)
    a, b = (embed(LLM.load(p, EngineConfig(n_ctx=128, n_threads=2, pooling="cls")), [[101, 7592, 102]])[0]
            for p in (path, plain))
    np.testing.assert_array_equal(a, b)


def test_files_llama_cpp_refuses_are_refused(llama_vocab_dir, tmp_path):
    """A bert without tokenizer.ggml.token_type_count (llama.cpp: "model needs to define token type
    count"); a nomic-bert-moe with experts on other layers than every 2nd (not supported)."""
    path = write_tiny_encoder(tmp_path / "no-types.gguf", "bert", llama_vocab_dir, type_count=False)
    with pytest.raises(ModelLoadError, match="token_type_count"):
        load_model(path)
    path = write_tiny_encoder(tmp_path / "moe3.gguf", "nomic-bert-moe", llama_vocab_dir, moe_every=3)
    with pytest.raises(ModelLoadError, match="moe_every_n_layers 3 is not supported"):
        load_model(path)


def test_bert_is_an_encoder():
    arch = architecture("bert")
    assert arch.bert_norms and arch.pos_embd and not arch.ffn_gated and not arch.output_norm_tensor
