"""The engine on a hybrid model (lfm2: short convolutions with a per-sequence state beside the
paged KV cache): batching, chunking and preemption change nothing a request computes, state slots
are taken on admission and given back at every end, the memory accounting counts them, and what
cannot work with a recurrent state (prefix reuse, speculation) is not done; and which lfm2
metadata is refused."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_runs import GREEDY, alone, run_all, tiny_prompts
from helpers.tiny_models import write_tiny_model
from infer.engine.engine import Engine, EngineConfig
from infer.engine.llm import LLM, choose_backend
from infer.engine.sampler import SamplingParams
from infer.engine.speculative import SpecConfig, SpeculationError
from infer.models.config import ModelConfig, ModelConfigError
from infer.models.loader import load_model


@pytest.fixture(scope="module")
def lfm2_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("hybrid") / "tiny-lfm2.gguf", "lfm2", seed=14)


def _backend(name: str) -> str:
    """A backend with a state pool, skipped where it is not installed."""
    if name == "mlx":
        pytest.importorskip("mlx.core", reason="the mlx backend needs MLX (pip install infer[mlx])")
    return name


def _slots_all_free(eng) -> bool:
    states = eng.scheduler.states
    return states.n_free == states.n_slots and not states.held()


@pytest.mark.slow  # a few seconds alone, longer when other work shares the two cores
@pytest.mark.parametrize("backend, cache_type", [("cpu", "f16"), ("cpu", "q8_0"), ("mlx", "f16")])
def test_batched_equals_alone_lfm2(lfm2_path, backend, cache_type):
    # a small token budget: prompts are chunked differently together than alone, so each sequence's
    # state is carried across chunks at other places (mlx keeps its KV cache in f16 only)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40, cache_type_k=cache_type,
                          cache_type_v=cache_type, backend=_backend(backend))
    prompts = tiny_prompts()
    llm = LLM.load(lfm2_path, config)
    together, widest = run_all(llm, prompts)
    assert widest == 8
    assert together == alone(lfm2_path, prompts, config)
    assert all(len(t) > 0 for t in together)
    assert _slots_all_free(llm.engine) and llm.engine.usage().blocks_used == (0,)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("mlx", marks=pytest.mark.slow)])  # mlx: 6-9 s
def test_preemption_rebuilds_the_state(lfm2_path, backend):
    roomy = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64, backend=_backend(backend))
    eng0 = LLM.load(lfm2_path, roomy).engine
    per_block, state = eng0.blocks.block_bytes[0], eng0.states.nbytes
    # room for the states and little more than one full-context sequence's blocks: the newest are
    # preempted, and recomputed from their first token, state and all
    tight = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64, backend=backend,
                         kv_memory=state + int(1.3 * 8 * per_block))
    eng = LLM.load(lfm2_path, tight).engine
    assert eng.states.nbytes == state
    prompts = tiny_prompts()
    params = SamplingParams(temperature=0.0, max_tokens=40)
    ids = [eng.add_request(p, params, keep_events=False) for p in prompts]
    out = {}
    while eng.has_work():
        for ev in eng.step():
            if ev.finish_reason is not None:
                out[ev.request_id] = ev.token_ids
        assert len(eng.scheduler.states.held()) == len(eng.scheduler.running)
    assert eng.scheduler.n_preempted > 0
    assert [out[i] for i in ids] == alone(lfm2_path, prompts, roomy, params)
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_state_slots_freed_on_finish_and_cancel(lfm2_path):
    eng = LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=2)).engine
    assert eng.scheduler.states.n_slots == 2 == eng.states.n_slots
    # admission needs a free slot: three requests, two run, the third waits for a slot
    rids = [eng.add_request([1, 5, 6, 7 + i], SamplingParams(temperature=0.0, max_tokens=30), keep_events=False)
            for i in range(3)]
    eng.step()
    assert len(eng.scheduler.running) == 2 and eng.scheduler.states.n_free == 0
    assert sorted(eng.scheduler.states.held().values()) == [0, 1]
    eng.cancel(rids[0])
    eng.step()  # the cancel frees a slot, which the waiting request takes in the same step
    assert eng.scheduler.states.held().keys() == {rids[1], rids[2]}
    while eng.has_work():
        eng.step()
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
def test_second_turn_equals_fresh_run(lfm2_path, backend):
    # no prefix reuse for a recurrent model (engine/state_slots.py): the next turn of a chat is
    # prefilled whole, and gives the tokens a fresh engine gives
    config = EngineConfig(n_ctx=256, n_threads=2, backend=_backend(backend))
    eng = LLM.load(lfm2_path, config).engine
    first = [1] + list(range(10, 60))
    ev = list(eng.generate(first, GREEDY))[-1]
    turn2 = first + ev.token_ids + [5, 6, 7]
    ev2 = list(eng.generate(turn2, GREEDY))[-1]
    assert ev2.usage.cached_tokens == 0 and eng.prefix_hit_rate() == 0.0
    assert ev2.token_ids == alone(lfm2_path, [turn2], config)[0]
    again = list(eng.generate(first, GREEDY))[-1]
    assert again.usage.cached_tokens == 0 and again.token_ids == ev.token_ids


def test_memory_accounting_counts_the_state_pool(lfm2_path):
    config = EngineConfig(n_ctx=128, n_threads=2, max_seqs=4)
    eng = LLM.load(lfm2_path, config).engine
    cfg = load_model(lfm2_path).config
    # 3 short-convolution layers x (L - 1 = 2) x n_embd 256 float32, per sequence
    assert cfg.state_bytes() == 3 * 2 * 256 * 4 == eng.runner.state_bytes_per_seq()
    assert eng.states.nbytes == 4 * cfg.state_bytes()
    assert Engine.kv_pool_bytes(ModelConfig.from_metadata(load_model(lfm2_path).metadata), config) == \
        eng.usage().bytes_total + eng.states.nbytes
    # --kv-memory holds both: what the states take is not there for blocks
    one_seq = eng.blocks.block_bytes[0] * (128 // config.block_size)
    with pytest.raises(ValueError, match="recurrent state of --parallel 4 sequences"):
        LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=4, kv_memory=one_seq))
    fits = LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=4,
                                            kv_memory=one_seq + 4 * cfg.state_bytes())).engine
    assert fits.usage().blocks_total == (128 // config.block_size,)


def test_speculation_is_refused(lfm2_path):
    with pytest.raises(SpeculationError, match="recurrent"):
        LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, spec=SpecConfig(kind="ngram")))


def test_auto_backend_for_recurrent_models(monkeypatch, lfm2_path):
    # the backends with a state pool: mlx where auto picks it (Apple Silicon), else the cpu kernels,
    # even where a llama.cpp build with a GPU would take the same model without recurrent layers
    from infer.backends import registry
    from infer.backends.registry import BackendInfo

    gpu_llamacpp = BackendInfo("llama.cpp", True, ["cuda:0 a GPU"], gpu=True)
    real_probe = registry.probe
    monkeypatch.setattr(registry, "probe", lambda name: gpu_llamacpp if name == "llama.cpp" else real_probe(name))
    real_installed = registry._installed
    monkeypatch.setattr(registry, "_installed", lambda module: module == "llama_cpp" or real_installed(module))
    monkeypatch.setattr(registry, "is_apple_silicon", lambda: False)
    assert choose_backend("auto", "gguf", recurrent=True) == "cpu"
    assert choose_backend("auto", "gguf", recurrent=False) == "llama.cpp"
    if not real_probe("mlx").available:
        pytest.skip("MLX is not installed: auto's choice of mlx on Apple Silicon (pip install infer[mlx])")
    monkeypatch.setattr(registry, "is_apple_silicon", lambda: True)
    assert choose_backend("auto", "gguf", recurrent=True) == "mlx"
    # and what auto picks runs the model: the same tokens as the cpu kernels' engine gives
    llm = LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2))
    assert llm.backend == "mlx" and llm.engine.states is not None
    few = SamplingParams(temperature=0.0, max_tokens=8)
    got = list(llm.engine.generate([1, 5, 6, 7], few))[-1].token_ids
    assert got == alone(lfm2_path, [[1, 5, 6, 7]], EngineConfig(n_ctx=128, n_threads=2, backend="cpu"), few)[0]


@pytest.mark.parametrize("key, value, message", [
    ("attention.head_count_kv", np.array([0, 2, 2], np.uint32), "3 values for 4 layers"),
    ("attention.head_count_kv", np.array([0, 2, 1, 0], np.uint32), "one positive KV head count"),
    ("attention.head_count_kv", None, "head_count_kv is missing"),
    ("shortconv.l_cache", 1, "shortconv.l_cache 1 is out of range"),
    ("shortconv.l_cache", None, "shortconv.l_cache 0 is out of range"),
    ("attention.sliding_window", 4, "sliding window"),
    ("attention.causal", False, "non-causal"),
])
def test_lfm2_metadata_refused(lfm2_path, key, value, message):
    meta = dict(load_model(lfm2_path).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.layer_recurrent == (True, True, False, True) and cfg.recurrent_layers == (0, 1, 3)
    assert cfg.n_head_kv == 2 and cfg.shortconv_l_cache == 3 and [g.layers for g in cfg.kv_groups] == [(2,)]
    if value is None:
        del meta[f"lfm2.{key}"]
    else:
        meta[f"lfm2.{key}"] = value
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_metadata(meta)
