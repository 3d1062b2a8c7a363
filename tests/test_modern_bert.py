"""ModernBERT (models/arch/modern_bert.py): embeddings of tiny random files against llama.cpp's, on
the cpu and mlx backends, with mean and cls pooling; the local layers' symmetric window; the
sliding-window plan, the FFN's activation and the classifier head as llama.cpp reads them."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.tiny_modern_bert import N_LAYER, WINDOW, write_tiny_modern_bert
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.models.config import ModelConfig, ModelConfigError
from infer.models.loader import load_model

BACKENDS = ["cpu", "mlx"]
POOLING_IDS = {"mean": 1, "cls": 2}  # llama.cpp's enum llama_pooling_type
# three prompts: the first two longer than the local layers' window (8: 4 positions either side),
# so that it matters; the third shorter than half of it (every token sees every other)
PROMPTS = [[1, 5, 77, 300, 12, 260, 9, 9, 140, 201, 33, 318, 4, 100, 250, 7, 19, 44, 55, 66, 3, 90, 91, 92],
           [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 2],
           [1, 200, 17]]


def cos_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(1 - a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def llama_cpp_embed(path, pooling: str, prompts: list[list[int]], flash_attn: bool, n_ctx: int = 64) -> list[np.ndarray]:
    """llama.cpp's pooled embedding of each token list, as Llama.embed computes them (one batch of
    one sequence, every token an output: an encoder's whole prompt in one llama_decode)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(str(path), embedding=True, pooling_type=POOLING_IDS[pooling], n_ctx=n_ctx, n_threads=2,
                          flash_attn=flash_attn, verbose=False)
    try:
        out = []
        for tokens in prompts:
            ref._batch.reset()  # what Llama.embed does with the tokens of a text
            ref._batch.add_sequence(tokens, 0, True)
            ref._ctx.decode(ref._batch)
            out.append(np.array(llama_cpp.llama_get_embeddings_seq(ref.ctx, 0)[:ref.n_embd()]))
        return out
    finally:
        ref.close()


def embed(path, backend: str, prompts: list[list[int]], n_ctx: int = 64) -> list[np.ndarray]:
    """Our pooled embeddings of the prompts, submitted together."""
    llm = LLM.load(path, EngineConfig(n_ctx=n_ctx, n_threads=2, backend=backend))
    eng = llm.engine
    rids = [eng.add_embedding(p) for p in prompts]
    return [list(eng.stream(r))[-1].embedding for r in rids]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model with each pooling; the same weights with a window wider than the prompts
    (wide), without one (global: every layer global, the global RoPE base), and with SwiGLU."""
    d = tmp_path_factory.mktemp("modern-bert")
    return {"mean": write_tiny_modern_bert(d / "mean.gguf", pooling="mean"),
            "cls": write_tiny_modern_bert(d / "cls.gguf", pooling="cls"),
            "wide": write_tiny_modern_bert(d / "wide.gguf", pooling="mean", window=64),
            "global": write_tiny_modern_bert(d / "global.gguf", pooling="mean", window=0),
            "silu": write_tiny_modern_bert(d / "silu.gguf", pooling="mean", activation="silu")}


@pytest.mark.reference
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mean", "cls", "global", "silu"])
def test_embeddings_match_llama_cpp(files, backend, kind):
    """Within 1e-3 cosine of llama.cpp's embeddings, or of llama.cpp's own spread (flash attention
    on vs off) where that is wider; global: a file without a window; silu: Granite Embedding R2's
    SwiGLU (hidden_activation)."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    pooling = "cls" if kind == "cls" else "mean"
    ours = embed(files[kind], backend, PROMPTS)
    assert all(v.shape == (256,) and v.dtype == np.float32 for v in ours)
    ref = llama_cpp_embed(files[kind], pooling, PROMPTS, False)
    ref_fa = llama_cpp_embed(files[kind], pooling, PROMPTS, True)
    for i, (o, r, f) in enumerate(zip(ours, ref, ref_fa)):
        d, spread = cos_distance(o, r), cos_distance(f, r)
        print(f"{backend} {kind} prompt {i}: ours {d:.2e}, llama.cpp fa on/off {spread:.2e}")
        assert d <= max(1e-3, spread), f"prompt {i}: cosine distance {d:.2e} (llama.cpp's spread {spread:.2e})"


