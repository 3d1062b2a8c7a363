"""Hostile GGUF files (tests/helpers/gguf_fuzz.py): valid tiny models of every architecture with mutated
counts, lengths, types, dimensions, offsets, alignments and token ids, bit flips, truncations and
appended bytes, each loaded and run by a worker process. Every one must end as a clean run or a
one-line error: no traceback reaching the user, no crash, no hang. The same for MLX / HF model
folders and importance-matrix files (tests/helpers/mlx_fuzz.py, imatrix_fuzz.py), with the inputs the fuzzing found first
kept as named cases. A bounded budget here; scripts/fuzz_gguf.py runs tens of thousands."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from helpers import imatrix_fuzz, mlx_fuzz
from helpers.gguf_fuzz import mutate, run_cases, seeds

CASES = 300


@pytest.mark.slow  # a worker process per case
def test_mutated_models_fail_cleanly(tmp_path):
    originals = [p.read_bytes() for p in seeds(tmp_path)]
    cases = []
    for i in range(CASES):
        p = tmp_path / f"case-{i:04d}.gguf"
        p.write_bytes(mutate(originals[i % len(originals)], random.Random(f"ci-{i}")))
        cases.append(p)
    results = run_cases(cases, timeout=120)
    bad = [(p.name, answer) for p, answer in results if not answer.startswith(("OK", "ERR "))]
    assert not bad, bad  # RUN too: a forward pass failing means the loader let a bad file through
    kinds = {answer.split(" ", 1)[0] for _, answer in results}
    assert kinds == {"OK", "ERR"}  # the mutations both break files and leave some loadable


@pytest.mark.slow  # a worker process per case
def test_the_harness_tells_crashes_hangs_and_tracebacks(tmp_path):
    """The harness itself, so that a clean fuzz run means something: a worker killed by a signal,
    one that stops answering, an unexpected exception, a clean error, in one run."""
    paths = [tmp_path / n for n in ("a.selftest-crash", "b.selftest-hang", "c.selftest-tb", "missing.gguf")]
    answers = [a for _, a in run_cases(paths, timeout=5)]
    assert answers[0] == "CRASH -11" and answers[1] == "HANG" and answers[2].startswith("TB ")
    assert answers[3].startswith("ERR ")


# ----------------------------------------------------------------------------- MLX / HF folders, imatrix files

MLX_CASES = 150
IMATRIX_CASES = 100


@pytest.fixture(scope="module")
def folder_seeds(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("mlx.core")
    return {p.name.removeprefix("seed-"): p for p in mlx_fuzz.seeds(tmp_path_factory.mktemp("folder-seeds"))}


@pytest.mark.slow  # a worker process per case
def test_mutated_mlx_folders_fail_cleanly(folder_seeds, tmp_path):
    """The same for model folders (tests/helpers/mlx_fuzz.py): MLX exports of tiny models and HF float
    checkpoints with mutated safetensors headers and data, config.json, tokenizer files and index,
    loaded and run on the MLX backend (which checks nothing it is given)."""
    originals = list(folder_seeds.values())
    cases = []
    for i in range(MLX_CASES):
        src = originals[i % len(originals)]
        p = tmp_path / f"case-{i:04d}-{src.name.removeprefix('seed-')}"
        mlx_fuzz.mutate(src, p, random.Random(f"ci-{i}"))
        cases.append(p)
    results = run_cases(cases, timeout=120)
    bad = [(p.name, answer) for p, answer in results if not answer.startswith(("OK", "ERR "))]
    assert not bad, bad
    assert {answer.split(" ", 1)[0] for _, answer in results} == {"OK", "ERR"}


@pytest.mark.slow  # a worker process per case
def test_mutated_imatrix_files_fail_cleanly(tmp_path):
    """Legacy .dat and GGUF importance matrices, mutated, through `infer quantize --imatrix`
    (quantize_model in a worker process): a quantized file or a one-line error, nothing else."""
    model, originals = imatrix_fuzz.imatrix_seeds(tmp_path)
    data = [p.read_bytes() for p in originals]
    types = imatrix_fuzz.IMATRIX_TYPES
    cases = []
    for i in range(IMATRIX_CASES):
        src = originals[i % len(originals)]
        p = tmp_path / f"case-{i:04d}--{types[i // len(originals) % len(types)]}{''.join(src.suffixes)}"
        p.write_bytes(imatrix_fuzz.mutate_imatrix(data[i % len(data)], random.Random(f"ci-{i}")))
        cases.append(p)
    results = run_cases(cases, timeout=120, worker_argv=[imatrix_fuzz.__file__, str(model)])
    bad = [(p.name, answer) for p, answer in results if not answer.startswith(("OK", "ERR "))]
    assert not bad, bad
    assert {answer.split(" ", 1)[0] for _, answer in results} == {"OK", "ERR"}


def _entry(tensor: str, **changes):
    """An edit of one tensor's safetensors header entry; a callable value gets the old entry."""
    def edit(folder: Path) -> None:
        f = folder / "model.safetensors"
        header, data = mlx_fuzz.st_split(f.read_bytes())
        for key, v in changes.items():
            header[tensor][key] = v(header[tensor]) if callable(v) else v
        f.write_bytes(mlx_fuzz.st_join(header, data))
    return edit


