"""Per architecture: our logits on a tiny random-weight GGUF match llama.cpp's at every position."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.logits import N_CTX, PROMPT, LlamaCppRuns, assert_matches_llama_cpp, llama_cpp_logits
from helpers.tiny_models import DECODERS, tiny_seed, write_tiny_model
from infer.backends.base import BackendError
from infer.backends.cpu.runner import CpuRunner
from infer.models.config import ModelConfig, ModelConfigError
from infer.models.loader import load_model

# every registered architecture, and llama with experts (Mixtral), granitehybrid with experts (Granite 4.0 H Tiny),
# glm4moe without Q/K norms and the optional MoE keys (GLM-4.5-Air), deepseek2 as DeepSeek-V2-Lite (no Q
# compression, softmax gating), gemma4 with shared-KV layers and with per-layer embeddings (E2B's),
# and with experts beside its dense FFN (26B-A4B's); DeepSeek-V2-Lite in the older layout (attn_kv_b unsplit, which
# llama.cpp runs unabsorbed with a K/V cache per head, and infer splits at load; the other deepseek2 in that
# layout: test_deepseek2_older_layout_matches_llama_cpp)
ARCHS = [*DECODERS, "llama-moe", "granitehybrid-moe", "glm4moe-air", "deepseek2-lite", "gemma4-shared", "gemma4-ple",
         "gemma4-moe", "deepseek2-lite-kvb"]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    arch = request.param
    path = write_tiny_model(tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf", arch, seed=tiny_seed(arch))
    return arch, path


@pytest.fixture(scope="module")
def llama_cpp_runs(tiny):
    """The tiny model's llama.cpp logits, each configuration run once for all the tests below."""
    return LlamaCppRuns(tiny[1])


@pytest.mark.reference
def test_logits_match_llama_cpp(tiny, llama_cpp_runs):
    arch, path = tiny
    model = load_model(path).for_context(N_CTX)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    agree = assert_matches_llama_cpp(ours, path, arch, runs=llama_cpp_runs)
    assert agree.sum() >= len(PROMPT) - 2, f"{arch}: llama.cpp disagrees with itself too often to be a reference"


@pytest.mark.reference
@pytest.mark.parametrize("types", [("q8_0", "f16"), ("q8_0", "q8_0"), ("f16", "q8_0")], ids="-".join)
def test_quantized_kv_cache_matches_llama_cpp(tiny, types, llama_cpp_runs):
    # --cache-type-k/-v q8_0 against llama.cpp with the same cache types, on the path llama.cpp runs
    # them (a quantized V only with flash attention): as close as the f16 cache is to llama.cpp's
    # (test_logits_match_llama_cpp's bound), and the cache type does change our logits (it took effect).
    arch, path = tiny
    model = load_model(path).for_context(N_CTX)
    if model.config.kv_v_in_k and types[0] != types[1]:  # MLA: V is K's latent; llama.cpp refuses two types too
        with pytest.raises(BackendError, match="must be the same"):
            CpuRunner(model.config, model.weights, cache_type_k=types[0], cache_type_v=types[1])
        if not arch.endswith("-kvb"):  # the older layout: llama.cpp's unabsorbed path caches K and V apart
            with pytest.raises(ValueError):
                llama_cpp_logits(path, PROMPT, flash_attn=True, cache_types=types)
        return

    def ours(cache_types):
        runner = CpuRunner(model.config, model.weights, n_threads=2, cache_type_k=cache_types[0],
                                cache_type_v=cache_types[1])
        return runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()

    fa = types[1] != "f16"
    ref = llama_cpp_logits(path, PROMPT, flash_attn=fa, cache_types=types)
    f16_ref, f16_other = (llama_cpp_runs.logits(flash_attn=a) for a in (fa, not fa))
    mine, mine_f16 = ours(types), ours(("f16", "f16"))
    tol = max(0.02 * np.abs(ref).max(), np.abs(f16_ref - f16_other).max())
    diff = np.abs(mine - ref).max()
    print(f"{arch} K {types[0]} V {types[1]}: max|ours-llama.cpp| {diff:.4g} (f16 cache: "
          f"{np.abs(mine_f16 - f16_ref).max():.4g}); the cache type moves our logits by {np.abs(mine - mine_f16).max():.4g}")
    assert diff <= tol, f"{arch}: max |diff| {diff:.4g} > bound {tol:.4g}"
    assert not np.array_equal(mine, mine_f16), "the cache type changed nothing"
    agree = f16_ref.argmax(-1) == f16_other.argmax(-1)
    assert (mine.argmax(-1) == ref.argmax(-1))[agree].all()


