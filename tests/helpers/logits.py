"""Logits of a tiny model on a fixed prompt from each implementation: llama.cpp (llama-cpp-python,
the reference), the cpu and the MLX backends; and the bound ours must stay within llama.cpp's."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.base import RunnerOptions
from infer.backends.batch import Batch
from infer.backends.cpu.runner import CpuRunner

N_CTX = 64  # of every llama.cpp run and ours here (LongRoPE models pick their factors by it)
PROMPT = np.array([1, 5, 77, 300, 12, 260, 9, 9, 140, 201, 33, 318, 4, 100, 250, 7], np.int32)


def llama_cpp_logits(path, tokens, flash_attn: bool = False, cache_types=("f16", "f16"), n_ctx: int = N_CTX) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    from infer.backends.llamacpp.runner import GGML_TYPES

    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False,
                          flash_attn=flash_attn, type_k=GGML_TYPES[cache_types[0]], type_v=GGML_TYPES[cache_types[1]])
    llm.eval(tokens.tolist())
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return logits


class LlamaCppRuns:
    """llama.cpp's logits of one file on PROMPT, each (flash attention, cache types) run once and
    shared (read-only) by the tests of that file: a module-scoped fixture holds it."""

    def __init__(self, path):
        self.path = path
        self.runs: dict[tuple[bool, tuple[str, str]], np.ndarray] = {}

    def logits(self, flash_attn: bool = False, cache_types=("f16", "f16")) -> np.ndarray:
        key = (flash_attn, tuple(cache_types))
        if key not in self.runs:
            logits = llama_cpp_logits(self.path, PROMPT, flash_attn=flash_attn, cache_types=cache_types)
            logits.flags.writeable = False
            self.runs[key] = logits
        return self.runs[key]


def assert_matches_llama_cpp(ours: np.ndarray, path, what: str, slack: float = 0.0,
                             runs: LlamaCppRuns | None = None) -> np.ndarray:
    """Our logits within max(2% of max |logit|, llama.cpp's own spread between its attention paths)
    (plus slack) of llama-cpp-python's default path, and the argmax llama.cpp's (either path's where
    they disagree); whether llama.cpp's two paths agree on each position's argmax. runs: path's
    llama.cpp logits where another test has them already."""
    runs = runs or LlamaCppRuns(path)
    ref = runs.logits()  # llama-cpp-python's default path (no flash attention)
    ref_fa = runs.logits(flash_attn=True)
    assert ours.shape == ref.shape
    # llama.cpp's two attention paths round differently; on the tiny gemma3 they disagree by ~5% and
    # flip argmaxes. Where llama.cpp disagrees with itself, its own spread is the bound; elsewhere 2%.
    self_spread = np.abs(ref - ref_fa).max()
    tol = max(0.02 * np.abs(ref).max(), self_spread) + slack
    diff = np.abs(ours - ref).max()
    print(f"{what}: max|ours-llama.cpp| {diff:.4g} ({diff / np.abs(ref).max():.3%} of max|logit|), "
          f"llama.cpp fa on/off {self_spread:.4g}, bound {tol:.4g}")
    assert diff <= tol, f"{what}: max |diff| {diff:.4g} > bound {tol:.4g}"
    agree = ref.argmax(-1) == ref_fa.argmax(-1)
    mine = ours.argmax(-1)
    ok = (mine == ref.argmax(-1)) | (~agree & (mine == ref_fa.argmax(-1)))
    assert ok.all(), f"{what}: argmax differs from llama.cpp at positions {np.nonzero(~ok)[0].tolist()}"
    return agree


def mlx_logits(model, tokens=PROMPT, config=None) -> np.ndarray:
    from infer.backends.mlx.runner import MlxRunner  # here: the callers without MLX import no mlx

    cfg = config or model.config
    r = MlxRunner(cfg, model.weights, RunnerOptions(max_tokens=64))
    n = len(cfg.kv_groups)
    pool = r.new_kv_pool([4] * n, 16)
    tables = [np.arange(4, dtype=np.int32)[None]] * n
    return r.forward_batch(Batch.single(tokens, 0, tables, 16, all_logits=True), pool, r.new_state_pool(1))


def cpu_logits(model, tokens=PROMPT, config=None) -> np.ndarray:
    cpu = CpuRunner(config or model.config, model.weights, n_threads=2)
    return cpu.forward(tokens, 0, cpu.new_kv_cache(64), all_logits=True).copy()


def assert_converted_agrees(folder, out, hf_math, what: str) -> None:
    """A converted checkpoint (folder: the HF model with its tokenizer.json; out: its GGUF) on one
    sentence: llama.cpp within 2% of max |logit| of the HF model's own math (hf_math(ids): float64
    logits; llama.cpp rounds activations), with its argmaxes; infer's cpu backend within 2% of
    llama.cpp, with its argmaxes."""
    from tokenizers import Tokenizer

    from infer.models.loader import load_model

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        "Hello world! The quick brown fox jumps over 12345 lazy dogs.", add_special_tokens=False).ids
    ref = llama_cpp_logits(out, np.array(ids, np.int32))
    want = hf_math(ids)
    tol = 0.02 * np.abs(want).max()
    print(f"{what}: max|llama.cpp - HF math| {np.abs(ref - want).max():.4g}, bound {tol:.4g}")
    assert np.abs(ref - want).max() <= tol
    np.testing.assert_array_equal(ref.argmax(-1), want.argmax(-1))
    model = load_model(out)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(N_CTX), all_logits=True).copy()
    print(f"{what}: max|infer - llama.cpp| {np.abs(ours - ref).max():.4g}")
    assert np.abs(ours - ref).max() <= 0.02 * np.abs(ref).max()
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))