def _json(name: str, edit):
    def apply(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        edit(data)
        (folder / name).write_text(json.dumps(data))
    return apply


# What the fuzzing found (each was a traceback; vocab-gap a segfault in MLX's embedding lookup,
# layers-huge a hang), and the one line each now gives: (seed, edit, words the message must hold).
FOUND = {
    "offsets-float": ("llama-4bit", _entry("model.layers.0.mlp.up_proj.biases",
                                           data_offsets=lambda e: [v + 0.5 for v in e["data_offsets"]]),
                      ["model.safetensors", "model.layers.0.mlp.up_proj.biases", "data_offsets"]),
    "offsets-string": ("hf-llama", _entry("model.layers.0.mlp.up_proj.weight",
                                          data_offsets=lambda e: [str(v) for v in e["data_offsets"]]),
                       ["model.layers.0.mlp.up_proj.weight", "are not two integers"]),
    "offsets-dict": ("hf-llama", _entry("model.norm.weight", data_offsets=lambda e: [e["data_offsets"][0], {}]),
                     ["model.norm.weight", "data_offsets"]),
    "shape-negated": ("hf-llama", _entry("model.layers.0.self_attn.q_proj.weight", shape=[-256, -256]),
                      ["model.layers.0.self_attn.q_proj.weight", "non-negative integers"]),
    "shape-infinite": ("hf-qwen2", _entry("model.norm.weight", shape=[float("inf")]),
                       ["model.norm.weight", "shape [inf]"]),
    "dtype-unknown": ("qwen3-4bit", _entry("model.layers.1.mlp.up_proj.scales", dtype="u32"),
                      ["model.layers.1.mlp.up_proj.scales", "dtype 'u32' is not a safetensors dtype"]),
    "overlap": ("hf-llama", _entry("model.layers.1.self_attn.v_proj.weight", data_offsets=lambda e: [
        e["data_offsets"][0] - 128 * 256 * 2, e["data_offsets"][1] - 128 * 256 * 2]), ["overlap"]),
    "group-size-inf": ("llama-4bit", _json("config.json", lambda c: c["quantization"].update(group_size=float("-inf"))),
                       ["config.json", "group size -inf"]),
    "rope-no-factor": ("hf-llama", _json("config.json", lambda c: c.update(rope_parameters={"rope_type": "linear"})),
                       ["config.json", "rope_parameters of type 'linear' has no factor"]),
    "llama3-equal-bands": ("hf-llama", _json("config.json", lambda c: c.update(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0})),
        ["config.json", "low_freq_factor < high_freq_factor"]),
    "layers-nan": ("gemma2-4bit", _json("config.json", lambda c: c.update(num_hidden_layers=float("nan"))),
                   ["config.json", "num_hidden_layers nan is not an integer"]),
    "layers-huge": ("hf-llama", _json("config.json", lambda c: c.update(num_hidden_layers=2**31)),  # was a hang
                    ["config.json", "num_hidden_layers 2147483648 is out of range"]),
    "llama3-wide": ("hf-llama", _json("config.json", lambda c: c.update(
        hidden_size=2**32 - 1, num_attention_heads=1, num_key_value_heads=1, head_dim=None,
        rope_scaling={"rope_type": "llama3", "factor": 8.0})), ["config.json", "llama3 RoPE scaling over"]),
    "vocab-size-list": ("hf-llama", _json("config.json", lambda c: c.update(vocab_size=[])),
                        ["config.json", "vocab_size [] is not an integer"]),
    "rope-theta-dict": ("hf-llama", _json("config.json", lambda c: c.update(rope_theta={"a": 1})),
                        ["config.json", "rope_theta {'a': 1} is not a finite number"]),
    "llama3-string": ("hf-llama", _json("config.json", lambda c: c.update(rope_parameters={
        "rope_type": "llama3", "high_freq_factor": ""})), ["config.json", "rope_parameters.high_freq_factor"]),
    "index-outside": ("gemma2-4bit", _json("model.safetensors.index.json", lambda i: i["weight_map"].update(
        {"model.norm.weight": "/proc/self/mem"})),
        ["model.safetensors.index.json", "model.norm.weight", "/proc/self/mem"]),
    "vocab-gap": ("hf-llama", _json("tokenizer.json", lambda t: t["model"]["vocab"].update(H=999_999)),
                  ["tokenizer.json has 1000000 tokens", "360 rows"]),
    "vocab-empty": ("gemma2-4bit", _json("tokenizer.json", lambda t: t["model"].update(vocab={})),
                    ["tokenizer.json cannot encode text"]),
    "tokenizer-utf8": ("qwen2-8bit", lambda f: (f / "tokenizer.json").write_bytes(
        (f / "tokenizer.json").read_bytes()[:200] + "é".encode()[:1]), ["tokenizer.json", "not valid UTF-8"]),
    "text-config-string": ("llama-4bit", _json("config.json", lambda c: c.update(text_config="x")), None),
}


