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


@pytest.mark.parametrize("backend", _backends())
def test_jina_second_norm_matches_llama_cpp(llama_vocab_dir, tmp_path, backend):
    """jina-bert-v2 with attn_norm_2 (jina-embeddings-v2-base-code's): LayerNorm(attn_output_norm's
    output + the layer's input) after the attention."""
    path = write_tiny_encoder(tmp_path / "norm2.gguf", "jina-bert-v2", llama_vocab_dir, norm_2=True)
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, pooling="mean", backend=backend))
    ours = embed(llm, [llm.encode_raw(t) for t in TEXTS])
    check(ours, *[llama_cpp_embed(path, "mean", TEXTS, fa, n_ctx=128) for fa in (False, True)],
          f"jina-bert-v2 attn_norm_2 {backend}")


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


@pytest.mark.reference
def test_reranker_head_against_llama_cpp(llama_vocab_dir, tmp_path):
    """A bge-reranker-style file (a classification head: cls, cls.output) loads with the head
    beside the layers (ModelWeights.head, the engine's pooling), embeds as the same file without
    it, and ranks (the CLS row, cls then tanh, cls.output) as llama.cpp's build_pooling does."""
    path = write_tiny_encoder(tmp_path / "rerank.gguf", "bert", llama_vocab_dir, cls_head=True)
    head = load_model(path).weights.head
    assert head.cls.shape == (64, 64) and head.cls_b.shape == (64,)
    assert head.cls_out.shape == (1, 64) and head.cls_out_b.shape == (1,)
    plain = write_tiny_encoder(tmp_path / "plain.gguf", "bert", llama_vocab_dir)
    a, b = (embed(LLM.load(p, EngineConfig(n_ctx=128, n_threads=2, pooling="cls")), [[101, 7592, 102]])[0]
            for p in (path, plain))
    np.testing.assert_array_equal(a, b)
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, pooling="rank"))
    prompts = [llm.encode_raw(t) for t in TEXTS]
    ours = embed(llm, prompts)
    theirs = llama_cpp_embed(path, "rank", prompts, n=1)
    scale = max(abs(float(t[0])) for t in theirs)
    for o, t in zip(ours, theirs):
        assert o.shape == (1,) and abs(float(o[0]) - float(t[0])) <= 1e-3 * max(scale, 1.0), (o, t)


def test_refused_files(llama_vocab_dir, tmp_path):
    """A bert without tokenizer.ggml.token_type_count (llama.cpp: "model needs to define token type
    count"); a nomic-bert-moe with experts on other layers than every 2nd (not supported)."""
    path = write_tiny_encoder(tmp_path / "no-types.gguf", "bert", llama_vocab_dir, type_count=False)
    with pytest.raises(ModelLoadError, match="token_type_count"):
        load_model(path)
    path = write_tiny_encoder(tmp_path / "moe3.gguf", "nomic-bert-moe", llama_vocab_dir, moe_every=3)
    with pytest.raises(ModelLoadError, match="moe_every_n_layers 3 is not supported"):
        load_model(path)


def test_no_output_matrix_on_cpu(encoder):
    """An encoder never generates: the cpu backend packs no output matrix (bge-m3's tied embedding
    is 250k rows) and keeps no logits, yet embeds."""
    arch, path = encoder
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, pooling="mean", backend="cpu"))
    runner = llm.engine.runner
    assert runner.output is None and runner.logits.shape[1] == 0
    assert np.isfinite(embed(llm, [llm.encode_raw(TEXTS[0])])[0]).all()


@pytest.mark.parametrize("lengths", [[9, 1, 6], [1, 1]])
def test_mlx_alibi_against_float64(lengths):
    """The MLX plan's ALiBi (jina-bert-v2's slopes, 8 heads over 2 KV heads), each query over its
    whole sequence, one-token sequences (a part of their own) included, against float64."""
    mx = pytest.importorskip("mlx.core")
    from infer.backends.batch import Batch
    from infer.backends.mlx.attention import AttentionPlan

    BS, H, Hkv, D = 4, 8, 2, 16
    rng = np.random.default_rng(0)
    per_seq = max(-(-n // BS) for n in lengths)
    tables = rng.permutation(len(lengths) * per_seq).astype(np.int32).reshape(len(lengths), per_seq)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    seq = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int32)
    rows_of = tables[seq, pos // BS] * BS + pos % BS
    T = len(pos)
    batch = Batch(np.zeros(T, np.int32), pos, seq, rows_of.astype(np.int32)[None], [tables],
                  np.array([T - 1], np.int32), prompt_end=np.array(lengths, np.int32))
    q = rng.normal(0, 1, (T, H, D)).astype(np.float32)
    k = rng.normal(0, 1, (tables.size * BS, Hkv, D)).astype(np.float32)
    v = rng.normal(0, 1, (tables.size * BS, Hkv, D)).astype(np.float32)
    n_log2 = 8  # llama.cpp's slopes for 8 heads and max_bias 8: 2^-(h + 1)
    slopes = np.array([2.0 ** (-8.0 / n_log2 * (h + 1)) for h in range(H)], np.float32)
    got = np.array(AttentionPlan(batch, 0, BS, 0, causal=False).attend(
        mx.array(q), mx.array(k), mx.array(v), 1 / np.sqrt(D), 0.0, alibi=mx.array(slopes)))
    ref = np.zeros((T, H, D))
    for t in range(T):
        keys = np.flatnonzero(seq == seq[t])  # the tokens of its sequence, in position order
        for h in range(H):
            a = k[rows_of[keys], h // (H // Hkv)].astype(np.float64) @ q[t, h] / np.sqrt(D)
            a -= slopes[h] * np.abs(pos[t] - pos[keys])
            w = np.exp(a - a.max())
            ref[t, h] = (w / w.sum()) @ v[rows_of[keys], h // (H // Hkv)]
    np.testing.assert_allclose(got, ref.reshape(T, H * D), rtol=0, atol=1e-5)


def test_alibi_slopes_are_llama_cpps():
    """ggml_soft_max_ext's slopes for max_bias 8: 4 heads 2^-2, 2^-4, ...; 12 heads (not a power of
    two) the 8 of m0 = 2^-1, then m1 = 2^-1/2's odd powers."""
    from infer.models.arch import architecture
    from infer.models.config import ModelConfig

    def slopes(n_head: int) -> np.ndarray:
        base = ModelConfig.from_metadata({"general.architecture": "jina-bert-v2", "jina-bert-v2.embedding_length": 64 * n_head,
                                          "jina-bert-v2.attention.head_count": n_head, "jina-bert-v2.block_count": 1,
                                          "jina-bert-v2.feed_forward_length": 64}, n_vocab=8)
        assert base.architecture is architecture("jina-bert-v2")
        return base.alibi_slopes()

    np.testing.assert_array_equal(slopes(4), np.float32([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]))
    s12 = slopes(12)
    np.testing.assert_allclose(s12[:8], [2.0 ** -(h + 1) for h in range(8)], rtol=1e-7)
    np.testing.assert_allclose(s12[8:], [2.0 ** (-0.5 * (2 * j + 1)) for j in range(4)], rtol=1e-6)


def test_bert_is_an_encoder():
    arch = architecture("bert")
    assert arch.bert_norms and arch.pos_embd and not arch.ffn_gated and not arch.output_norm_tensor