def assert_same_logits(a: np.ndarray, b: np.ndarray, arch: str) -> None:
    """Equal up to float summation order. The tiny gemma3 amplifies 1-ulp differences into flipped
    f16/Q8 roundings (llama.cpp's own paths differ by ~5% on it), so there: same argmax and within 2%."""
    if arch == "gemma3":
        np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
        assert np.abs(a - b).max() <= 0.02 * np.abs(b).max()
    else:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_kv_cache_decode_matches_full_recompute(tiny, cache_type):
    arch, path = tiny
    model = load_model(path).for_context(N_CTX)
    runner = CpuRunner(model.config, model.weights, n_threads=2, cache_type_k=cache_type, cache_type_v=cache_type)
    full = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    cache = runner.new_kv_cache(64)
    steps = [runner.forward(PROMPT[:10], 0, cache).copy()[0]]
    for i in range(10, len(PROMPT)):
        steps.append(runner.forward(PROMPT[i:i + 1], i, cache).copy()[0])
    assert_same_logits(np.stack(steps), full[9:], arch)


def test_prefill_in_chunks_matches_one_pass(tiny):
    # Chunked prefill (chunks of 5) must agree with one 16-token pass.
    arch, path = tiny
    model = load_model(path).for_context(N_CTX)
    runner = CpuRunner(model.config, model.weights, n_threads=2, max_tokens=5)
    cache = runner.new_kv_cache(64)
    last = runner.forward(PROMPT, 0, cache).copy()
    one = CpuRunner(model.config, model.weights, n_threads=2)
    ref = one.forward(PROMPT, 0, one.new_kv_cache(64)).copy()
    assert_same_logits(last, ref, arch)


@pytest.mark.reference
def test_longrope_factors_follow_the_context(tmp_path):
    # phi3's LongRoPE: llama.cpp rotates by the short factors while its context (a multiple of 256)
    # is within the trained one (256 tokens in the tiny model), by the long ones beyond;
    # Model.for_context picks the same.
    path = write_tiny_model(tmp_path / "tiny-phi3.gguf", "phi3", seed=7)
    model = load_model(path)
    out = {}
    for n_ctx in (N_CTX, 300):
        m = model.for_context(n_ctx)
        runner = CpuRunner(m.config, m.weights, n_threads=2)
        out[n_ctx] = runner.forward(PROMPT, 0, runner.new_kv_cache(n_ctx), all_logits=True).copy()
        ref = llama_cpp_logits(path, PROMPT, n_ctx=n_ctx)
        diff = np.abs(out[n_ctx] - ref).max()
        print(f"n_ctx {n_ctx}: max|ours-llama.cpp| {diff:.4g}")
        assert diff <= 0.02 * np.abs(ref).max()
    assert np.abs(out[300] - out[N_CTX]).max() > 0.1 * np.abs(out[N_CTX]).max()  # the factors took effect


@pytest.mark.reference
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_yarn_scaling_matches_llama_cpp(tmp_path, arch):
    # YaRN (Qwen's long-context GGUFs): each frequency pair's angle mixed between the scaled and the
    # unscaled one along a ramp set by the original context (16 here: the ramp spans pairs 0-4 of
    # 32, so all three regimes show), and cos/sin grown by 1 + 0.1 ln(factor). On these tiny models
    # reading the file as linear scaling misses llama.cpp by ~5x the bound, without YaRN's
    # magnitude by ~3x.
    path = write_tiny_model(tmp_path / f"yarn-{arch}.gguf", arch, seed=11, rope_scaling=("yarn", 32.0, 16))
    plain = write_tiny_model(tmp_path / f"plain-{arch}.gguf", arch, seed=11)
    prompt = np.arange(1, 60, dtype=np.int32) * 5 % 300
    out = {}
    for p in (path, plain):
        model = load_model(p).for_context(N_CTX)
        runner = CpuRunner(model.config, model.weights, n_threads=2)
        out[p] = runner.forward(prompt, 0, runner.new_kv_cache(N_CTX), all_logits=True).copy()
    ref, ref_fa = llama_cpp_logits(path, prompt), llama_cpp_logits(path, prompt, flash_attn=True)
    tol = max(0.02 * np.abs(ref).max(), np.abs(ref - ref_fa).max())
    diff = np.abs(out[path] - ref).max()
    print(f"{arch} yarn: max|ours-llama.cpp| {diff:.4g}, bound {tol:.4g}")
    assert diff <= tol
    assert (out[path].argmax(-1) == ref.argmax(-1)).sum() >= len(prompt) - 1
    assert np.abs(out[path] - out[plain]).max() > 2 * tol  # the scaling took effect


