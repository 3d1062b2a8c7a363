"""Backend choice as a user meets it: `infer backends`, --backend, and what a missing backend says."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.cli import assert_one_line_error, infer
from infer.backends.base import BackendError
from infer.backends.registry import BACKENDS, choose_backend, create_runner, probe

# Runs the CLI with some modules made unimportable, as on a machine without that extra.
BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from infer.cli.main import main
sys.argv = ["infer"] + sys.argv[2:]
main()
"""


def infer_without(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, modules, *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.e2e
def test_backends_lists_every_backend_with_auto_choice():
    r = infer("backends", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert tuple(rows) == BACKENDS
    assert rows["cpu"]["available"] and rows["cpu"]["devices"]
    autos = [n for n, row in rows.items() if row["auto"]]
    assert len(autos) == 1
    # auto prefers a GPU: llama.cpp only when its build has one, MLX only on Apple Silicon
    if not any(row["gpu"] for row in rows.values()):
        assert autos == ["cpu"]
    for row in rows.values():
        assert row["available"] or row["reason"]  # an unavailable backend says why
    table = infer("backends")
    assert table.returncode == 0 and "(auto)" in table.stdout and "cpu" in table.stdout


@pytest.mark.e2e
def test_missing_extras_are_named():
    r = infer_without("mlx,llama_cpp", "backends", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert not rows["mlx"]["available"] and "pip install 'infer[mlx]'" in rows["mlx"]["reason"]
    assert not rows["llama.cpp"]["available"] and "pip install 'infer[llamacpp]'" in rows["llama.cpp"]["reason"]
    assert rows["cpu"]["auto"]


@pytest.mark.e2e
@pytest.mark.parametrize("backend,extra", [("mlx", "infer[mlx]"), ("llama.cpp", "infer[llamacpp]")])
def test_unavailable_backend_is_a_one_line_error(backend, extra):
    r = infer_without("mlx,llama_cpp", "run", "--backend", backend, "-n", "4", "hi")
    assert_one_line_error(r, f"backend {backend} is not available", extra)


@pytest.mark.e2e
def test_unknown_backend():
    r = infer("run", "--backend", "tpu", "hi")
    assert_one_line_error(r, "unknown backend 'tpu'", "cpu, mlx, llama.cpp")


def test_auto_and_explicit_choice(monkeypatch):
    assert choose_backend("cpu") == "cpu"
    with pytest.raises(BackendError, match="choose from"):
        choose_backend("gpu")
    monkeypatch.setitem(sys.modules, "mlx", None)
    with pytest.raises(BackendError, match=r"MLX-format model and MLX is not available.*infer\[mlx\]"):
        choose_backend("auto", model_format="mlx")
    assert not probe("mlx").available


def test_mlx_weights_refused_by_gguf_only_backends(tmp_path):
    class FakeModel:  # what create_runner reads of a loaded MLX folder
        path = tmp_path / "some-mlx-folder"
        format = "mlx"
        config = weights = None

    with pytest.raises(BackendError, match="run on --backend mlx"):
        create_runner("cpu", FakeModel())
    with pytest.raises(BackendError, match="runs GGUF files"):
        create_runner("llama.cpp", FakeModel())
