"""The embedded Gemma 3 270M end to end against llama.cpp: tokenization, first greedy token, continuations."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.prompts import PROMPTS

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.reference  # compares with llama.cpp throughout
N_GEN = 32


@pytest.fixture(scope="module")
def ours(gemma_path):
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM

    return LLM.load(gemma_path, EngineConfig(n_ctx=256, n_threads=2))


@pytest.fixture(scope="module")
def ref(gemma_path):
    llm = llama_cpp.Llama(model_path=str(gemma_path), n_ctx=256, n_threads=2, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ref_fa(gemma_path):
    """llama.cpp with flash attention: it rounds differently and can pick another token on near-ties."""
    llm = llama_cpp.Llama(model_path=str(gemma_path), n_ctx=256, n_threads=2, verbose=False, flash_attn=True)
    yield llm
    llm.close()


def _tokens(llm_ref, text: str) -> list[int]:
    return llm_ref.tokenize(text.encode(), add_bos=True, special=True)


def _last_logits(llm_ref) -> np.ndarray:
    # Without logits_all, llama-cpp-python's eval keeps no logits: read the context's last row.
    ptr = llama_cpp.llama_get_logits_ith(llm_ref.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm_ref.n_vocab(),))


def _logits_after(llm_ref, ids: list[int]) -> np.ndarray:
    llm_ref.reset()
    llm_ref.eval(ids)
    return _last_logits(llm_ref).copy()


def _greedy_ref(llm_ref, ids: list[int], n: int) -> list[int]:
    llm_ref.reset()
    llm_ref.eval(ids)
    out = []
    for _ in range(n):
        tok = int(np.argmax(_last_logits(llm_ref)))
        out.append(tok)
        llm_ref.eval([tok])
    return out


def _greedy_ours(llm, ids: list[int], n: int) -> list[int]:
    runner = llm.runner
    cache = runner.new_kv_cache(256)
    logits = runner.forward(np.array(ids, np.int32), 0, cache)
    out = []
    for i in range(n):
        tok = int(np.argmax(logits[0]))
        out.append(tok)
        logits = runner.forward(np.array([tok], np.int32), len(ids) + i, cache)
    return out


def test_tokenization_identical(ours, ref):
    for text in PROMPTS:
        assert ours.tokenizer.encode(text, add_special=True, parse_special=True) == _tokens(ref, text), text


def test_greedy_continuations_agree(ours, ref, ref_fa):
    """First greedy token identical for every prompt; 32-token continuations as close to llama.cpp's
    default path as llama.cpp's own flash-attention path is.

    The reference is llama-cpp-python's default path. A different first token is accepted only when
    llama.cpp cannot tell the two apart itself: it scores ours within the spread between its own two
    attention paths (flash attention on/off) at that very position.
    The issue's target of 80% identical continuations is not reached yet: llama.cpp's two paths
    agree on only about a third of them, so it needs bit-exact emulation of the default path.
    """
    same, same_fa = [], []
    ambiguous = 0
    for text in PROMPTS:
        ids = _tokens(ref, text)
        a, b, b_fa = _greedy_ours(ours, ids, N_GEN), _greedy_ref(ref, ids, N_GEN), _greedy_ref(ref_fa, ids, N_GEN)
        if a[0] != b[0]:
            ambiguous += 1
            la, lb = _logits_after(ref, ids), _logits_after(ref_fa, ids)
            spread = float(np.abs(la - lb).max())
            assert la[a[0]] >= la.max() - spread, (
                f"first token differs for {text!r}: ours {a[0]} (llama.cpp logit {la[a[0]]:.3f}), "
                f"llama.cpp {b[0]} ({la.max():.3f}); its own paths differ by {spread:.3f}")
        same.append(a == b)
        same_fa.append(b_fa == b)
    print(f"identical 32-token continuations: ours {sum(same)}/{len(same)}, llama.cpp flash-attention "
          f"path {sum(same_fa)}/{len(same)}; first tokens differing within llama.cpp's own spread: {ambiguous}")
    assert sum(same) >= sum(same_fa), (
        f"ours agree with llama.cpp on {sum(same)} continuations, its own flash-attention path on {sum(same_fa)}")


def _forced_agreement(ref_llm, step_ours) -> tuple[int, int, list[float]]:
    """Teacher forcing over every prompt: both sides are fed llama.cpp's greedy token at each of
    N_GEN steps; (positions where step_ours's argmax is llama.cpp's, positions, llama.cpp's top-2
    margin at each position where it is not).  step_ours(ids | None, token) -> logits."""
    same = n = 0
    margins = []
    for text in PROMPTS:
        ids = _tokens(ref_llm, text)
        ref_llm.reset()
        ref_llm.eval(ids)
        lo = step_ours(ids, None)
        for _ in range(N_GEN):
            lr = _last_logits(ref_llm)
            tok = int(np.argmax(lr))
            n += 1
            if int(np.argmax(lo)) == tok:
                same += 1
            else:
                top2 = np.sort(lr)[-2:]
                margins.append(float(top2[1] - top2[0]))
            ref_llm.eval([tok])
            lo = step_ours(None, tok)
    return same, n, margins


def test_teacher_forced_tokens_agree(ours, ref, ref_fa):
    """Per-token agreement, free of the cascade that makes whole continuations part at the first
    near-tie: at every position of the 24 continuations, fed llama.cpp's tokens, our greedy choice
    is llama.cpp's at least 95% of the time (measured: 735/768, the same as llama.cpp's own
    flash-attention path), and where it is not, llama.cpp's own top two are close."""
    runner = ours.runner
    state = {}

    def step_cpu(ids, tok):
        if ids is not None:
            state["cache"], state["pos"] = runner.new_kv_cache(256), len(ids)
            return runner.forward(np.array(ids, np.int32), 0, state["cache"])[0].copy()
        out = runner.forward(np.array([tok], np.int32), state["pos"], state["cache"])[0].copy()
        state["pos"] += 1
        return out

    def step_fa(ids, tok):
        if ids is not None:
            ref_fa.reset()
            ref_fa.eval(ids)
        else:
            ref_fa.eval([tok])
        return _last_logits(ref_fa).copy()

    same, n, margins = _forced_agreement(ref, step_cpu)
    same_fa, _, margins_fa = _forced_agreement(ref, step_fa)
    print(f"teacher-forced greedy tokens equal to llama.cpp's: ours {same}/{n}, its flash-attention path {same_fa}/{n}; "
          f"largest llama.cpp margin where ours differ {max(margins, default=0):.3f} (flash attention: "
          f"{max(margins_fa, default=0):.3f})")
    assert same >= 0.95 * n
    assert same >= same_fa - n // 100
    assert max(margins, default=0.0) <= 1.5 * max(margins_fa, default=0.3)