def ablation_forward(cfg, weights) -> np.ndarray:
    """The prompt's logits at every position on the cpu backend, under a changed config or weights
    (the quirk-ablation tests)."""
    runner = CpuRunner(cfg, weights, n_threads=2)
    return runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()


def with_layers(w, **change):
    """The weights with each layer's named fields replaced by change[name](layer)."""
    from dataclasses import replace

    return replace(w, layers=tuple(replace(ly, **{k: f(ly) for k, f in change.items()}) for ly in w.layers))


@pytest.mark.reference
def test_gpt_oss_quirks_each_move_towards_llama_cpp(tmp_path):
    """gpt-oss's sinks, biases, swiglu_oai, sliding window and YaRN each change the logits by far
    more than infer's distance from llama.cpp: none of them is matched by accident."""
    from dataclasses import replace

    path = write_tiny_model(tmp_path / "tiny-gpt-oss.gguf", "gpt-oss", seed=3)
    model = load_model(path).for_context(N_CTX)
    cfg, w = model.config, model.weights

    run = ablation_forward

    def layers(**change):
        return with_layers(w, **change)

    ref = llama_cpp_logits(path, PROMPT)
    diff = np.abs(run(cfg, w) - ref).max()
    ablations = {
        "no sinks": (cfg, layers(sinks=lambda ly: np.full_like(ly.sinks, -30.0))),
        "no attention output bias": (cfg, layers(bo=lambda ly: np.zeros_like(ly.bo))),
        "no router bias": (cfg, layers(router_bias=lambda ly: np.zeros_like(ly.router_bias))),
        "no expert biases": (cfg, layers(expert_biases=lambda ly: tuple(np.zeros_like(b) for b in ly.expert_biases))),
        "silu": (replace(cfg, architecture=replace(cfg.architecture, activation="silu")), w),
        "no sliding window": (replace(cfg, layer_swa=(False,) * cfg.n_layer), w),
        "no yarn": (replace(cfg, rope_ext_factor=0.0), w),
    }
    for name, (c, weights) in ablations.items():
        off = np.abs(run(c, weights) - ref).max()
        print(f"{name}: {off:.3g} from llama.cpp (infer: {diff:.3g})")
        assert off > 4 * diff, name


@pytest.mark.reference
def test_gemma4_moe_quirks_each_move_towards_llama_cpp(tmp_path):
    """Gemma 4's router input scale, its experts' output scales, its renormalized weights and the
    experts' own norms each change the logits by far more than infer's distance from llama.cpp, and
    by more than the agreement bound (2% of max |logit|)."""
    from dataclasses import replace

    path = write_tiny_model(tmp_path / "tiny-gemma4-moe.gguf", "gemma4-moe", seed=tiny_seed("gemma4-moe"))
    model = load_model(path).for_context(N_CTX)
    cfg, w = model.config, model.weights

    run = ablation_forward

    def layers(**change):
        return with_layers(w, **change)

    ref = llama_cpp_logits(path, PROMPT)
    diff = np.abs(run(cfg, w) - ref).max()
    ablations = {
        "no router input scale": (cfg, layers(router_scale=lambda ly: np.ones_like(ly.router_scale))),
        "no expert output scales": (cfg, layers(expert_scale=lambda ly: None)),
        "weights not renormalized": (replace(cfg, moe_norm_weights=False), w),
        "experts on the dense FFN's input": (cfg, layers(pre_ffn_norm_2=lambda ly: ly.ffn_norm)),
        "no post norm of the experts": (cfg, layers(post_ffn_norm_2=lambda ly: np.ones_like(ly.post_ffn_norm_2))),
    }
    for name, (c, weights) in ablations.items():
        off = np.abs(run(c, weights) - ref).max()
        print(f"{name}: {off:.3g} from llama.cpp (infer: {diff:.3g})")
        assert off > max(4 * diff, 0.02 * np.abs(ref).max()), name


