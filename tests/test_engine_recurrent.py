"""The engine on a hybrid model (lfm2: short convolutions, lfm2moe: with experts, qwen35: gated delta
nets, qwen35moe and qwen3next: with experts, granitehybrid: Mamba-2, and with experts and an
ungated shared expert, each with a per-sequence state
beside the paged KV cache), on the backends that keep such a state: batching, chunking and
preemption change nothing a request computes, state slots are taken on admission and given back at
every end, the memory accounting counts them, the prefix cache serves a chat's next turn from a
state snapshot (engine/state_slots.py) and speculation restores a state when a draft is rejected,
both giving a cold run's tokens; and which lfm2, lfm2moe, qwen35 and granitehybrid metadata is
refused (and the widths of qwen35moe's and granitehybrid's experts)."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_runs import alone, run_all, tiny_prompts
from helpers.tiny_models import write_tiny_model
from infer.engine.engine import Engine, EngineConfig
from infer.engine.llm import LLM, choose_backend
from infer.engine.sampler import SamplingParams
from infer.engine.speculative import SpecConfig
from infer.models.config import ModelConfig, ModelConfigError
from infer.models.loader import load_model


@pytest.fixture(scope="module")
def lfm2_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("hybrid") / "tiny-lfm2.gguf", "lfm2", seed=14)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """arch -> the path of its tiny model (written once per module)."""
    made = {}

    def get(arch: str):
        if arch not in made:
            # seed 14, but 15 for granitehybrid-moe, whose model of seed 14 answers one of tiny_prompts
            # with EOS at once (the batched test wants 8 sequences running together)
            seed = 15 if arch == "granitehybrid-moe" else 14
            made[arch] = write_tiny_model(tmp_path_factory.mktemp("hybrid") / f"tiny-{arch}.gguf", arch, seed=seed)
        return made[arch]

    return get


# each hybrid architecture on each backend whose kernels keep its state (backends/base.py's STATE_KINDS)
RUNS = [("lfm2", "cpu"), ("qwen35", "cpu"), ("lfm2", "mlx"), ("qwen35", "mlx"), ("lfm2moe", "cpu"),
        ("lfm2moe", "mlx"), ("granitehybrid", "cpu"), ("granitehybrid", "mlx"), ("qwen35moe", "cpu"),
        ("qwen3next", "cpu"), ("qwen35moe", "mlx"), ("qwen3next", "mlx"), ("granitehybrid-moe", "cpu")]


def _backend(name: str) -> str:
    """A backend with a state pool, skipped where it is not installed."""
    if name == "mlx":
        pytest.importorskip("mlx.core", reason="the mlx backend needs MLX (pip install infer[mlx])")
    return name


def _slots_all_free(eng) -> bool:
    states = eng.scheduler.states
    return states.n_free == states.n_slots and not states.held()


@pytest.mark.slow  # a few seconds alone, longer when other work shares the two cores
@pytest.mark.parametrize("arch, backend, cache_type", [(a, b, c) for a, b in RUNS for c in ("f16", "q8_0")
                                                       if b == "cpu" or c == "f16"])
def test_batched_equals_alone_hybrid(hybrid, arch, backend, cache_type):
    path = hybrid(arch)
    # a small token budget: prompts are chunked differently together than alone, so each sequence's
    # state is carried across chunks at other places (mlx keeps its KV cache in f16 only)
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=8, max_batch_tokens=40, cache_type_k=cache_type,
                          cache_type_v=cache_type, backend=_backend(backend))
    prompts = tiny_prompts()
    llm = LLM.load(path, config)
    together, widest = run_all(llm, prompts)
    assert widest == 8
    assert together == alone(path, prompts, config)
    assert all(len(t) > 0 for t in together)
    assert _slots_all_free(llm.engine) and llm.engine.usage().blocks_used == (0,)


@pytest.mark.parametrize("arch, backend", [r if r[1] == "cpu" else pytest.param(*r, marks=pytest.mark.slow) for r in RUNS])
def test_preemption_rebuilds_the_state(hybrid, arch, backend):  # mlx: 6-9 s
    path = hybrid(arch)
    roomy = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64, backend=_backend(backend))
    eng0 = LLM.load(path, roomy).engine
    per_block, state = eng0.blocks.block_bytes[0], eng0.states.nbytes
    # room for the states and little more than one full-context sequence's blocks: the newest are
    # preempted, and recomputed from their first token, state and all
    tight = EngineConfig(n_ctx=128, n_threads=2, max_seqs=8, max_batch_tokens=64, backend=backend,
                         kv_memory=state + int(1.3 * 8 * per_block))
    eng = LLM.load(path, tight).engine
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
    assert eng.scheduler.n_preempted > 0 and eng.scheduler.snapshots.restored > 0  # some restarts from a snapshot
    assert [out[i] for i in ids] == alone(path, prompts, roomy, params)
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_state_slots_freed_on_finish_and_cancel(lfm2_path):
    eng = LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=2)).engine
    # two running slots, then 4 snapshots per --parallel (kv_sizing.state_snapshots)
    assert eng.scheduler.states.n_slots == 2 and eng.states.n_slots == 2 + 8
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


# logprobs too: the tiny model's greedy tokens hardly move with its state, its logprobs do (a
# state restored wrong, or not at all, changes them by ~1 where the tokens may stay the same)
LONG = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)


def _run(eng, prompts, params=LONG) -> list[tuple[list[int], list]]:
    """Every prompt at once on eng: (tokens, their logprobs) of each."""
    ids = [eng.add_request(p, params, keep_events=False) for p in prompts]
    out: dict[int, tuple[list[int], list]] = {i: ([], []) for i in ids}
    while eng.has_work():
        for ev in eng.step():
            out[ev.request_id][1].extend(ev.logprobs or [])
            if ev.finish_reason is not None:
                out[ev.request_id][0].extend(ev.token_ids)
    return [out[i] for i in ids]


def _cold(path, prompts, config, params=LONG) -> list[tuple[list[int], list]]:
    return [_run(LLM.load(path, config).engine, [p], params)[0] for p in prompts]


def _count_prefill(eng) -> list[int]:
    """Tokens each forward pass of eng computes, appended as it runs."""
    counts: list[int] = []
    forward = eng.runner.forward_batch

    def spy(batch, pool, states=None):
        counts.append(len(batch.tokens))
        return forward(batch, pool, states)
    eng.runner.forward_batch = spy
    return counts


@pytest.mark.parametrize("arch, backend", RUNS)
def test_second_turn_reuses_the_prefix(hybrid, arch, backend):
    # a chat's next turn starts from the state snapshot at the previous turn's last full block
    # (engine/state_slots.py): only the tail is prefilled, and the tokens and logprobs are a cold run's
    config = EngineConfig(n_ctx=256, n_threads=2, backend=_backend(backend))
    eng = LLM.load(hybrid(arch), config).engine
    bs = config.block_size
    counts = _count_prefill(eng)
    first = [1] + list(range(10, 60))  # 51 tokens: its prompt-end snapshot is at 48
    out1 = _run(eng, [first])[0]
    assert eng.blocks.hit_tokens == 0 and len(out1[0]) == 24
    turn2 = first + out1[0] + [5, 6, 7]  # 78 tokens; turn 1 computed 51 + 23 = 74, last boundary 64
    del counts[:]
    out2 = _run(eng, [turn2])[0]
    assert eng.blocks.hit_tokens == 64 == (len(first) + 24 - 1) // bs * bs
    assert counts[0] == len(turn2) - 64 == 14  # the prefill: the tail only
    assert sum(counts) == 14 + 23
    assert out2 == _cold(hybrid(arch), [turn2], config)[0]
    # the same first prompt again: its prompt-end snapshot (48)
    assert _run(eng, [first])[0] == out1 and eng.blocks.hit_tokens == 64 + 48
    # cached blocks past the newest snapshot inside them fall back to it: turn 2's blocks reach 80,
    # but its moving snapshot went on to 96 (computed 101), so the snapshot at its prompt's end, 64
    third = turn2 + out2[0][:4] + [7] * 5
    assert eng.blocks.cached_prefix(third) == 80
    assert _run(eng, [third])[0] == _cold(hybrid(arch), [third], config)[0]
    assert eng.blocks.hit_tokens == 64 + 48 + 64
    # a match with no snapshot at all inside it: from zero (the first prompt's blocks end at 32, its state at 48)
    fourth = first[:40] + [9] * 10
    assert eng.blocks.cached_prefix(fourth) == 32
    assert _run(eng, [fourth])[0] == _cold(hybrid(arch), [fourth], config)[0]
    assert eng.blocks.hit_tokens == 64 + 48 + 64
    assert eng.scheduler.snapshots.restored == 3
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_cancelled_sequence_leaves_usable_snapshots(lfm2_path):
    # cancelled mid-generation: its slot and blocks come back, and the snapshots it left (its
    # prompt's end, its newest boundary) serve the next request over the same tokens
    config = EngineConfig(n_ctx=256, n_threads=2, max_seqs=2)
    eng = LLM.load(lfm2_path, config).engine
    prompt = [1] + list(range(30, 70))  # 41 tokens: prompt-end snapshot at 32
    rid = eng.add_request(prompt, LONG, keep_events=False)
    eng.step()
    seq = eng.scheduler.running[0]
    while len(seq.output) < 12:  # computed 41 + 11 = 52: the newest boundary is 48
        eng.step()
    got = list(seq.output)
    eng.cancel(rid)
    eng.step()
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)
    again = prompt + got[:7] + [5, 6]  # blocks to 48, the snapshot there
    assert _run(eng, [again])[0] == _cold(lfm2_path, [again], config)[0]
    assert eng.blocks.hit_tokens == 48 and eng.scheduler.snapshots.restored == 1
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


@pytest.mark.slow  # a few seconds alone, longer when other work shares the two cores
def test_shared_prefixes_under_eviction(lfm2_path):
    # many conversations over shared prefixes, batched, with 3 snapshot slots for 4 running
    # sequences and a tight KV pool: snapshots and blocks are evicted, and what is found still
    # gives a cold run's tokens
    roomy = EngineConfig(n_ctx=256, n_threads=2, max_seqs=4, max_batch_tokens=64)
    eng0 = LLM.load(lfm2_path, roomy).engine
    per_block, state = eng0.blocks.block_bytes[0], eng0.runner.state_bytes_per_seq()
    tight = EngineConfig(n_ctx=256, n_threads=2, max_seqs=4, max_batch_tokens=64, state_snapshots=3,
                         kv_memory=(4 + 3) * state + 40 * per_block)
    eng = LLM.load(lfm2_path, tight).engine
    assert eng.states.n_slots == 4 + 3
    base = [1] + list(range(10, 45))
    prompts = [base + list(range(100 + 7 * i, 110 + 9 * i)) for i in range(6)]
    outs = _run(eng, prompts)
    turn2 = [p + o[0] + [5, 6, 7 + i] for i, (p, o) in enumerate(zip(prompts, outs))]
    outs2 = _run(eng, turn2)
    snaps = eng.scheduler.snapshots
    assert len(snaps) <= 3 and snaps.evicted > 0 and snaps.restored > 0 and eng.blocks.hit_tokens > 0
    assert outs == _cold(lfm2_path, prompts, roomy)
    assert outs2 == _cold(lfm2_path, turn2, roomy)
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_memory_accounting_counts_the_state_pool(lfm2_path):
    config = EngineConfig(n_ctx=128, n_threads=2, max_seqs=4)
    eng = LLM.load(lfm2_path, config).engine
    cfg = load_model(lfm2_path).config
    # 3 short-convolution layers x (L - 1 = 2) x n_embd 256 float32, per sequence
    assert cfg.state_bytes() == 3 * 2 * 256 * 4 == eng.runner.state_bytes_per_seq()
    # 4 running slots and 16 snapshot slots (kv_sizing.state_slots_needed)
    assert eng.states.nbytes == (4 + 16) * cfg.state_bytes()
    assert Engine.kv_pool_bytes(ModelConfig.from_metadata(load_model(lfm2_path).metadata), config) == \
        eng.usage().bytes_total + eng.states.nbytes
    # --kv-memory holds both: what the states take is not there for blocks
    one_seq = eng.blocks.block_bytes[0] * (128 // config.block_size)
    with pytest.raises(ValueError, match="recurrent state of --parallel 4 sequences"):
        LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=4, kv_memory=one_seq))
    fits = LLM.load(lfm2_path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=4,
                                            kv_memory=one_seq + 20 * cfg.state_bytes())).engine
    assert fits.usage().blocks_total == (128 // config.block_size,)


@pytest.mark.parametrize("arch, backend", RUNS)
def test_spec_ngram_equals_plain(hybrid, arch, backend):
    # a draft token rejected puts the state back to before the step (engine/state_slots.py): tokens
    # and logprobs are plain decoding's; prompts that repeat make the ngram drafter (n = 1) propose,
    # and the model rejects some (without the restore, logprobs differ by up to 0.9); one token
    # repeated gives the prompts whose drafts the tiny qwen3next (no echo of its prompt) takes, once
    # each on cpu and on mlx (measured: 3 and 5 do, 7, 42, 100, 250 not on both)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=3)
    prompts = [[1] + [10, 11, 12, 13, 14] * 8, [1] + list(range(20, 40)) * 3, [1] + [62, 5, 224, 6] * 6,
               [1] + [9, 3, 14, 4] * 5, [1] + [3] * 20, [1] + [5] * 30]
    plain = EngineConfig(n_ctx=256, n_threads=2, max_seqs=4, backend=_backend(backend))
    spec = EngineConfig(n_ctx=256, n_threads=2, max_seqs=4, backend=backend,
                        spec=SpecConfig(kind="ngram", ngram_n=1, draft_max=4))
    eng = LLM.load(hybrid(arch), spec).engine
    assert eng.states.n_slots == 4 + 4 + 16  # a scratch slot per running sequence
    got = _run(eng, prompts, params)
    assert eng.drafted > eng.accepted > 0  # drafts accepted, and some rejected
    assert got == _run(LLM.load(hybrid(arch), plain).engine, prompts, params)
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_spec_draft_model_equals_plain(lfm2_path, tmp_path):
    # a draft model (a tiny qwen2 of the same vocabulary, mostly wrong) for the hybrid target:
    # the same restore on rejection, tokens and logprobs are plain decoding's
    draft = write_tiny_model(tmp_path / "d.gguf", "qwen2", seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=3)
    prompts = [[1, 5, 7, 9] * k for k in (1, 2, 5)]
    spec = EngineConfig(n_ctx=256, n_threads=2, max_seqs=4, spec=SpecConfig("draft", draft=str(draft), draft_max=4))
    eng = LLM.load(lfm2_path, spec).engine
    got = _run(eng, prompts, params)
    assert eng.drafted > eng.accepted
    assert got == _run(LLM.load(lfm2_path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=4)).engine, prompts, params)
    assert _slots_all_free(eng) and eng.usage().blocks_used == (0,)


def test_auto_backend_for_recurrent_models(monkeypatch, hybrid):
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
    assert choose_backend("auto", "gguf", ("conv",)) == "cpu"
    assert choose_backend("auto", "gguf", ("conv", "ssm")) == "cpu"
    assert choose_backend("auto", "gguf", ()) == "llama.cpp"
    if not real_probe("mlx").available:
        pytest.skip("MLX is not installed: auto's choice of mlx on Apple Silicon (pip install infer[mlx])")
    monkeypatch.setattr(registry, "is_apple_silicon", lambda: True)
    assert choose_backend("auto", "gguf", ("conv",)) == "mlx"
    assert choose_backend("auto", "gguf", ("conv", "delta")) == "mlx"  # qwen35's gated delta nets too
    assert choose_backend("auto", "gguf", ("conv", "ssm")) == "mlx"  # and granitehybrid's Mamba-2 mixers
    # and what auto picks runs the model: the same tokens as the cpu kernels' engine gives
    few = SamplingParams(temperature=0.0, max_tokens=8)
    for arch in ("lfm2", "qwen35", "granitehybrid"):
        llm = LLM.load(hybrid(arch), EngineConfig(n_ctx=128, n_threads=2))
        assert llm.backend == "mlx" and llm.engine.states is not None
        got = list(llm.engine.generate([1, 5, 6, 7], few))[-1].token_ids
        cpu = EngineConfig(n_ctx=128, n_threads=2, backend="cpu")
        assert got == alone(hybrid(arch), [[1, 5, 6, 7]], cpu, few)[0], arch


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


@pytest.mark.parametrize("key, value, message", [
    ("expert_gating_func", 1, "expert_gating_func 1 is not supported"),
    ("expert_gating_func", None, "expert_gating_func is missing"),
    ("leading_dense_block_count", 5, "leading_dense_block_count 5 is out of range"),
    ("attention.head_count_kv", np.array([0, 2, 2], np.uint32), "3 values for 4 layers"),
])
def test_lfm2moe_metadata_refused(hybrid, key, value, message):
    # lfm2's layer kinds, a dense first layer, then experts under a sigmoid router (the only gating
    # llama.cpp's converter writes for it)
    meta = dict(load_model(hybrid("lfm2moe")).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.recurrent_layers == (0, 1, 3) and cfg.n_layer_dense_lead == 1
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (6, 2, 256)
    if value is None:
        del meta[f"lfm2moe.{key}"]
    else:
        meta[f"lfm2moe.{key}"] = value
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
    n = eng.states.n_slots  # the running sequences' and the snapshots' (engine/state_slots.py)
    assert n > 3 and eng.states.nbytes == n * cfg.state_bytes()
    assert eng.states.layer(3, "delta").shape == (n, 4, 32, 32) and eng.states.layer(3, "conv").shape == (n, 3, 256)


@pytest.mark.parametrize("key, value, message", [
    ("ssm.state_size", None, "ssm.state_size is missing"),
    ("ssm.inner_size", 100, "must be time_step_rank 4 \\* state_size 32"),
    ("ssm.group_count", 3, "a multiple of group_count 3"),
    ("ssm.conv_kernel", 1, "ssm.conv_kernel 1 is out of range"),
    ("full_attention_interval", 0, "must be positive"),
    ("full_attention_interval", 5, "every layer recurrent"),
    ("nextn_predict_layers", 4, "nextn_predict_layers 4 is out of range"),  # as many as block_count
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


def test_granitehybrid_state_pool_holds_conv_tails_and_scan_states(tmp_path):
    path = write_tiny_model(tmp_path / "tiny-granitehybrid.gguf", "granitehybrid", seed=14)
    eng = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2, max_seqs=3)).engine
    cfg = load_model(path).config
    # 3 Mamba-2 layers x ((width 4 - 1) x (512 + 2 groups x 2 x 16) conv channels + 8 heads x 64 x 16), float32
    assert cfg.recurrent_layers == (0, 2, 3) and [g.layers for g in cfg.kv_groups] == [(1,)] and not cfg.rope
    assert cfg.state_bytes() == 3 * (3 * 576 + 8 * 64 * 16) * 4 == eng.runner.state_bytes_per_seq()
    n = eng.states.n_slots
    assert eng.states.layer(3, "ssm").shape == (n, 8, 64, 16) and eng.states.layer(3, "conv").shape == (n, 3, 576)


@pytest.mark.parametrize("key, value, message", [
    ("ssm.state_size", None, "ssm.state_size is missing"),
    ("ssm.inner_size", 1024, "1024 must be twice embedding_length 256"),
    ("ssm.time_step_rank", 7, "a multiple of time_step_rank 7"),
    ("ssm.group_count", 3, "a multiple of group_count 3"),
    ("ssm.conv_kernel", 1, "ssm.conv_kernel 1 is out of range"),
    ("attention.head_count_kv", np.array([0, 2, 0], np.uint32), "3 values for 4 layers"),
    ("attention.head_count_kv", np.array([0, 0, 0, 0], np.uint32), "one positive KV head count"),
    # experts (Granite 4.0 H Tiny, Small) run, but not without a count of them per token
    ("expert_count", 4, r"needs 0 < expert_used_count <= expert_count, got 0 of 4"),
])
def test_granitehybrid_metadata_refused(tmp_path, key, value, message):
    meta = dict(load_model(write_tiny_model(tmp_path / "g.gguf", "granitehybrid", seed=2)).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert cfg.layer_recurrent == (True, False, True, True) and cfg.ssm_conv_channels == 576 and cfg.mamba2
    if value is None:
        del meta[f"granitehybrid.{key}"]
    else:
        meta[f"granitehybrid.{key}"] = value
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_metadata(meta)


def test_granitehybrid_expert_widths(tmp_path):
    # as llama.cpp: its experts are feed_forward_length wide, and its ungated shared expert exists
    # where expert_shared_feed_forward_length > 0 in a file with experts (the dense Granite 4.0 H
    # files have the key too, the shared MLP's width, which is their dense FFN)
    model = load_model(write_tiny_model(tmp_path / "g.gguf", "granitehybrid-moe", seed=2))
    cfg, meta = model.config, dict(model.metadata)
    assert (cfg.n_ff, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_expert, cfg.n_expert_used) == (512, 512, 256, 8, 3)
    assert all(lw.experts and lw.shexp is not None and lw.shexp_gate is None for lw in model.weights.layers)
    del meta["granitehybrid.expert_shared_feed_forward_length"]
    assert ModelConfig.from_metadata(meta).n_ff_shexp == 0
    for key in ("expert_count", "expert_used_count"):
        del meta[f"granitehybrid.{key}"]
    meta["granitehybrid.expert_shared_feed_forward_length"] = 512
    assert ModelConfig.from_metadata(meta).n_ff_shexp == 0


def test_shared_expert_widths(tmp_path):
    # qwen35moe's files have no feed_forward_length (nothing dense to size): its experts' and shared
    # expert's widths are their own keys, and without them (nor feed_forward_length) it is refused
    meta = dict(load_model(write_tiny_model(tmp_path / "q.gguf", "qwen35moe", seed=2)).metadata)
    cfg = ModelConfig.from_metadata(meta)
    assert "qwen35moe.feed_forward_length" not in meta
    assert (cfg.n_ff, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_expert, cfg.n_expert_used) == (0, 256, 256, 8, 2)
    del meta["qwen35moe.expert_shared_feed_forward_length"]
    with pytest.raises(ModelConfigError, match="no expert width"):
        ModelConfig.from_metadata(meta)
    meta["qwen35moe.feed_forward_length"] = 512  # llama.cpp's default for the shared expert's width
    assert ModelConfig.from_metadata(meta).n_ff_shexp == 512
