"""Per architecture: our logits on a tiny random-weight GGUF match llama.cpp's at every position."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.cpu.transformer import CpuTransformer
from infer.models.loader import load_model
from tiny_models import write_tiny_model

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
PROMPT = np.array([1, 5, 77, 300, 12, 260, 9, 9, 140, 201, 33, 318, 4, 100, 250, 7], np.int32)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    arch = request.param
    path = write_tiny_model(tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf", arch, seed=ARCHS.index(arch))
    return arch, path


def llama_cpp_logits(path, tokens) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64, n_threads=2, verbose=False)
    llm.eval(tokens.tolist())
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return logits


def test_logits_match_llama_cpp(tiny):
    arch, path = tiny
    model = load_model(path)
    runner = CpuTransformer(model.config, model.weights, n_threads=2)
    ours = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    ref = llama_cpp_logits(path, PROMPT)
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1), err_msg=f"{arch}: argmax differs")
    tol = 0.02 * np.abs(ref).max()
    diff = np.abs(ours - ref).max()
    assert diff <= tol, f"{arch}: max |diff| {diff:.4g} > 2% of max |logit| ({tol:.4g})"


def test_kv_cache_decode_matches_full_recompute(tiny):
    _, path = tiny
    model = load_model(path)
    runner = CpuTransformer(model.config, model.weights, n_threads=2)
    full = runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()
    cache = runner.new_kv_cache(64)
    steps = [runner.forward(PROMPT[:10], 0, cache).copy()[0]]
    for i in range(10, len(PROMPT)):
        steps.append(runner.forward(PROMPT[i:i + 1], i, cache).copy()[0])
    np.testing.assert_allclose(np.stack(steps), full[9:], rtol=1e-4, atol=1e-4 * np.abs(full).max())


def test_prefill_in_chunks_matches_one_pass(tiny):
    # Chunked prefill (the BLAS path for 16 tokens vs the row kernel for 5) must agree.
    _, path = tiny
    model = load_model(path)
    runner = CpuTransformer(model.config, model.weights, n_threads=2, max_tokens=5)
    cache = runner.new_kv_cache(64)
    last = runner.forward(PROMPT, 0, cache).copy()
    one = CpuTransformer(model.config, model.weights, n_threads=2)
    ref = one.forward(PROMPT, 0, one.new_kv_cache(64)).copy()
    np.testing.assert_allclose(last, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