def test_tensors_infer_would_ignore_are_refused(tmp_path):
    # a bias infer has no place for (granite's attn_output.bias, phi3's output.bias) must not be
    # dropped silently: the file is refused in one line naming the tensor
    from infer.models.gguf_file import read_gguf
    from infer.models.weights import ModelLoadError, collect_weights

    g = read_gguf(write_tiny_model(tmp_path / "tiny-granite.gguf", "granite", seed=1))
    model = load_model(g.path)
    extra = {**g.tensors, "blk.0.attn_output.bias": np.zeros(256, np.float32)}
    with pytest.raises(ModelLoadError, match="'blk.0.attn_output.bias' is not supported"):
        collect_weights(extra, g.path, model.config)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_mtp_layers_are_left_out_of_the_config(tmp_path, arch):
    # A multi-token-prediction block, as llama.cpp's converter writes one (the last of block_count's
    # blocks, nextn_predict_layers of them, with their blk.N.nextn.* tensors): llama.cpp runs the
    # blocks before it, and so does infer (the logits: test_mtp_layers_are_skipped_as_llama_cpp_skips_them).
    path = write_tiny_model(tmp_path / f"mtp-{arch}.gguf", arch, seed=tiny_seed(arch), nextn=1)
    plain = load_model(write_tiny_model(tmp_path / f"plain-{arch}.gguf", arch, seed=tiny_seed(arch)))
    model = load_model(path)
    assert model.metadata[f"{arch}.block_count"] == 5 and model.config == plain.config
    # the flags of attention.recurrent_layers count the MTP block too (llama.cpp's converter writes it false)
    meta = dict(model.metadata)
    flags = [*model.config.layer_recurrent, False]
    assert ModelConfig.from_metadata({**meta, f"{arch}.attention.recurrent_layers": flags}).layer_recurrent == \
        model.config.layer_recurrent
    with pytest.raises(ModelConfigError, match="recurrent_layers must give a flag for each of 5 layers"):
        ModelConfig.from_metadata({**meta, f"{arch}.attention.recurrent_layers": flags[:-1]})
    with pytest.raises(ModelConfigError, match=r"nextn_predict_layers 5 is out of range \(0\.\.4"):
        ModelConfig.from_metadata({**meta, f"{arch}.nextn_predict_layers": 5})


@pytest.mark.reference
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next", "glm4moe"])
def test_mtp_layers_are_skipped_as_llama_cpp_skips_them(tmp_path, arch):
    # the logits of the file without the MTP block, to the bit, in llama.cpp and in infer
    path = write_tiny_model(tmp_path / f"mtp-{arch}.gguf", arch, seed=tiny_seed(arch), nextn=1)
    plain = write_tiny_model(tmp_path / f"plain-{arch}.gguf", arch, seed=tiny_seed(arch))
    ref = llama_cpp_logits(path, PROMPT)
    np.testing.assert_array_equal(ref, llama_cpp_logits(plain, PROMPT))
    out = {}
    for p in (path, plain):
        model = load_model(p).for_context(N_CTX)
        runner = CpuRunner(model.config, model.weights, n_threads=2)
        out[p] = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    np.testing.assert_array_equal(out[path], out[plain])
    assert_matches_llama_cpp(out[path], path, arch)