@pytest.mark.parametrize("case", FOUND)
def test_found_folder_inputs_fail_in_one_line(folder_seeds, tmp_path, case):
    from infer.cli.errors import user_errors
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM

    seed, edit, words = FOUND[case]
    folder = tmp_path / case
    shutil.copytree(folder_seeds[seed], folder)
    edit(folder)
    if words is None:
        LLM.load(folder, EngineConfig(n_ctx=64, n_threads=1, max_seqs=1))
        return
    with pytest.raises(user_errors()) as e:
        LLM.load(folder, EngineConfig(n_ctx=64, n_threads=1, max_seqs=1))
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_found_imatrix_inputs_fail_in_one_line(tmp_path):
    """Metadata that ends up in the quantized file's keys (a uint32, a string list), and values the
    quantizers weigh their error by."""
    import gguf
    import numpy as np

    from infer.models.imatrix import ImatrixError, load_imatrix

    def write(path: Path, meta, values) -> Path:
        w = gguf.GGUFWriter(str(path), "imatrix")
        meta(w)
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.asarray(values, np.float32).reshape(1, -1))
        w.add_tensor("blk.0.attn_q.weight.counts", np.ones((1, 1), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    ok = [1.0] * 32
    for meta, values, words in (
            (lambda w: w.add_uint64("imatrix.chunk_count", 2**40), ok, "imatrix.chunk_count 1099511627776"),
            (lambda w: w.add_string("imatrix.chunk_count", "abc"), ok, "imatrix.chunk_count 'abc'"),
            (lambda w: w.add_uint32("imatrix.datasets", 5), ok, "imatrix.datasets is not a list of strings"),
            (lambda w: None, [-1.0] * 32, "'blk.0.attn_q.weight.in_sum2' has negative values"),
            (lambda w: None, [float("nan")] * 32, "'blk.0.attn_q.weight.in_sum2' has non-finite values")):
        path = write(tmp_path / "im.gguf", meta, values)
        with pytest.raises(ImatrixError, match=words.replace("(", r"\(")) as e:
            load_imatrix(path)
        assert str(path) in str(e.value)
