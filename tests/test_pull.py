"""`infer pull` against a local fake Hub (tests/helpers/fake_hub.py): real downloads through huggingface_hub, never the real Hub."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.fake_hub import FakeHub, FakeRepo
from infer.models.hub import PullError, RemoteFile, quant_tag, select_files
from infer.models.store import ModelStore

GEMMA_Q4 = "gemma-3-270m-it-Q4_K_M.gguf"
GEMMA_Q8 = "gemma-3-270m-it-Q8_0.gguf"


def _safetensors(values: list[float]) -> bytes:
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


@pytest.fixture(scope="module")
def repos(gemma_path: Path) -> dict[str, FakeRepo]:
    small = os.urandom(600_000)
    split = os.urandom(3 * 400_000 + 17)
    third = len(split) // 3
    tokenizer = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}).encode()
    return {
        # The embedded GGUF served under two quant names (the Hub would hold different bytes; pull does not care).
        "acme/gemma-GGUF": FakeRepo({GEMMA_Q4: gemma_path, GEMMA_Q8: gemma_path, "README.md": b"# gemma\n"}),
        "acme/choices-GGUF": FakeRepo({"m-Q8_0.gguf": small, "m-F16.gguf": small[::-1], "m-IQ4_XS.gguf": small[:1000],
                                       "mmproj-m-F16.gguf": b"projector"}),
        "acme/only-GGUF": FakeRepo({"Model.q5_k_s.gguf": small, "README.md": b"x"}),
        "acme/split-GGUF": FakeRepo({
            "big-Q4_K_M-00001-of-00003.gguf": split[:third],
            "big-Q4_K_M-00002-of-00003.gguf": split[third:2 * third],
            "big-Q4_K_M-00003-of-00003.gguf": split[2 * third:],
            "big-Q8_0.gguf": small,
        }),
        "acme/tiny-mlx": FakeRepo({
            "config.json": json.dumps({"model_type": "llama", "quantization": {"group_size": 64, "bits": 4}}).encode(),
            "model.safetensors": _safetensors([1.0, 2.0, 3.0, 4.0]),
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": b'{"bos_token": "<s>"}',
            "README.md": b"# tiny mlx\n",
            "pytorch_model.bin": os.urandom(2_000_000),  # another format of the same weights: never fetched
        }),
        "acme/tiny-st": FakeRepo({
            "config.json": b'{"model_type": "llama"}',
            "generation_config.json": b'{"do_sample": false}',
            "model-00001-of-00002.safetensors": _safetensors([1.0, 2.0]),
            "model-00002-of-00002.safetensors": _safetensors([3.0]),
            "model.safetensors.index.json": b'{"weight_map": {}}',
            "tokenizer.json": tokenizer,
            "special_tokens_map.json": b"{}",
            "LICENSE": b"MIT\n",
            "original/consolidated.pth": os.urandom(100_000),
            "onnx/model.onnx": os.urandom(100_000),
        }),
        "acme/gated-GGUF": FakeRepo({"g-Q4_K_M.gguf": small}, gated=True),
    }


@pytest.fixture(scope="module")
def gemma_sha256(gemma_path: Path) -> str:
    return _sha256(gemma_path)


@pytest.fixture
def hub(repos):
    with FakeHub(repos) as h:
        yield h


@pytest.fixture
def env(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    # Each test has its own HF cache and infer home, and talks only to the fake Hub.
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    e.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"), INFER_HOME=str(tmp_path / "infer"),
             HF_HUB_DISABLE_TELEMETRY="1")
    return e


def infer(env: dict[str, str], *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "infer.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == lines[0], r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def store(env: dict[str, str]) -> ModelStore:
    return ModelStore(Path(env["INFER_HOME"]))


def _sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _blobs(env: dict[str, str]) -> list[Path]:
    return [p for p in (Path(env["HF_HOME"]) / "hub").glob("models--*/blobs/*")]


@pytest.mark.e2e
def test_pull_by_quant_tag_case_insensitive(env, hub, repos, gemma_sha256):
    r = infer(env, "pull", "acme/gemma-GGUF:q4_k_m")
    assert r.returncode == 0, r.stderr
    name, path, size = r.stdout.splitlines()
    assert name == "acme/gemma-GGUF:Q4_K_M" and path.endswith("/" + GEMMA_Q4) and size.endswith("MB")
    m = store(env).get("acme/gemma-GGUF:Q4_K_M")
    assert m is not None and m.path == path and m.files == (GEMMA_Q4,) and m.quant == "Q4_K_M" and m.format == "gguf"
    assert m.revision == repos["acme/gemma-GGUF"].commit and m.size == os.path.getsize(path)
    assert _sha256(m.path) == gemma_sha256
    # In the ordinary HF cache under HF_HOME, where other HF tools find it.
    assert Path(path).is_relative_to(Path(env["HF_HOME"]) / "hub" / "models--acme--gemma-GGUF" / "snapshots")
    assert (Path(env["HF_HOME"]) / "hub/models--acme--gemma-GGUF/refs/main").read_text() == m.revision
    assert not hub.fetched("README.md") and not hub.fetched(GEMMA_Q8)

    r = infer(env, "pull", "acme/gemma-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert store(env).get("acme/gemma-GGUF:q8_0").files == (GEMMA_Q8,)


@pytest.mark.e2e
def test_pulled_model_runs_and_is_listed_shown_removed(env, hub):
    assert infer(env, "pull", "acme/gemma-GGUF:Q4_K_M").returncode == 0
    r = infer(env, "run", "acme/gemma-GGUF", "hi", "--max-tokens", "3", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert 1 <= json.loads(r.stdout)["completion_tokens"] <= 3
    listed = json.loads(infer(env, "list", "--json").stdout)
    assert [m["name"] for m in listed] == ["acme/gemma-GGUF:Q4_K_M"]
    shown = infer(env, "show", "acme/gemma-GGUF:q4_k_m")
    assert shown.returncode == 0 and "gemma3" in shown.stdout
    path = store(env).get("acme/gemma-GGUF").path
    assert infer(env, "rm", "acme/gemma-GGUF:Q4_K_M", "--yes").returncode == 0
    assert store(env).list() == [] and not os.path.exists(path)
    assert_one_line_error(infer(env, "run", "acme/gemma-GGUF", "hi"), "infer pull")


@pytest.mark.e2e
def test_default_quant(env, hub):
    r = infer(env, "pull", "acme/gemma-GGUF")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "acme/gemma-GGUF:Q4_K_M"
    r = infer(env, "pull", "acme/only-GGUF")  # no Q4_K_M, but only one GGUF
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "acme/only-GGUF:Q5_K_S"
    assert [m.name for m in store(env).list()] == ["acme/gemma-GGUF:Q4_K_M", "acme/only-GGUF:Q5_K_S"]


@pytest.mark.e2e
def test_lists_choices_without_q4_k_m_or_for_unknown_quant(env, hub):
    line = assert_one_line_error(infer(env, "pull", "acme/choices-GGUF"), "several quants", "F16, IQ4_XS, Q8_0")
    assert "MMPROJ" not in line.upper()
    assert_one_line_error(infer(env, "pull", "acme/choices-GGUF:Q2_K"), "no Q2_K file", "F16, IQ4_XS, Q8_0")
    assert store(env).list() == [] and not hub.fetched("m-Q8_0.gguf")
    r = infer(env, "pull", "acme/choices-GGUF:iq4_xs")
    assert r.returncode == 0, r.stderr
    assert store(env).get("acme/choices-GGUF:IQ4_XS").files == ("m-IQ4_XS.gguf",)


@pytest.mark.e2e
def test_split_gguf_is_fetched_whole(env, hub, repos):
    r = infer(env, "pull", "acme/split-GGUF")
    assert r.returncode == 0, r.stderr
    m = store(env).get("acme/split-GGUF:Q4_K_M")
    assert m.files == tuple(f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert m.path.endswith("big-Q4_K_M-00001-of-00003.gguf")
    folder = Path(m.path).parent
    joined = b"".join((folder / f).read_bytes() for f in m.files)
    files = repos["acme/split-GGUF"].files
    assert joined == b"".join(files[f] for f in m.files) and m.size == len(joined)
    assert not hub.fetched("big-Q8_0.gguf")


@pytest.mark.e2e
def test_resumes_after_the_connection_drops_mid_file(env, hub, gemma_sha256):
    hub.cut_once.add(("acme/gemma-GGUF", GEMMA_Q4))
    r = infer(env, "pull", "acme/gemma-GGUF:Q4_K_M")
    assert r.returncode == 0, r.stderr
    assert _sha256(store(env).get("acme/gemma-GGUF:Q4_K_M").path) == gemma_sha256
    gets = [h for method, path, h in hub.requests if method == "GET" and path.startswith("/blobs/")]
    assert len(gets) == 2 and "range" not in gets[0]
    # huggingface_hub retried with a Range from the bytes it kept (whole 10 MB chunks), not from zero.
    start = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= os.path.getsize(store(env).get("acme/gemma-GGUF:Q4_K_M").path) // 2


@pytest.mark.e2e
def test_corrupted_download_is_rejected_and_deleted(env, hub):
    hub.corrupt.add(("acme/choices-GGUF", "m-Q8_0.gguf"))
    assert_one_line_error(infer(env, "pull", "acme/choices-GGUF:Q8_0"), "checksum mismatch", "m-Q8_0.gguf", "sha256")
    assert store(env).list() == []
    assert _blobs(env) == []  # the bad bytes are not left in the HF cache for the next pull to trust
    hub.corrupt.clear()
    r = infer(env, "pull", "acme/choices-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr


@pytest.mark.e2e
def test_a_bad_copy_already_in_the_cache_is_fetched_again(env, hub, repos):
    # What a pull killed between huggingface_hub's download and its check leaves when the bytes were bad
    # (found by scripts/soak_pull.py), or damage on disk: the next pull checks the cached file and fetches
    # it again, rather than failing once more.
    name = "m-Q8_0.gguf"
    assert infer(env, "pull", "acme/choices-GGUF:Q8_0").returncode == 0
    path = Path(store(env).get("acme/choices-GGUF:Q8_0").path)
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    for unlinked in (False, True):  # True: killed before huggingface_hub linked the blob into the snapshot
        blob = path.resolve()
        blob.write_bytes(bytes(data))
        if unlinked:
            path.unlink()
        n = len(hub.fetched(name))
        r = infer(env, "pull", "acme/choices-GGUF:Q8_0")
        assert r.returncode == 0, r.stderr
        assert path.read_bytes() == repos["acme/choices-GGUF"].files[name] and len(hub.fetched(name)) == n + 1
    # fetched again and still bad: the mismatch is reported, as for any download
    path.resolve().write_bytes(bytes(data))
    hub.corrupt.add(("acme/choices-GGUF", name))
    assert_one_line_error(infer(env, "pull", "acme/choices-GGUF:Q8_0"), "checksum mismatch", name)
    assert _blobs(env) == []


@pytest.mark.e2e
def test_a_stalled_download_is_retried(env, hub, repos):
    # The CDN sends half the file and then nothing, the connection open: huggingface_hub's read timeout
    # (HF_HUB_DOWNLOAD_TIMEOUT, 10 s by default) ends the wait and it asks again.
    name = "m-Q8_0.gguf"
    hub.faults[("acme/choices-GGUF", name)] = [("stall", 300_000)]
    r = infer(dict(env, HF_HUB_DOWNLOAD_TIMEOUT="1"), "pull", "acme/choices-GGUF:Q8_0")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert len(hub.fetched(name)) == 2
    m = store(env).get("acme/choices-GGUF:Q8_0")
    assert Path(m.path).read_bytes() == repos["acme/choices-GGUF"].files[name]


@pytest.mark.e2e
def test_a_download_that_keeps_stalling_fails_in_one_line_and_leaves_nothing(env, hub):
    # Every try stalls: after huggingface_hub's retries (6 tries of 1 s here), one line that says so,
    # not "cannot reach the Hub"; no half file anywhere in the cache, and the next pull starts over.
    hub.stall.add(("acme/choices-GGUF", "m-Q8_0.gguf"))
    r = infer(dict(env, HF_HUB_DOWNLOAD_TIMEOUT="1"), "pull", "acme/choices-GGUF:Q8_0")
    assert_one_line_error(r, "downloading acme/choices-GGUF stalled", "no data for 1 s", "HF_HUB_DOWNLOAD_TIMEOUT")
    assert store(env).list() == [] and _blobs(env) == []
    assert not [p for p in (Path(env["HF_HOME"]) / "hub").glob("models--*/snapshots/*/*")]
    hub.stall.clear()
    r = infer(env, "pull", "acme/choices-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr


@pytest.mark.e2e
def test_unknown_repo_and_revision(env, hub, repos):
    assert_one_line_error(infer(env, "pull", "acme/nope-GGUF:Q4_K_M"), "acme/nope-GGUF", "not found", hub.endpoint)
    assert_one_line_error(infer(env, "pull", "acme/only-GGUF", "--revision", "v9"), "revision 'v9' not found")
    commit = repos["acme/only-GGUF"].commit
    r = infer(env, "pull", "acme/only-GGUF", "--revision", commit)
    assert r.returncode == 0, r.stderr
    assert store(env).get("acme/only-GGUF").revision == commit and f"/snapshots/{commit}/" in r.stdout
    assert_one_line_error(infer(env, "pull", "not a name"), "not a model name")
    assert store(env).list() == [store(env).get("acme/only-GGUF")]


@pytest.mark.e2e
def test_gated_repo_needs_a_token(env, hub):
    assert_one_line_error(infer(env, "pull", "acme/gated-GGUF"), "gated", "HF_TOKEN")
    assert store(env).list() == []
    assert_one_line_error(infer(env, "pull", "acme/gated-GGUF", "--token", "hf_wrong"), "gated", "no access")
    r = infer(dict(env, HF_TOKEN=hub.token), "pull", "acme/gated-GGUF")
    assert r.returncode == 0, r.stderr
    assert store(env).get("acme/gated-GGUF:Q4_K_M") is not None
    # The token goes to the Hub, never to the CDN the file is redirected to.
    assert any(h.get("authorization") == f"Bearer {hub.token}" for _, p, h in hub.requests if "/resolve/" in p)
    assert all("authorization" not in h for _, p, h in hub.requests if p.startswith("/blobs/"))


@pytest.mark.e2e
def test_token_option(env, hub):
    r = infer(env, "pull", "acme/gated-GGUF:Q4_K_M", "--token", hub.token)
    assert r.returncode == 0, r.stderr


@pytest.mark.e2e
def test_offline_uses_the_cache_and_says_when_it_cannot(env, hub):
    assert_one_line_error(infer(env, "pull", "acme/only-GGUF", "--offline"), "not in the local cache", "offline")
    assert infer(env, "pull", "acme/only-GGUF").returncode == 0
    online = store(env).get("acme/only-GGUF")
    n = len(hub.requests)
    for extra in ({"HF_HUB_OFFLINE": "1"}, {}):
        r = infer(dict(env, **extra), "pull", "acme/only-GGUF", *([] if extra else ["--offline"]))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[:2] == [online.name, online.path]
    assert len(hub.requests) == n  # offline means no request at all
    # From the HF cache alone (pulled by another HF tool, say): the manifest is rebuilt from the snapshot.
    for f in Path(env["INFER_HOME"], "store").glob("*.json"):
        f.unlink()
    r = infer(dict(env, HF_HUB_OFFLINE="1"), "pull", "acme/only-GGUF:q5_k_s")
    assert r.returncode == 0, r.stderr
    assert store(env).get("acme/only-GGUF:Q5_K_S").path == online.path
    assert_one_line_error(infer(dict(env, HF_HUB_OFFLINE="1"), "pull", "acme/only-GGUF:Q8_0"), "no Q8_0 file")


@pytest.mark.e2e
def test_mlx_repo_fetches_only_what_the_model_needs(env, hub):
    r = infer(env, "pull", "acme/tiny-mlx")
    assert r.returncode == 0, r.stderr
    m = store(env).get("acme/tiny-mlx")
    assert m.name == "acme/tiny-mlx" and m.format == "mlx" and m.quant is None
    assert sorted(m.files) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in Path(m.path).iterdir()) == sorted(m.files)
    assert not hub.fetched("pytorch_model.bin") and not hub.fetched("README.md")
    assert_one_line_error(infer(env, "pull", "acme/tiny-mlx:Q4_K_M"), "no GGUF files")


@pytest.mark.e2e
def test_safetensors_repo(env, hub):
    r = infer(env, "pull", "acme/tiny-st")
    assert r.returncode == 0, r.stderr
    m = store(env).get("acme/tiny-st")
    assert m.format == "safetensors"
    assert sorted(m.files) == ["LICENSE", "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                               "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                               "special_tokens_map.json", "tokenizer.json"]
    assert m.size == sum((Path(m.path) / f).stat().st_size for f in m.files)
    assert not hub.fetched("consolidated.pth") and not hub.fetched("model.onnx")


@pytest.mark.e2e
def test_connection_refused_names_the_endpoint(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        assert_one_line_error(infer(dict(env, HF_ENDPOINT=dead), "pull", "acme/only-GGUF"), "cannot reach", dead)
    assert store(env).list() == []


@pytest.mark.e2e
def test_disk_full(env, hub):
    # A full disk is simulated where huggingface_hub writes the download: the CLI must still answer in one line.
    code = ("import errno, sys, huggingface_hub.file_download as fd\n"
            "def full(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "fd.http_get = full\n"
            "sys.argv = ['infer'] + sys.argv[1:]\n"
            "from infer.cli.main import main\n"
            "main()\n")
    assert_one_line_error(infer(env, "pull", "acme/only-GGUF", code=code), "disk full")
    assert store(env).list() == [] and _blobs(env) == []


@pytest.mark.parametrize("name, tag", [
    ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"), ("llama-2-7b.Q8_0.gguf", "Q8_0"),
    ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"), ("sub/Model-IQ4_XS-00001-of-00002.gguf", "IQ4_XS"),
    ("phi-bf16.gguf", "BF16"), ("x-Q4_0_4_4.gguf", "Q4_0_4_4"), ("qwen2-model.gguf", None),
])
def test_quant_tag(name, tag):
    assert quant_tag(name) == tag


def test_select_rejects_incomplete_split():
    files = [RemoteFile(f"m-Q4_K_M-0000{i}-of-00003.gguf", 1, None, None) for i in (1, 3)]
    with pytest.raises(PullError, match="2 of 3 shards"):
        select_files("a/b", None, files)
