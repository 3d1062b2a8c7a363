"""GGUF files with MXFP4 experts (llama.cpp's MXFP4_MOE, gpt-oss's experts): the tiny MoE models
quantized by llama.cpp itself (llama_model_quantize, MXFP4_MOE: experts MXFP4, the rest Q8_0) give
llama.cpp's logits at every position on the cpu backend (MXFP4 packed as its codes, and a tensor whose
scales f16 cannot hold on the reference path) and on mlx (MLX's own mxfp4 mode), and load in the
llama.cpp backend."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.llama_quantize import llama_quantize
from helpers.logits import N_CTX, PROMPT, assert_matches_llama_cpp, llama_cpp_logits
from helpers.tiny_models import write_tiny_model
from infer.backends.cpu.repack import PackedExperts
from infer.backends.cpu.runner import CpuRunner
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams
from infer.models.gguf_file import read_gguf
from infer.models.loader import load_model
from infer.quant import types as qt
from infer.quant.tensor import file_offset

pytestmark = pytest.mark.reference  # every test compares with llama.cpp (its logits or its quantizer)
MOE_ARCHS = ["qwen3moe", "llama-moe", "gpt-oss"]


@pytest.fixture(scope="module", params=MOE_ARCHS)
def mxfp4_model(request, tmp_path_factory):
    """(arch, path): the tiny MoE model of arch, requantized by llama.cpp to MXFP4_MOE."""
    arch = request.param
    d = tmp_path_factory.mktemp(f"mxfp4-{arch}")
    src = write_tiny_model(d / "src.gguf", arch, seed=MOE_ARCHS.index(arch) + 3)
    out = d / f"tiny-{arch}-mxfp4_moe.gguf"
    llama_quantize(src, out, "MXFP4_MOE", allow_requantize=True)
    types = {n: t.type_id for n, t in read_gguf(out).tensors.items()}
    assert {t for n, t in types.items() if n.endswith("_exps.weight")} == {qt.MXFP4}
    return arch, out


def cpu_logits(path) -> tuple[np.ndarray, CpuRunner]:
    model = load_model(path).for_context(N_CTX)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    return runner.forward(PROMPT, 0, runner.new_kv_cache(N_CTX), all_logits=True).copy(), runner


def test_cpu_logits_match_llama_cpp(mxfp4_model):
    arch, path = mxfp4_model
    ours, runner = cpu_logits(path)
    # every layer's experts packed alike, as MXFP4 (its codes), and run by the one-loop path (moe.experts_ffn)
    assert all(isinstance(g, PackedExperts) and g.info[0].id == qt.MXFP4 for ly in runner.layers for g in ly.grouped)
    assert_matches_llama_cpp(ours, path, f"{arch} MXFP4_MOE, cpu")


def test_cpu_unscalable_expert_runs_on_the_reference_path(mxfp4_model, tmp_path):
    """One block of one expert given an exponent f16 cannot hold (2**-25, nonzero codes): that
    layer's experts run expert by expert, the touched matrix on the reference path, and the
    logits still follow llama.cpp's on the same file."""
    arch, path = mxfp4_model
    t = read_gguf(path).tensors["blk.0.ffn_up_exps.weight"]
    start = file_offset(t.raw)[1]  # raw views the file
    row = 3 * t.shape[-2] + 7  # expert 3, row 7
    block = start + row * t.raw.shape[1] + 2 * 17  # its third block
    data = bytearray(path.read_bytes())
    data[block] = 128 - 25
    data[block + 1] = 0x35  # codes 5 and 3: weights 6 and 3 times 2**-25
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="beyond f16's range"):
        ours, runner = cpu_logits(bad)
    assert runner.layers[0].grouped is None and runner.layers[-1].grouped is not None
    assert_matches_llama_cpp(ours, bad, f"{arch} MXFP4_MOE with a 2**-25 block, cpu")


def test_mlx_logits_match_llama_cpp(mxfp4_model):
    """MLX runs the experts in its mxfp4 mode (exact weights) on float activations: within 0.5% of
    max |logit| of exact arithmetic over the file's weights.  llama.cpp rounds the activations to
    8 bits, which these tiny random models amplify: exact arithmetic itself lies 2.5% (qwen3moe)
    and 7.8% (llama-moe) from llama.cpp's logits (the cpu backend, rounding as llama.cpp does,
    0.03% and 0.0%).  So against llama.cpp the bound is test_models' rule plus exact arithmetic's
    own distance, and the argmax is llama.cpp's at every position."""
    pytest.importorskip("mlx.core")
    from helpers.exact_forward import exact_hidden, exact_logits
    from helpers.logits import mlx_logits
    from infer.backends.mlx.runner import MlxRunner

    arch, path = mxfp4_model
    model = load_model(path).for_context(N_CTX)
    r = MlxRunner(model.config, model.weights)
    assert {m.mode for gu, d in r.layers[0].experts for m in (*gu, *d)} == {"mxfp4"}
    ours = mlx_logits(model)
    exact = exact_logits(model.config, model.weights, exact_hidden(model.config, model.weights, [PROMPT])[0])
    off = np.abs(ours - exact).max() / np.abs(exact).max()
    print(f"{arch} MXFP4_MOE: max |mlx - exact| {off:.3%} of max|logit|")
    assert off <= 0.005
    ref = llama_cpp_logits(path, PROMPT)
    assert_matches_llama_cpp(ours, path, f"{arch} MXFP4_MOE, mlx", slack=np.abs(exact - ref).max())


def test_llama_cpp_backend_loads_it(mxfp4_model):
    arch, path = mxfp4_model
    llm = LLM.load(path, EngineConfig(backend="llama.cpp", n_threads=1, n_ctx=N_CTX))
    rid = llm.engine.add_request(PROMPT.tolist(), SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    tokens = []
    while llm.engine.has_work():
        for ev in llm.engine.step():
            if ev.request_id == rid and ev.finish_reason is not None:
                tokens = ev.token_ids
    assert tokens == [int(llama_cpp_logits(path, PROMPT)[-1].argmax())]
