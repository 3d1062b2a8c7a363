"""`infer run` as a user runs it: a subprocess, its stdout, stderr and exit code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, infer
from helpers.tiny_models import write_tiny_model

pytestmark = pytest.mark.e2e  # every test runs `infer` as a subprocess


def test_run_default_model_json():
    r = infer("run", "Say hello.", "--temperature", "0", "--max-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "token_ids", "prompt_token_ids", "finish_reason", "prompt_tokens",
                        "completion_tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s"}
    assert out["prompt_token_ids"][:2] == [1, 9690]  # <|im_start|>system: the default SmolLM2's ChatML template
    assert 1 <= out["completion_tokens"] <= 8 and len(out["token_ids"]) == out["completion_tokens"]
    assert out["finish_reason"] in ("stop", "length") and out["text"]


def test_run_streams_text_and_stats_line():
    r = infer("run", "Count: 1, 2, 3,", "--raw", "--temperature", "0", "--max-tokens", "6")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "ttft" in r.stderr and "decode" in r.stderr and "prompt" in r.stderr


def test_run_is_reproducible_with_seed():
    args = ("run", "Tell me a word.", "--seed", "7", "--temperature", "1.0", "--max-tokens", "8", "--json")
    a, b = infer(*args), infer(*args)
    assert json.loads(a.stdout)["token_ids"] == json.loads(b.stdout)["token_ids"]


def test_stop_string_ends_generation():
    r = infer("run", "1, 2, 3, 4, 5, 6,", "--raw", "--temperature", "0", "--max-tokens", "20",
              "--stop", "9", "--json")
    out = json.loads(r.stdout)
    assert "9" not in out["text"] and out["finish_reason"] == "stop", out


def test_missing_model_path():
    assert_one_line_error(infer("run", "/nope/model.gguf", "hi"), "not found")


def test_not_a_gguf(tmp_path: Path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"hello, not a model" * 10)
    assert_one_line_error(infer("run", str(p), "hi"), str(p), "not a GGUF")


def test_truncated_gguf(tmp_path: Path, gemma_path: Path):
    p = tmp_path / "cut.gguf"
    with open(gemma_path, "rb") as f:
        p.write_bytes(f.read(50_000_000))
    assert_one_line_error(infer("run", str(p), "hi"), str(p), "truncated")


def test_truncated_header(tmp_path: Path, gemma_path: Path):
    p = tmp_path / "head.gguf"
    with open(gemma_path, "rb") as f:
        p.write_bytes(f.read(4000))
    assert_one_line_error(infer("run", str(p), "hi"), "truncated")


def test_unknown_architecture(tmp_path: Path):
    import gguf
    import numpy as np

    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(infer("run", str(p), "hi"), "unsupported architecture 'mamba'", "llama, qwen2, qwen3, gemma3")


def test_prompt_longer_than_context():
    r = infer("run", "word " * 200, "--ctx", "64", "--raw")
    assert_one_line_error(r, "context")


def test_bad_sampling_value():
    assert_one_line_error(infer("run", "hi", "--top-p", "1.5"), "top_p")


def test_tiny_model_runs(tmp_path: Path):
    p = write_tiny_model(tmp_path / "tiny.gguf", "qwen3")
    r = infer("run", str(p), "abc", "--raw", "--temperature", "0", "--max-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completion_tokens"] >= 1


def test_bench_json_on_tiny_model(tmp_path: Path):
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", seed=3)
    r = infer("bench", str(path), "-p", "32", "-n", "8", "--parallel", "3", "-r", "2", "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"model", "backend", "threads", "parallel", "prompt_tokens", "gen_tokens", "prefill_tok_s",
                        "decode_tok_s", "aggregate_decode_tok_s", "ttft_ms"}
    assert (out["backend"], out["threads"], out["parallel"], out["prompt_tokens"], out["gen_tokens"]) == ("cpu", 2, 3, 32, 8)
    assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0 and out["ttft_ms"] > 0
    # three streams share each step: together they beat one stream's rate
    assert out["aggregate_decode_tok_s"] > out["decode_tok_s"]


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_bench_at_depth(tmp_path: Path, arch: str):
    """-d: both tests after a context, served from the prefix cache (a hybrid model's by its state
    snapshot; run_bench refuses a context the cache did not serve)."""
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, seed=3)
    r = infer("bench", str(path), "-d", "64", "-p", "16", "-n", "4", "-r", "2", "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["depth"] == 64 and out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0
    assert (out["state_pool_bytes"] > 0) == (arch == "qwen35")  # the hybrid's recurrent states, beside its KV
    r = infer("bench", str(path), "-d", "40", "-p", "16", "-n", "4", "-r", "1", "--threads", "2")
    assert r.returncode == 0 and "pp16 @ d40" in r.stdout and "tg4 @ d40" in r.stdout, r.stderr
    assert_one_line_error(infer("bench", str(path), "-d", "-1"), "-d >= 0")
    if arch == "qwen35":  # no snapshot of the state: the context cannot be served, and bench says so
        assert_one_line_error(infer("bench", str(path), "-d", "64", "-p", "16", "-n", "4", "-r", "1", "--threads", "2",
                                    "--state-snapshots", "0"), "served 0 of the depth's 64", "--state-snapshots")


def test_cache_types(tmp_path: Path):
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", seed=3)
    r = infer("bench", str(path), "-p", "16", "-n", "4", "-r", "1", "--threads", "2", "--json",
              "-ctk", "q8_0", "--cache-type-v", "q8_0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["cache_type_k"], out["cache_type_v"]) == ("q8_0", "q8_0") and out["decode_tok_s"] > 0
    r = infer("run", str(path), "abc", "--raw", "--temperature", "0", "-n", "4", "--cache-type-k", "q8_0")
    assert r.returncode == 0, r.stderr
    assert_one_line_error(infer("run", str(path), "abc", "--cache-type-k", "q4_0"), "--cache-type-k", "'q4_0'", "f16, q8_0")


def test_bench_table_and_bad_kv_memory(tmp_path: Path):
    path = write_tiny_model(tmp_path / "tiny.gguf", "qwen2", seed=4)
    r = infer("bench", str(path), "-p", "16", "-n", "4", "-r", "1")
    assert r.returncode == 0, r.stderr
    assert "pp16" in r.stdout and "tg4" in r.stdout and "KV pool" in r.stdout
    assert_one_line_error(infer("bench", str(path), "--kv-memory", "1K"), "--kv-memory", "cannot hold")
    bad = infer("bench", str(path), "--kv-memory", "lots")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