def test_glm4moe_metadata_read_and_refused(tmp_path):
    # GLM-4.5's keys as llama.cpp reads them (expert_weights_norm / _scale: absent, no norm and no
    # scale; the shared width expert_shared_count experts wide), its optional Q/K norms (both or
    # neither), and what infer does not run refused in one line
    from infer.models.gguf_file import read_gguf
    from infer.models.weights import ModelLoadError, collect_weights

    glm = load_model(write_tiny_model(tmp_path / "glm.gguf", "glm4moe", seed=tiny_seed("glm4moe")))
    air = load_model(write_tiny_model(tmp_path / "air.gguf", "glm4moe-air", seed=tiny_seed("glm4moe-air")))
    c = glm.config
    assert (c.moe_norm_weights, c.moe_weights_scale, c.n_ff_shexp, c.n_rot, c.n_layer_dense_lead) == (True, 2.5, 256, 32, 1)
    assert (air.config.moe_norm_weights, air.config.moe_weights_scale, air.config.n_ff_shexp) == (False, 1.0, 512)
    assert glm.weights.layers[1].q_norm is not None and air.weights.layers[1].q_norm is None
    meta = dict(glm.metadata)
    # M-RoPE sections (GLM-4.5V's) whose pairs all take a text token's position: NeoX RoPE, as infer runs
    assert ModelConfig.from_metadata({**meta, "glm4moe.rope.dimension_sections": [8, 4, 4, 0]}).n_rot == 32
    assert ModelConfig.from_metadata({**meta, "glm4moe.expert_weights_scale": 0.0}).moe_weights_scale == 1.0
    for key, value, message in (("expert_gating_func", 1, "expert_gating_func 1 is not supported"),
                                ("expert_group_count", 4, "expert_group_count 4 is not supported"),
                                ("rope.dimension_sections", [8, 4, 0, 4], r"\[8, 4, 0, 4\] rotate some pairs"),
                                ("expert_weights_scale", -1.0, "expert_weights_scale -1.0 must be a positive number"),
                                ("expert_shared_count", 1000, r"expert_shared_count 1000 is out of range")):
        with pytest.raises(ModelConfigError, match=message):
            ModelConfig.from_metadata({**meta, f"glm4moe.{key}": value})
    g = read_gguf(glm.path)
    tensors = {n: t for n, t in g.tensors.items() if n != "blk.1.attn_k_norm.weight"}
    with pytest.raises(ModelLoadError, match="missing tensor 'blk.1.attn_k_norm.weight'"):
        collect_weights(tensors, g.path, glm.config)


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_mla_cache_keeps_one_latent_row_per_token(tmp_path, cache_type):
    # llama.cpp's cache of an MLA model (llama-kv-cache.cpp: is_mla, no V tensor) holds per token
    # and layer n_embd_k_gqa = kv_lora_rank + n_rot values of K alone; so do infer's pools, and the
    # engine's accounting (kv_block_bytes) says as much. Without the latent cache it would hold K and
    # V rows (key_length + value_length), or every head's decompressed K and V.
    path = write_tiny_model(tmp_path / "tiny-deepseek2.gguf", "deepseek2", seed=tiny_seed("deepseek2"))
    cfg = load_model(path).config
    row = cfg.n_lora_kv + cfg.n_rot
    per_value = {"f16": 2, "q8_0": 34 / 32}[cache_type]
    want = round(cfg.n_layer * row * per_value)
    runner = CpuRunner(cfg, load_model(path).weights, n_threads=2, cache_type_k=cache_type, cache_type_v=cache_type)
    pool = runner.new_kv_pool([4], 16)
    assert pool.nbytes == 4 * 16 * want
    assert runner.bytes_per_block(16) == (16 * want,)
    assert cfg.head_dim == row and cfg.n_head_kv == 1


def _v2_lite_metadata() -> dict:
    """DeepSeek-V2-Lite's hyperparameters as llama.cpp's converter writes them (no tensors)."""
    a = "deepseek2."
    return {"general.architecture": "deepseek2", a + "embedding_length": 2048, a + "block_count": 27,
            a + "attention.head_count": 16, a + "attention.head_count_kv": 1, a + "attention.key_length": 576,
            a + "attention.value_length": 512, a + "attention.key_length_mla": 192,
            a + "attention.value_length_mla": 128, a + "attention.kv_lora_rank": 512, a + "rope.dimension_count": 64,
            a + "feed_forward_length": 10944, a + "expert_count": 64, a + "expert_used_count": 6,
            a + "expert_feed_forward_length": 1408, a + "expert_shared_count": 2, a + "leading_dense_block_count": 1,
            a + "context_length": 163840, a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": 40.0,
            a + "rope.scaling.original_context_length": 4096, a + "rope.scaling.yarn_log_multiplier": 0.0707,
            a + "expert_weights_scale": 1.0, a + "vocab_size": 102400}


def test_deepseek2_v2_lite_hyperparameters():
    # as llama.cpp reads them: no q_lora_rank at 27 layers; the cache's one KV head of latent | RoPE
    # part; deepseek2.cpp's kq_scale mscale^2 / sqrt(key_length_mla), mscale = 1 + 0.1 * 0.707 ln 40;
    # YaRN's cos/sin magnitude cancelled (llama-context.cpp's yarn_attn_factor 1 / (1 + 0.1 ln 40))
    cfg = ModelConfig.from_metadata(_v2_lite_metadata())
    assert (cfg.n_lora_q, cfg.n_lora_kv, cfg.head_dim, cfg.head_dim_v, cfg.n_head_kv) == (0, 512, 576, 512, 1)
    assert (cfg.moe_gating, cfg.moe_norm_weights, cfg.n_ff_shexp) == ("softmax", False, 2 * 1408)
    mscale = 1 + 0.1 * 0.707 * np.log(40)
    assert cfg.attn_scale == pytest.approx(mscale ** 2 / np.sqrt(192), rel=1e-6)
    assert cfg.rope_attn_factor == pytest.approx(1 / (1 + 0.1 * np.log(40)), rel=1e-6)


