"""`infer kernels --warm` compiles what a model of a warmed type needs: afterwards, loading one and
generating compiles nothing (numba's compile events, counted in a fresh process)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infer.quant import types as qt

CHECK = """
import sys, tempfile
from pathlib import Path
from infer.backends.cpu.compiling import watch_compiles
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams
from infer.models.zero_model import write_zero_model
with tempfile.TemporaryDirectory() as d, watch_compiles() as log:
    path = write_zero_model(Path(d) / "m.gguf", int(sys.argv[1]))
    llm = LLM.load(path, EngineConfig(n_ctx=256, max_seqs=1, backend="cpu", cache_type_k=sys.argv[2],
                                      cache_type_v=sys.argv[2]))
    llm.runner.warmup()
    for _ in llm.generate(list(range(3, 30)), SamplingParams(temperature=0, max_tokens=3)):
        pass
print(len(log.kernels), " ".join(log.kernels))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_warm_leaves_nothing_to_compile(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    warm = subprocess.run([sys.executable, "-m", "infer.cli", "kernels", "--warm", "--type", "q4_k", "-j", "1"],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert warm.returncode == 0, warm.stderr
    assert "Q4_K: " in warm.stderr and "Q4_K (KV cache q8_0)" in warm.stderr
    for cache_type in ("f16", "q8_0"):
        run = subprocess.run([sys.executable, "-c", CHECK, str(qt.Q4_K), cache_type], env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[0] == "0", f"compiled after warming ({cache_type} KV): {run.stdout}"
    # a type not warmed does compile: the check can fail
    run = subprocess.run([sys.executable, "-c", CHECK, str(qt.Q5_0), "f16"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.split()[0]) > 0


def test_kernels_lists_the_types_and_refuses_unknown_ones():
    from typer.testing import CliRunner

    from infer.cli import kernels  # noqa: F401  (registers the command)
    from infer.cli.app import app

    out = CliRunner().invoke(app, ["kernels"])
    assert out.exit_code == 0 and "Q4_K" in out.output and "MXFP4" in out.output
    bad = CliRunner().invoke(app, ["kernels", "--warm", "--type", "Q9_X"])
    assert bad.exit_code == 2 and "Q9_X" in bad.output