def test_intermediates_track_llamacpp(gemma_path, ours, compare_llamacpp):
    """Why continuations drift: the first layer's inputs are bit-identical to llama.cpp's, its
    products differ only in the last bit (a different order of float sums), and the 8-bit rounding
    of activations grows that to ~1e-3 of the largest value within a few layers.  Checked through
    CpuRunner.trace and scripts/compare_llamacpp.py's eval callback."""
    mod = compare_llamacpp
    ref = mod.LlamaCppTracer(str(gemma_path), 64, 2, flash_attn=False)
    seen = {}
    runner = ours.runner
    runner.trace = lambda name, a: seen.__setitem__(name, a.copy())
    try:
        ids = ours.tokenizer.encode(PROMPTS[0], add_special=True, parse_special=True)
        lr = ref.decode(ids)
        lo = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(64))[0].copy()
    finally:
        runner.trace = None
    n_layer = ours.model.config.n_layer
    assert {f"l_out-{il}" for il in range(n_layer)} <= seen.keys()
    rows = {name: (rel, n_diff) for name, rel, n_diff, _ in mod.compare(seen, ref.intermediates())}
    assert rows["inp_scaled"] == (0.0, 0) and rows["attn_norm-0"] == (0.0, 0)
    assert 0 < rows["qkv-0"][0] < 1e-6  # products: ulp-level, not identical
    assert rows[f"l_out-{n_layer - 1}"][0] < 0.1
    assert int(np.argmax(lo)) == int(np.argmax(lr))
    assert np.abs(lo - lr).max() < 0.1 * np.abs(lr).max()