def _v2_lite_old_metadata() -> dict:
    """DeepSeek-V2-Lite's hyperparameters as the converter wrote them before it split attn_kv_b:
    no *_mla keys, K and V per head (key_length nope + RoPE, value_length V, a KV head per head)."""
    a = "deepseek2."
    meta = {k: v for k, v in _v2_lite_metadata().items() if not k.endswith("_mla")}
    return {**meta, a + "attention.key_length": 192, a + "attention.value_length": 128,
            a + "attention.head_count_kv": 16}


def test_deepseek2_older_layout_runs_as_mla():
    # the older files' K/V head sizes are MLA's, and infer's cache is the latent one all the same
    # (one KV head of kv_lora_rank + RoPE part), with the new layout's scale and RoPE factors
    old, new = ModelConfig.from_metadata(_v2_lite_old_metadata()), ModelConfig.from_metadata(_v2_lite_metadata())
    assert (old.head_dim_k_mla, old.head_dim_v_mla, old.head_dim, old.head_dim_v, old.n_head_kv) == (192, 128, 576, 512, 1)
    assert old == new


@pytest.mark.parametrize("change, match", [({"attention.key_length_mla": None}, "go together"),
                                           ({"attention.kv_lora_rank": None}, "kv_lora_rank is needed")])
def test_deepseek2_without_mla_keys_is_refused(change, match):
    # one MLA size without the other (llama.cpp asserts both or neither), or no latent rank
    meta = _v2_lite_metadata()
    for key in change:
        del meta["deepseek2." + key]
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_metadata(meta)


@pytest.mark.parametrize("key, value", [("attention.head_count_kv", 1), ("attention.key_length", 64),
                                        ("attention.kv_lora_rank", 9000)])
def test_deepseek2_older_layout_is_checked(key, value):
    # llama.cpp's unabsorbed path caches K/V of every head, K longer than its RoPE part; the latent row is bounded
    meta = {**_v2_lite_old_metadata(), "deepseek2." + key: value}
    with pytest.raises(ModelConfigError, match="older attn_kv_b layout|out of range"):
        ModelConfig.from_metadata(meta)


@pytest.mark.parametrize("variant", ["deepseek2", "deepseek2-lite"])
def test_deepseek2_older_layout_splits_into_the_new_tensors(tmp_path, variant):
    # the same F32 weights in both layouts: attn_kv_b split at load equals attn_k_b and attn_v_b
    # exactly, and so do the logits
    from gguf import GGMLQuantizationType as GT

    from helpers.tiny_deepseek2 import write_tiny_deepseek2
    from infer.models.gguf_file import read_gguf

    new = load_model(write_tiny_deepseek2(tmp_path / "new.gguf", variant, 3, 320, 256, None, GT.F32))
    old = load_model(write_tiny_deepseek2(tmp_path / "old.gguf", variant + "-kvb", 3, 320, 256, None, GT.F32))
    assert old.config == new.config and "blk.0.attn_kv_b.weight" in read_gguf(tmp_path / "old.gguf").tensors
    for lo, ln in zip(old.weights.layers, new.weights.layers):
        for a, b in [*zip(lo.k_b, ln.k_b), *zip(lo.v_b, ln.v_b)]:
            assert a.type_name == "F32" and np.array_equal(a.dequantize(), b.dequantize())
    runners = [CpuRunner(m.config, m.weights, n_threads=2) for m in (old, new)]
    logits = [r.forward(PROMPT, 0, r.new_kv_cache(64), all_logits=True).copy() for r in runners]
    assert np.array_equal(*logits)


