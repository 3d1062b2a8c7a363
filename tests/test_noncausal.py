"""Non-causal attention (an encoder's: ModelConfig.causal False) and the gemma-embedding
architecture (EmbeddingGemma) that has it: the MLX backend's attention plan against a float64
reference (the cpu kernel's: test_attention.py); the scheduler, which admits such a prompt whole,
in one step, from no cached prefix; a tiny EmbeddingGemma's embeddings against llama.cpp's on
both backends, hidden states that depend on later tokens, batched inputs equal to each alone,
and the refusals (generation, an input longer than a step)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from helpers.embeddings import check_against_llama_cpp, llama_cpp_embed
from helpers.tiny_encoders import GEMMA_EMBEDDING_DENSE, write_tiny_gemma_embedding
from infer.backends.batch import Batch
from infer.engine.block_manager import BlockManager
from infer.engine.engine import EngineConfig, PromptError
from infer.engine.llm import LLM
from infer.engine.pooling import PoolingError
from infer.engine.sampler import SamplingParams
from infer.engine.scheduler import Scheduler, Sequence
from infer.models.loader import load_model

BS = 4  # positions per cache block


def _batch(lengths: list[int], rng) -> tuple[Batch, int]:
    """Whole prompts of len(lengths) sequences in one batch, their blocks shuffled over the pool."""
    per_seq = max(-(-n // BS) for n in lengths)
    nb = len(lengths) * per_seq
    tables = rng.permutation(nb).astype(np.int32).reshape(len(lengths), per_seq)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    seq = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int32)
    slots = (tables[seq, pos // BS] * BS + pos % BS).astype(np.int32)[None]
    T = len(pos)
    batch = Batch(np.zeros(T, np.int32), pos, seq, slots, [tables], np.array([T - 1], np.int32),
                  prompt_end=np.array(lengths, np.int32))
    return batch, nb * BS


def _reference(batch: Batch, q, k, v, window: int) -> np.ndarray:
    """(T, H * D): each query over every key of its sequence (|q - p| <= window // 2 where window)."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    out = np.zeros((T, H, D))
    for t in range(T):
        s, p = batch.tok_seq[t], batch.positions[t]
        keys = batch.positions[batch.tok_seq == s]
        if window:
            keys = keys[np.abs(keys - p) <= window // 2]
        rows = batch.tables[0][s][keys // BS] * BS + keys % BS
        for h in range(H):
            kh = h // (H // Hkv)
            a = k[rows, kh].astype(np.float64) @ q[t, h].astype(np.float64) / np.sqrt(D)
            w = np.exp(a - a.max())
            out[t, h] = (w / w.sum()) @ v[rows, kh].astype(np.float64)
    return out.reshape(T, H * D)


@pytest.mark.parametrize("window", [0, 5])
def test_mlx_plan_sees_the_whole_sequence(window):
    mx = pytest.importorskip("mlx.core")
    from infer.backends.mlx.attention import AttentionPlan

    rng = np.random.default_rng(0)
    batch, n_rows = _batch([9, 1, 6], rng)
    H, Hkv, D = 4, 2, 16
    q = rng.normal(0, 1, (len(batch.tokens), H, D)).astype(np.float32)
    k = rng.normal(0, 1, (n_rows, Hkv, D)).astype(np.float32)
    v = rng.normal(0, 1, (n_rows, Hkv, D)).astype(np.float32)
    plan = AttentionPlan(batch, 0, BS, window, causal=False)
    got = np.array(plan.attend(mx.array(q), mx.array(k), mx.array(v), 1 / np.sqrt(D), 0.0))
    ref = _reference(batch, q, k, v, window)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    # and it is not what the causal plan computes: the later keys count
    causal = np.array(AttentionPlan(batch, 0, BS, window).attend(mx.array(q), mx.array(k), mx.array(v),
                                                                   1 / np.sqrt(D), 0.0))
    assert np.abs(causal - ref).max() > 0.1


def test_scheduler_admits_whole_prompts_only():
    bm = BlockManager([64], BS, [0], naming=False)
    sched = Scheduler(bm, max_seqs=4, max_batch_tokens=16, whole_prompts=True)
    a, b, c = (Sequence(i, list(range(i, i + n)), n) for i, n in ((1, 10), (2, 9), (3, 6)))
    for s in (a, b, c):
        sched.add(s)
    step = sched.schedule()
    # a fits; b does not fit in what is left (6) and waits whole rather than being chunked, and
    # c, behind it, waits too (first come, first served)
    assert [(s.id, n) for s, n in step.items] == [(1, 10)]
    sched.commit(step)
    sched.finish(a)
    step = sched.schedule()
    assert [(s.id, n) for s, n in step.items] == [(2, 9), (3, 6)]


TINY_PROMPT = [1, 5, 77, 300, 12, 260, 9, 9, 140, 201, 33, 318, 4, 100, 250, 7]  # test_embeddings.py's
BACKENDS = ["cpu", pytest.param("mlx", marks=pytest.mark.skipif(importlib.util.find_spec("mlx") is None,
                                                                reason="needs mlx"))]


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    return write_tiny_gemma_embedding(tmp_path_factory.mktemp("enc") / "tiny-gemma-embedding.gguf", seed=23)


def _llm(path, backend: str, **kw) -> LLM:
    return LLM.load(path, EngineConfig(n_ctx=64, n_threads=2, backend=backend, **kw))


def _embed(llm: LLM, prompts: list[list[int]]) -> list[np.ndarray]:
    """The pooled embeddings of prompts submitted together (they share the engine's steps)."""
    eng = llm.engine
    rids = [eng.add_embedding(p) for p in prompts]
    return [list(eng.stream(r))[-1].embedding for r in rids]


@pytest.mark.reference
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma_embedding_matches_llama_cpp(tiny_encoder, backend):
    """Mean-pooled (the file's pooling) within 1e-3 cosine of llama.cpp's, or of its own spread
    (flash attention on vs off) where wider (measured: cpu 1.5e-4 on both inputs, llama.cpp's
    spread 1.8e-4; mlx 2.6e-4, 3.0e-4, its 8-bit weight copies; on seed 0's model, causal attention
    instead was 0.40 away, the sliding windows left out 0.29, a window of 12 0.21). The 16-token
    prompt is longer than the symmetric window (3 keys either side)."""
    llm = _llm(tiny_encoder, backend)
    assert llm.engine.pooling == "mean" and not llm.engine.causal
    inputs = [TINY_PROMPT, TINY_PROMPT[:5]]
    ours = _embed(llm, inputs)
    refs = [llama_cpp_embed(tiny_encoder, "mean", inputs, fa, n_ctx=64) for fa in (False, True)]
    check_against_llama_cpp(ours, *refs, f"gemma-embedding {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hidden_states_depend_on_later_tokens(tiny_encoder, backend):
    """The first token's final hidden state (cls pooling) changes with the last token: its
    attention sees it (the global layer; the sliding ones see 3 keys either side)."""
    llm = _llm(tiny_encoder, backend, pooling="cls")
    a, b = _embed(llm, [TINY_PROMPT, TINY_PROMPT[:-1] + [42]])
    assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_equals_alone(tiny_encoder, backend):
    """Inputs of several lengths in one step give each the numbers it gets alone, bit for bit (and
    the step holds them all: whole inputs are never chunked, so none sees only part of itself)."""
    prompts = [TINY_PROMPT, TINY_PROMPT[:5], [1, 42], TINY_PROMPT[3:14]]
    llm = _llm(tiny_encoder, backend)
    batched = _embed(llm, prompts)
    assert llm.engine.steps == 1
    for p, got in zip(prompts, batched):
        np.testing.assert_array_equal(got, _embed(_llm(tiny_encoder, backend), [p])[0])


def test_no_prefix_cache_and_whole_steps(tiny_encoder):
    """An input that extends an earlier one finds nothing cached (its tokens' K/V depend on the
    tokens after them), and gives what it gives on a fresh engine; inputs that do not fit what is
    left of a step wait for the next one whole."""
    llm = _llm(tiny_encoder, "cpu", max_batch_tokens=20)
    first = _embed(llm, [TINY_PROMPT[:8]])[0]
    again = _embed(llm, [TINY_PROMPT[:8], TINY_PROMPT])
    assert llm.engine.blocks.hit_tokens == 0
    np.testing.assert_array_equal(again[0], first)
    np.testing.assert_array_equal(again[1], _embed(_llm(tiny_encoder, "cpu"), [TINY_PROMPT])[0])
    assert llm.engine.steps == 3  # 8 + 16 tokens do not fit a step of 20: two steps, not a chunk


def test_refuses_generation_and_too_long_inputs(tiny_encoder):
    llm = _llm(tiny_encoder, "cpu", max_batch_tokens=8)
    with pytest.raises(PromptError, match="tiny-gemma-embedding is an embedding model: use `infer embed`"):
        llm.engine.add_request(TINY_PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(PoolingError, match="16 tokens .* one step of at most 8 tokens.*max_batch_tokens"):
        llm.engine.add_embedding(TINY_PROMPT)
    assert _embed(llm, [TINY_PROMPT[:8]])[0].shape == (256,)  # the step's size itself is fine


@pytest.mark.reference
def test_dense_projections_against_llama_cpp(tmp_path):
    """EmbeddingGemma with sentence-transformers' dense projections (dense_2, dense_3: the pooling
    head, models/pooling_head.py, applied after pooling) embeds as llama.cpp's build_dense_out does,
    its layers loaded as the file without them."""
    path = write_tiny_gemma_embedding(tmp_path / "d.gguf", seed=23, dense=True)
    with_dense = load_model(path)
    plain = load_model(write_tiny_gemma_embedding(tmp_path / "p.gguf", seed=23))
    head = with_dense.weights.head
    assert head.dense_2.shape == (GEMMA_EMBEDDING_DENSE, 256) and head.dense_3.shape == (256, GEMMA_EMBEDDING_DENSE)
    assert plain.weights.head is None
    np.testing.assert_array_equal(with_dense.weights.layers[0].wq.raw, plain.weights.layers[0].wq.raw)
    inputs = [TINY_PROMPT, TINY_PROMPT[:5]]
    ours = _embed(_llm(path, "cpu"), inputs)
    refs = [llama_cpp_embed(path, "mean", inputs, fa, n_ctx=64) for fa in (False, True)]
    check_against_llama_cpp(ours, *refs, "gemma-embedding dense")


def test_runner_does_not_chunk_an_encoder(tiny_encoder):
    """CpuRunner.forward feeds a long prompt in chunks of max_tokens; an encoder's tokens must see
    each other, so it refuses instead."""
    from infer.backends.cpu.runner import CpuRunner

    model = load_model(tiny_encoder)
    runner = CpuRunner(model.config, model.weights, n_threads=2, max_tokens=8)
    runner.forward(np.array(TINY_PROMPT[:8], np.int32), 0, runner.new_kv_cache(64))
    with pytest.raises(ValueError, match="non-causal"):
        runner.forward(np.array(TINY_PROMPT, np.int32), 0, runner.new_kv_cache(64))


def test_step_budget_past_512_for_an_encoder(tmp_path):
    """A causal model's passes stop at 512 tokens (a longer prompt is chunked); an encoder's input
    is one pass, so its runner takes max_batch_tokens: raising it embeds a longer input."""
    path = write_tiny_gemma_embedding(tmp_path / "long.gguf", seed=23, n_ctx=1024)
    prompt = (TINY_PROMPT * 40)[:600]
    with pytest.raises(PoolingError, match="600 tokens"):
        LLM.load(path, EngineConfig(n_ctx=1024, n_threads=2)).engine.add_embedding(prompt)
    llm = LLM.load(path, EngineConfig(n_ctx=1024, n_threads=2, max_batch_tokens=640))
    assert llm.runner.max_tokens == 640
    v = _embed(llm, [prompt])[0]
    assert llm.engine.steps == 1 and np.isfinite(v).all()


def test_infer_embed_ubatch_size(tiny_encoder):
    """`infer embed` on an encoder: an input longer than one pass (-ub, llama.cpp's physical batch)
    is a one-line error that names the flag; with a pass that holds it, the engine's vector."""
    from helpers.cli import assert_one_line_error, infer
    from infer.engine.pooling import normalize

    text = "a tiny encoder embeds this"
    llm = _llm(tiny_encoder, "cpu")
    ids = llm.encode_raw(text)
    assert 8 < len(ids) <= 64
    args = (str(tiny_encoder), text, "--ctx", "64", "--threads", "2")
    assert_one_line_error(infer("embed", *args, "-ub", "8"), "--ubatch-size")
    r = infer("embed", *args, "--ubatch-size", "64")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.array(r.stdout.split(), np.float64), normalize(_embed(llm, [ids])[0]), atol=1e-6)