@pytest.mark.reference
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_prompts_match_llama_cpp(files, backend):
    """Prompts of many KV blocks (16 tokens each) and 25 windows, in one step together."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    rng = np.random.default_rng(1)
    prompts = [[1, *rng.integers(3, 320, n).tolist()] for n in (200, 70)]
    ours = embed(files["mean"], backend, prompts, n_ctx=256)
    ref, ref_fa = (llama_cpp_embed(files["mean"], "mean", prompts, fa, n_ctx=256) for fa in (False, True))
    for i, (o, r, f) in enumerate(zip(ours, ref, ref_fa)):
        d, spread = cos_distance(o, r), cos_distance(f, r)
        print(f"{backend} long prompt {i}: ours {d:.2e}, llama.cpp fa on/off {spread:.2e}")
        assert d <= max(1e-3, spread)


@pytest.mark.reference
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_window_matters(files, backend):
    """The local layers see 4 positions either side: on prompts longer than that, the same weights
    with a window wider than the prompts embed over 1e-2 (cosine) away, here as in llama.cpp, so
    the test above would see a window ignored (or taken one-sided: half of it); on a prompt within
    it, nothing changes."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    windowed, wide = embed(files["mean"], backend, PROMPTS), embed(files["wide"], backend, PROMPTS)
    ref_windowed = llama_cpp_embed(files["mean"], "mean", PROMPTS, False)
    ref_wide = llama_cpp_embed(files["wide"], "mean", PROMPTS, False)
    for i in range(2):
        apart, ref_apart = cos_distance(windowed[i], wide[i]), cos_distance(ref_windowed[i], ref_wide[i])
        print(f"prompt {i}: window 8 vs 64 {apart:.2e} (llama.cpp {ref_apart:.2e}); "
              f"64 vs llama.cpp {cos_distance(wide[i], ref_wide[i]):.2e}")
        assert apart > 1e-2 and ref_apart > 1e-2
        assert cos_distance(wide[i], ref_wide[i]) < 1e-3  # the wide window agrees with llama.cpp's too
    assert cos_distance(windowed[2], wide[2]) < 1e-6


def test_window_and_activation_from_the_file(tmp_path):
    """llama.cpp's modern-bert plan: every 3rd layer global, the first of each three; a pattern the
    file gives; no window at all without sliding_window; hidden_activation picks the FFN's gate."""
    cfg = load_model(write_tiny_modern_bert(tmp_path / "a.gguf")).config
    assert cfg.layer_swa == (False, True, True, False, True, True) and cfg.sliding_window == WINDOW
    assert cfg.rope_base == 160000.0 and cfg.rope_base_swa == 10000.0 and cfg.norm_eps == pytest.approx(1e-5)
    assert not cfg.causal and cfg.ffn_activation == "gelu" and cfg.pooling == "mean"
    meta = dict(load_model(write_tiny_modern_bert(tmp_path / "b.gguf", pattern=None, activation=None,
                                                  pooling="cls")).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.layer_swa == (False, True, True, False, True, True) and cfg.ffn_activation == "gelu"
    assert cfg.pooling == "cls"
    assert ModelConfig.from_metadata({**meta, "modern-bert.attention.sliding_window_pattern": 2}).layer_swa == \
        (False, True) * 3
    flags = [True, False] * 3
    assert ModelConfig.from_metadata({**meta, "modern-bert.attention.sliding_window_pattern": flags}).layer_swa == \
        tuple(flags)
    assert ModelConfig.from_metadata({**meta, "modern-bert.attention.sliding_window": 0}).layer_swa == \
        (False,) * N_LAYER
    assert ModelConfig.from_metadata({**meta, "modern-bert.hidden_activation": "silu"}).ffn_activation == "silu"
    with pytest.raises(ModelConfigError, match="3 flags for 6 layers"):
        ModelConfig.from_metadata({**meta, "modern-bert.attention.sliding_window_pattern": [True] * 3})
    with pytest.raises(ModelConfigError, match="ReGLU"):
        ModelConfig.from_metadata({**meta, "modern-bert.hidden_activation": "relu"})
    with pytest.raises(ModelConfigError, match="layer_norm_epsilon"):  # llama.cpp requires it too
        ModelConfig.from_metadata({k: v for k, v in meta.items() if k != "modern-bert.attention.layer_norm_epsilon"})


def test_batched_equals_alone(files):
    """The prompts embedded in one step are each the vector it is alone (cpu: to the bit)."""
    eng = LLM.load(files["mean"], EngineConfig(n_ctx=64, n_threads=2, backend="cpu")).engine
    rids = [eng.add_embedding(p) for p in PROMPTS]
    together = [list(eng.stream(r))[-1].embedding for r in rids]
    for p, v in zip(PROMPTS, together):
        np.testing.assert_array_equal(list(eng.stream(eng.add_embedding(p)))[-1].embedding, v)


def test_a_reranker_file_opens(tmp_path):
    """A file with a reranker's classifier head (cls, cls.norm, cls.output and its bias, written
    after the layers' tensors) loads, and the layers embed as without it (the head is the
    engine's pooling, not the layers')."""
    plain = write_tiny_modern_bert(tmp_path / "plain.gguf", seed=3)
    ranked = write_tiny_modern_bert(tmp_path / "head.gguf", seed=3, head=1)
    a, b = embed(plain, "cpu", PROMPTS[:1]), embed(ranked, "cpu", PROMPTS[:1])
    np.testing.assert_array_equal(a[0], b[0])