@pytest.mark.reference
def test_deepseek2_older_layout_matches_llama_cpp(tmp_path):
    # deepseek2 with a compressed Q, sigmoid gating and YaRN in the older layout, its weights F32: llama.cpp's
    # unabsorbed attention against infer's absorbed one (seeds 15, 17: 0.012%, 0.087% of max |logit| apart,
    # llama.cpp's two attention paths 0.15%, 0.08%; infer 0.16%, 0.085% from an exact float64 pass, llama.cpp
    # 0.15%, 0.03%). In F32 alone: with TINY_SEEDS' mix of quantized types the tiny model's sigmoid router
    # amplifies any difference of rounding past the bound (seeds 15, 17, 18, 19, 21: infer 1.1-16% from
    # llama.cpp, llama.cpp's two paths 1.0-8.7% apart, infer 2.3-16% and llama.cpp 0.95-15% from exact;
    # requantizing attn_kv_b alone moves infer's and llama.cpp's logits alike by 17%)
    from gguf import GGMLQuantizationType as GT

    from helpers.tiny_deepseek2 import write_tiny_deepseek2

    path = write_tiny_deepseek2(tmp_path / "tiny.gguf", "deepseek2-kvb", tiny_seed("deepseek2-kvb"), 320, 256, None,
                                GT.F32)
    model = load_model(path).for_context(N_CTX)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    assert_matches_llama_cpp(ours, path, "deepseek2-kvb")


