"""`infer kernels --warm` compiles what a model of a warmed type needs: afterwards, loading one and
generating compiles nothing (numba's compile events, counted in a fresh process). The same of a
first load's compile ahead (engine/llm.py's load_warm, backends/cpu/compiling.py): its dry run
finds every kernel the load and warmup will compile, worker processes compile them, and the load
after compiles nothing; a second run finds them all cached and compiles nothing ahead; the dry
run runs no kernel it would have to compile."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from infer.backends.cpu.compiling import compile_job, dry_run
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


AHEAD = """
import sys, tempfile
from pathlib import Path
from infer.backends.cpu.compiling import watch_compiles
from infer.engine.engine import EngineConfig
from infer.engine.llm import load_warm
from infer.engine.sampler import SamplingParams
from infer.models.zero_model import write_zero_model
if __name__ == "__main__":  # the workers are spawned: they import this module
    with tempfile.TemporaryDirectory() as d:
        path = write_zero_model(Path(d) / "m.gguf", int(sys.argv[1]))
        started = []
        with watch_compiles() as log:
            llm = load_warm(path, EngineConfig(n_ctx=256, max_seqs=1, backend="cpu", n_threads=2),
                            lambda n, workers: started.append(n))
            for _ in llm.generate(list(range(3, 30)), SamplingParams(temperature=0, max_tokens=3)):
                pass
        print(sum(started), len(log.kernels), " ".join(log.kernels))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_compile_ahead_leaves_nothing_to_compile(tmp_path):
    script = tmp_path / "ahead.py"
    script.write_text(AHEAD)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for n, want_ahead in enumerate((lambda k: k >= 10, lambda k: k == 0)):  # attention, matmul, repacking, norms...
        run = subprocess.run([sys.executable, str(script), str(qt.Q4_0)], env=env, capture_output=True, text=True,
                             timeout=1200)
        assert run.returncode == 0, run.stderr
        ahead, after = run.stdout.split()[:2]
        assert want_ahead(int(ahead)), f"run {n + 1}: {run.stdout}"
        assert after == "0", f"run {n + 1} compiled in the loading process: {run.stdout}"


DRY_KERNEL = """
from numba import njit

@njit(cache=True)
def fill(out, v):
    out[:] = v
    return 7
"""


def test_dry_run_records_what_would_compile_and_runs_nothing(tmp_path, monkeypatch):
    import importlib

    (tmp_path / "dry_kernel.py").write_text(DRY_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "dry_kernel", raising=False)
    import dry_kernel

    out, ints = np.zeros(3), np.zeros(2, np.int64)
    with dry_run() as jobs:
        assert dry_kernel.fill(out, 1.0) == 0
        dry_kernel.fill(out, 2.0)  # the same signature: one job
        dry_kernel.fill(ints, 1)
    assert (out == 0).all() and (ints == 0).all()
    assert [(j.module, j.qualname, len(j.sig)) for j in jobs] == [("dry_kernel", "fill", 2)] * 2
    assert jobs[0].sig != jobs[1].sig
    compile_job(jobs[0])  # into the disk cache (and this dispatcher's memory)

    with dry_run() as again:
        assert dry_kernel.fill(out, 1.0) == 7  # compiled in memory: runs as usual
    assert (out == 1).all() and again == []
    fresh = importlib.reload(dry_kernel)  # a new dispatcher: nothing in memory, the float variant on disk
    with dry_run() as left:
        assert fresh.fill(out, 5.0) == 0 and fresh.fill(ints, 1) == 0
        other = ThreadPoolExecutor(1).submit(fresh.fill, ints, 2)  # another thread's call: numba as usual
        assert other.result() == 7 and (ints == 2).all()
    assert (out == 1).all() and [j.sig for j in left] == [jobs[1].sig]
    assert fresh.fill(out, 3.0) == 7 and (out == 3).all()  # outside: numba as usual
