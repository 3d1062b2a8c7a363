"""The engine on a hybrid model (lfm2: short convolutions, qwen35: gated delta nets, each with a
per-sequence state beside the paged KV cache): batching, chunking and preemption change nothing a
request computes, state slots are taken on admission and given back at every end, the memory
accounting counts them, and what cannot work with a recurrent state (prefix reuse, speculation)
is not done; and which lfm2 and qwen35 metadata is refused."""
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


@pytest.fixture(scope="module", params=["lfm2", "qwen35"])
def hybrid_path(request, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("hybrid") / f"tiny-{request.param}.gguf", request.param, seed=14)


def _slots_all_free(eng) -> bool:
    states = eng.scheduler.states
    return states.n_free == states.n_slots and not states.held()


@pytest.mark.slow  # a few seconds alone, longer when other work shares the two cores
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_batched_equals_alone_hybrid(hybrid_path, cache_type):
    # a small token budget: prompts are chunked differently together than alone, so each sequence's
    # state is carried across chunks at other places
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40, cache_type_k=cache_type,
                          cache_type_v=cache_type)
    prompts = tiny_prompts()
    llm = LLM.load(hybrid_path, config)
    together, widest = run_all(llm, prompts)
    assert widest == 8
    assert together == alone(hybrid_path, prompts, config)
    assert all(len(t) > 0 for t in together)
    assert _slots_all_free(llm.engine) and llm.engine.usage().blocks_used == (0,)


def test_preemption_rebuilds_the_state(hybrid_path):
    roomy = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64)
    eng0 = LLM.load(hybrid_path, roomy).engine
    per_block, state = eng0.blocks.block_bytes[0], eng0.states.nbytes
    # room for the states and little more than one full-context sequence's blocks: the newest are
    # preempted, and recomputed from their first token, state and all
    tight = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64,
                         kv_memory=state + int(1.3 * 8 * per_block))
    eng = LLM.load(hybrid_path, tight).engine
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
    assert [out[i] for i in ids] == alone(hybrid_path, prompts, roomy, params)
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


def test_second_turn_equals_fresh_run(hybrid_path):
    # no prefix reuse for a recurrent model (engine/state_slots.py): the next turn of a chat is
    # prefilled whole, and gives the tokens a fresh engine gives
    config = EngineConfig(n_ctx=256, n_threads=2)
    eng = LLM.load(hybrid_path, config).engine
    first = [1] + list(range(10, 60))
    ev = list(eng.generate(first, GREEDY))[-1]
    turn2 = first + ev.token_ids + [5, 6, 7]
    ev2 = list(eng.generate(turn2, GREEDY))[-1]
    assert ev2.usage.cached_tokens == 0 and eng.prefix_hit_rate() == 0.0
    assert ev2.token_ids == alone(hybrid_path, [turn2], config)[0]
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


def test_auto_backend_is_cpu_for_recurrent_models():
    # the one backend with a state pool so far, wherever auto would otherwise pick mlx or llama.cpp
    assert choose_backend("auto", "gguf", recurrent=True) == "cpu"


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


def test_qwen35_state_pool_holds_conv_tails_and_delta_matrices(tmp_path):
    path = write_tiny_model(tmp_path / "tiny-qwen35.gguf", "qwen35", seed=14)
    config = EngineConfig(n_ctx=128, n_threads=2, max_seqs=3)
    eng = LLM.load(path, config).engine
    cfg = load_model(path).config
    # 3 gated delta net layers x ((width 4 - 1) x 256 conv channels + 4 value heads x 32 x 32), float32
    assert cfg.recurrent_layers == (0, 1, 3) and [g.layers for g in cfg.kv_groups] == [(2,)]
    assert cfg.state_bytes() == 3 * (3 * 256 + 4 * 32 * 32) * 4 == eng.runner.state_bytes_per_seq()
    assert eng.states.nbytes == 3 * cfg.state_bytes()
    assert eng.states.layer(3, "delta").shape == (3, 4, 32, 32) and eng.states.layer(3, "conv").shape == (3, 3, 256)


@pytest.mark.parametrize("key, value, message", [
    ("ssm.state_size", None, "ssm.state_size is missing"),
    ("ssm.inner_size", 100, "must be time_step_rank 4 \\* state_size 32"),
    ("ssm.group_count", 3, "a multiple of group_count 3"),
    ("ssm.conv_kernel", 1, "ssm.conv_kernel 1 is out of range"),
    ("full_attention_interval", 0, "must be positive"),
    ("full_attention_interval", 5, "every layer recurrent"),
    ("nextn_predict_layers", 1, "multi-token-prediction"),
    ("rope.dimension_sections", np.array([2, 2, 1, 1], np.int32), "extra section"),
])
def test_qwen35_metadata_refused(tmp_path, key, value, message):
    meta = dict(load_model(write_tiny_model(tmp_path / "q.gguf", "qwen35", seed=2)).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.layer_recurrent == (True, True, False, True) and cfg.ssm_conv_channels == 256
    if value is None:
        del meta[f"qwen35.{key}"]
    else:
        meta[f"qwen35.{key}"] = value
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_metadata(meta)


def test_qwen35_recurrent_layers_flags_win_over_the_interval(tmp_path):
    # llama.cpp reads attention.recurrent_layers (a flag per layer) first, full_attention_interval
    # only without it
    meta = dict(load_model(write_tiny_model(tmp_path / "q.gguf", "qwen35", seed=2)).metadata)
    meta["qwen35.attention.recurrent_layers"] = np.array([False, True, True, False])
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.recurrent_layers == (1, 2) and [g.layers for g in cfg.kv_groups] == [(0, 3)]
    meta["qwen35.attention.recurrent_layers"] = np.array([True, False])
    with pytest.raises(ModelConfigError, match="a flag for each of 4 layers"):
        ModelConfig.from_metadata(meta)