def test_deepseek2_attn_kv_b_of_the_wrong_shape_is_refused(tmp_path):
    from infer.models.gguf_file import read_gguf
    from infer.models.weights import ModelLoadError, collect_weights
    from infer.quant.tensor import QTensor

    path = write_tiny_model(tmp_path / "tiny.gguf", "deepseek2-lite-kvb", seed=tiny_seed("deepseek2-lite-kvb"))
    g = read_gguf(path)
    tensors = dict(g.tensors)
    kv_b = tensors["blk.1.attn_kv_b.weight"]
    tensors["blk.1.attn_kv_b.weight"] = QTensor(kv_b.type_id, (kv_b.shape[0] // 2, kv_b.shape[1]), kv_b.raw[::2])
    with pytest.raises(ModelLoadError, match="attn_kv_b"):
        collect_weights(tensors, g.path, load_model(path).config)
    tensors["blk.1.attn_kv_b.weight"] = kv_b
    tensors["blk.1.attn_k_b.weight"] = kv_b  # both layouts at once: llama.cpp refuses the tensor left over
    with pytest.raises(ModelLoadError, match="both layouts"):
        collect_weights(tensors, g.path, load_model(path).config)


def test_deepseek2_query_temperature_is_refused():
    # llama.cpp multiplies Q by a temperature that grows with the position where the file says so
    meta = {**_v2_lite_metadata(), "deepseek2.attention.temperature_scale": 0.1}
    with pytest.raises(ModelConfigError, match="temperature_scale"):
        ModelConfig.from_metadata(meta)


def test_deepseek2_cache_layout_is_checked():
    meta = {**_v2_lite_metadata(), "deepseek2.attention.head_count_kv": 16}
    with pytest.raises(ModelConfigError, match="one KV head"):
        ModelConfig.from_metadata(meta)


@pytest.mark.reference
def test_llama4_chunks_match_llama_cpp(tmp_path):
    """Past llama4's first chunk of 8192 positions the RoPE layers attend within their own chunk:
    llama.cpp's logits there, and a sliding window of 8192 instead far from them. The attention
    temperature of the layers without RoPE starts there too (position 8191), and takes effect; on
    this tiny model it moves the logits less than llama.cpp's own rounding spread, so its values
    are checked alone (test_llama4_attention_temperature)."""
    from dataclasses import replace

    from infer.models.arch.llama4 import CHUNK

    n = CHUNK + 64
    path = write_tiny_model(tmp_path / "tiny-llama4.gguf", "llama4", seed=tiny_seed("llama4"), n_ctx=n)
    tokens = np.random.default_rng(5).integers(3, 320, size=n).astype(np.int32)
    model = load_model(path).for_context(n)
    cfg = model.config
    start = CHUNK - 32  # the logits of the first chunk's last positions and the second's first

    def run(c):
        runner = CpuRunner(c, model.weights, n_threads=2, max_tokens=512)
        cache = runner.new_kv_cache(n)
        runner.forward(tokens[:start], 0, cache)
        return runner.forward(tokens[start:], start, cache, all_logits=True).copy()

    ref = llama_cpp_logits(path, tokens, n_ctx=n)[start:]
    ours = run(cfg)
    diff = np.abs(ours - ref).max()
    tol = 0.02 * np.abs(ref).max()
    print(f"llama4 past a chunk: max|ours-llama.cpp| {diff:.4g}, bound {tol:.4g}")
    assert diff <= tol
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    window = np.abs(run(replace(cfg, chunked=False)) - ref).max()
    print(f"a sliding window instead: {window:.3g} from llama.cpp")
    assert window > 4 * diff
    cold = run(replace(cfg, attn_temp_scale=0.0))
    np.testing.assert_array_equal(cold[:31], ours[:31])  # below position 8191 the temperature is 1
    assert not np.array_equal(cold[31:], ours[31:])


def test_llama4_attention_temperature(tmp_path):
    # llama.cpp's llm_graph_input_attn_temp: log(floor((pos + 1) / 8192) + 1) * 0.1f + 1, in double
    path = write_tiny_model(tmp_path / "tiny-llama4.gguf", "llama4", seed=tiny_seed("llama4"))
    cfg = load_model(path).config
    got = cfg.attn_temperature(np.array([0, 8190, 8191, 16382, 16383, 100000], np.int32))
    s = float(np.float32(0.1))
    want = np.float32([1, 1, 1 + s * np.log(2), 1 + s * np.log(2), 1 + s * np.log(3), 1 + s * np.log(13)])
    np.testing.assert_array_equal(got, want)
    assert cfg.layer_nope == (False, False, False, True) and cfg.layer_swa == (True, True, True, False)
    assert cfg.chunked and cfg.sliding_window == 8192 and cfg.kq_l2_norm
    assert [cfg.layer_experts(il) for il in range(4)] == [False, True, False, True]


def test_llama4_layer_plan_as_llama_cpp_reads_it():
    # llama.cpp's llama_model_llama4::load_arch_hparams: a sliding_window of 0 turns the chunks off
    # (every layer global, the no-RoPE step n_layer: only the last layer without RoPE, no
    # temperature); 128 experts (Maverick) have no L2 norm of Q and K; no experts or no interleave
    # step is refused
    meta = {"general.architecture": "llama4", "llama4.embedding_length": 256, "llama4.block_count": 4,
            "llama4.attention.head_count": 4, "llama4.attention.head_count_kv": 2, "llama4.feed_forward_length": 512,
            "llama4.expert_count": 8, "llama4.expert_used_count": 1, "llama4.expert_feed_forward_length": 256,
            "llama4.interleave_moe_layer_step": 1, "llama4.attention.sliding_window_pattern": 2}
    cfg = ModelConfig.from_metadata(meta, n_vocab=320)
    assert cfg.layer_swa == (True, False, True, False) and cfg.layer_nope == (False, False, False, True)
    assert cfg.chunked and cfg.kq_l2_norm and all(cfg.layer_experts(il) for il in range(4)) and cfg.n_ff_shexp == 256
    off = ModelConfig.from_metadata({**meta, "llama4.attention.sliding_window": 0, "llama4.expert_count": 128},
                                    n_vocab=320)
    assert off.sliding_window == 0 and off.layer_swa == (False,) * 4 and not off.chunked
    assert off.layer_nope == (False, False, False, True) and off.attn_temp_scale == 0 and not off.kq_l2_norm
    with pytest.raises(ModelConfigError, match="interleave_moe_layer_step"):
        ModelConfig.from_metadata({k: v for k, v in meta.items() if "interleave" not in k}, n_vocab=320)
    with pytest.raises(ModelConfigError, match="expert"):
        ModelConfig.from_metadata({**meta, "llama4.expert_count": 0}, n_vocab=320)


def test_gemma4_kv_pool_by_kind_and_shared_layers(tmp_path):
    # Gemma 4's pool: each KV group rows of its own kind's shape (global: 1 KV head of 128, sliding
    # window: 2 of 64), no rows for the shared-KV layers 4 and 5, which read layers 2's and 3's
    from infer.backends.cpu.kv_pool import KVPool

    path = write_tiny_model(tmp_path / "tiny-gemma4-shared.gguf", "gemma4-shared", seed=tiny_seed("gemma4-shared"))
    cfg = load_model(path).config
    assert [g.layers for g in cfg.kv_groups] == [(1, 3), (0, 2)]
    assert cfg.kv_layer_index[4] == cfg.kv_layer_index[2] and cfg.kv_layer_index[5] == cfg.kv_layer_index[3]
    pool = KVPool(cfg, [3, 2], 16)
    assert pool.k[0].shape == (2, 48, 1, 128) and pool.k[1].shape == (2, 32, 2, 64)
    # f16 K and V of 2 layers a group: 1 * (128 + 128) and 2 * (64 + 64) elements a token
    assert cfg.kv_block_bytes(16) == (2 * 16 * 256 * 2, 2 * 16 * 256 * 2)
    assert [pool.block_bytes(g) for g in (0, 1)] == list(cfg.kv_block_bytes(16))
