"""Split GGUFs (llama.cpp's gguf-split shards, NAME-00001-of-0000N.gguf): loaded from the first
shard as one model, by every command; a wrong or missing shard is a clear one-line error."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers.logits import PROMPT, llama_cpp_logits
from helpers.tiny_models import write_tiny_model
from infer.backends.cpu.runner import CpuRunner
from infer.models.gguf_file import GGUFError, read_gguf
from infer.models.loader import load_model


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The same tiny llama written whole and in shards of at most 8 tensors."""
    d = tmp_path_factory.mktemp("split")
    whole = write_tiny_model(d / "whole.gguf", "llama", seed=3)
    first = write_tiny_model(d / "tiny.gguf", "llama", seed=3, split_max_tensors=8)
    return whole, first


def _logits(path):
    model = load_model(path)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    return runner.forward(PROMPT, 0, runner.new_kv_cache(64), all_logits=True).copy()


def test_first_shard_reads_as_the_whole_model(split):
    whole, first = split
    assert first.name == "tiny-00001-of-00003.gguf"
    a, b = read_gguf(whole), read_gguf(first)
    assert b.shards == 3 and a.shards == 1
    assert sorted(a.tensors) == sorted(b.tensors)
    for name, t in a.tensors.items():
        np.testing.assert_array_equal(np.asarray(t.raw), np.asarray(b.tensors[name].raw))
    assert not any(k.startswith("split.") for k in b.metadata)  # they describe the files, not the model
    assert {k: str(v) for k, v in a.metadata.items()} == {k: str(v) for k, v in b.metadata.items()}


@pytest.mark.reference
def test_split_logits_equal_whole_and_llama_cpp(split):
    whole, first = split
    ours = _logits(first)
    np.testing.assert_array_equal(ours, _logits(whole))
    # llama.cpp loads the same shards (so they are written as it writes them) to the same logits
    np.testing.assert_allclose(llama_cpp_logits(first, PROMPT), llama_cpp_logits(whole, PROMPT), rtol=0, atol=1e-5)


def test_wrong_or_missing_shard_is_a_clear_error(split, tmp_path):
    _, first = split
    second = first.with_name("tiny-00002-of-00003.gguf")
    with pytest.raises(GGUFError, match="shard 2 of 3 of a split model; give the first, tiny-00001-of-00003.gguf"):
        read_gguf(second)
    lone = tmp_path / first.name
    lone.write_bytes(first.read_bytes())
    with pytest.raises(GGUFError, match=r"shard 2 of 3 is missing \(tiny-00002-of-00003.gguf\)"):
        read_gguf(lone)
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(first.read_bytes())
    with pytest.raises(GGUFError, match="does not end in -00001-of-00003.gguf"):
        read_gguf(renamed)


@pytest.mark.e2e
def test_cli_runs_and_shows_a_split_model(split, tmp_path):
    whole, first = split
    cmd = [sys.executable, "-m", "infer.cli"]
    run = lambda path: subprocess.run([*cmd, "run", str(path), "--raw", "-n", "4", "--temperature", "0", "--json",
                                       "hello world"], capture_output=True, text=True, timeout=300)
    a, b = run(whole), run(first)
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["text"] == json.loads(a.stdout)["text"]
    shown = subprocess.run([*cmd, "show", str(first)], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "llama" in shown.stdout
    bad = subprocess.run([*cmd, "run", str(first.with_name("tiny-00003-of-00003.gguf")), "hi"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert "give the first, tiny-00001-of-00003.gguf" in bad.stderr and "Traceback" not in bad.stderr
    # quantize reads every shard and writes one file: the one it writes from the unsplit model
    quant = lambda src, out: subprocess.run([*cmd, "quantize", str(src), str(out), "--type", "Q8_0", "--allow-requantize"],
                                            capture_output=True, text=True, timeout=300)
    q, ref = quant(first, tmp_path / "q.gguf"), quant(whole, tmp_path / "ref.gguf")
    assert q.returncode == 0 and ref.returncode == 0, q.stderr + ref.stderr
    assert read_gguf(tmp_path / "q.gguf").shards == 1
    assert (tmp_path / "q.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()
