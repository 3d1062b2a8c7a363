"""The local model store and `infer list/show/rm`, over a fake Hugging Face cache holding the embedded Gemma."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infer.models.resolve import ModelNotFoundError, resolve_model
from infer.models.store import ModelStore, StoredModel

pytestmark = pytest.mark.e2e  # every test runs `infer` as a subprocess

SHA_A = "a" * 40
SHA_B = "b" * 40
PULLED_AT = "2025-03-04T05:06:07+00:00"


@pytest.fixture()
def homes(tmp_path: Path) -> tuple[Path, Path]:
    """(INFER_HOME, HF hub cache) in tmp dirs."""
    return tmp_path / "infer-home", tmp_path / "hf-home" / "hub"


def infer(homes: tuple[Path, Path], *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    infer_home, hub = homes
    env = dict(os.environ, HF_HUB_OFFLINE="1", INFER_HOME=str(infer_home), HF_HOME=str(hub.parent), TZ="UTC")
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True,
                          input=input, timeout=600, env=env)


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def put_blob(hub: Path, repo: str, revision: str, rel: str, source: Path, blob: str) -> Path:
    """Place `source` in the HF cache layout: snapshots/<rev>/<rel> -> ../../blobs/<blob>; returns the link."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    blob_path = repo_dir / "blobs" / blob
    blob_path.parent.mkdir(parents=True, exist_ok=True)
    if not blob_path.exists():
        try:
            os.link(source, blob_path)
        except OSError:
            shutil.copyfile(source, blob_path)
    link = repo_dir / "snapshots" / revision / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob_path, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return link


def gguf_entry(hub: Path, gemma: Path, repo: str = "acme/gemma-GGUF", quant: str = "Q4_K_M",
               rel: str | None = None, revision: str = SHA_A, blob: str = "1" * 64) -> StoredModel:
    rel = rel or f"gemma-{quant.lower()}.gguf"
    link = put_blob(hub, repo, revision, rel, gemma, blob)
    return StoredModel(name=f"{repo}:{quant}", repo=repo, quant=quant, revision=revision, format="gguf",
                       path=str(link), files=(rel,), size=gemma.stat().st_size, pulled_at=PULLED_AT)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], int]]) -> None:
    """A safetensors file whose header is real; the data is zeros of the right length."""
    header, offset = {}, 0
    for name, (dtype, shape, itemsize) in tensors.items():
        n = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def mlx_entry(hub: Path, tmp: Path, repo: str = "mlx-community/tiny-4bit") -> StoredModel:
    src = tmp / "mlx-src"
    src.mkdir(exist_ok=True)
    (src / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "quantization": {"group_size": 64, "bits": 4},
    }))
    (src / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (src / "README.md").write_text("---\nlicense: apache-2.0\ntags: [mlx]\n---\n# tiny\n")
    # A 4-bit 128x64 weight packs 8 values per uint32 (128x8), with per-group scales and biases.
    write_safetensors(src / "model.safetensors", {
        "layer.weight": ("U32", (128, 8), 4), "layer.scales": ("F16", (128, 1), 2),
        "layer.biases": ("F16", (128, 1), 2), "norm.weight": ("F16", (64,), 2),
    })
    files = ("README.md", "config.json", "model.safetensors", "tokenizer_config.json")
    for i, f in enumerate(files):
        link = put_blob(hub, repo, SHA_A, f, src / f, f"{i}" * 64)
    snap = link.parent
    return StoredModel(name=repo, repo=repo, quant=None, revision=SHA_A, format="mlx", path=str(snap),
                       files=files, size=sum((src / f).stat().st_size for f in files), pulled_at=PULLED_AT)


# --- the store itself -------------------------------------------------------------------------


def test_add_get_list_and_name_rules(homes, gemma_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    q4 = gguf_entry(hub, gemma_path)
    store.add(q4)
    assert store.list() == [q4]
    assert store.get("acme/gemma-GGUF:q4_k_m") == q4  # quant tags are case-insensitive
    assert store.get("acme/gemma-GGUF") == q4  # the only quant of the repo
    assert store.get("acme/gemma-GGUF:Q8_0") is None and store.get("other/repo") is None
    assert store.get("not a name") is None

    q8 = gguf_entry(hub, gemma_path, quant="Q8_0", blob="2" * 64)
    store.add(q8)
    assert store.get("acme/gemma-GGUF") == q4  # several quants: Q4_K_M is the default
    store.remove(q4.name)
    store.add(gguf_entry(hub, gemma_path, quant="Q6_K", blob="3" * 64))
    assert store.get("acme/gemma-GGUF") is None  # several, none Q4_K_M: ambiguous
    assert "several pulled quants" in store.unknown_message("acme/gemma-GGUF")

    newer = StoredModel(**{**q8.to_json(), "files": q8.files, "revision": SHA_B})
    store.add(newer)  # same name: replaces
    assert [m.revision for m in store.list() if m.name == q8.name] == [SHA_B]
    assert [m.name for m in store.list()] == ["acme/gemma-GGUF:Q6_K", "acme/gemma-GGUF:Q8_0"]


def test_interrupted_manifest_write_is_ignored(homes, gemma_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    m = gguf_entry(hub, gemma_path)
    store.add(m)
    # What a crash mid-write leaves: a half-written temp file next to the real manifests.
    (store.dir / "acme--other--Q4_K_M.json.1234.tmp").write_text('{"name": "acme/other:Q4_K_M", "re')
    (store.dir / "notes.json").write_text("not a manifest")
    assert store.list() == [m]
    r = infer(homes, "list", "--json")
    assert r.returncode == 0, r.stderr
    assert [e["name"] for e in json.loads(r.stdout)] == [m.name]


# --- infer list / show ------------------------------------------------------------------------


def test_list_table_and_json(homes, gemma_path, tmp_path):
    infer_home, hub = homes
    r = infer(homes, "list")
    assert r.returncode == 0 and r.stdout == "" and "no models pulled" in r.stderr
    store = ModelStore(infer_home)
    gg, mlx = gguf_entry(hub, gemma_path), mlx_entry(hub, tmp_path)
    store.add(mlx)
    store.add(gg)

    r = infer(homes, "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "FORMAT", "QUANT", "SIZE", "PULLED"]
    assert lines[1].split() == ["acme/gemma-GGUF:Q4_K_M", "gguf", "Q4_K_M",
                                f"{gemma_path.stat().st_size / 1e6:.0f}", "MB", "2025-03-04", "05:06"]
    assert lines[2].split()[:3] == ["mlx-community/tiny-4bit", "mlx", "-"]

    r = infer(homes, "list", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [gg.to_json(), mlx.to_json()]


def test_show_pulled_gguf(homes, gemma_path):
    infer_home, hub = homes
    m = gguf_entry(hub, gemma_path)
    ModelStore(infer_home).add(m)
    r = infer(homes, "show", "acme/gemma-GGUF:q4_k_m")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for fragment in ("architecture", "gemma3", "context length", "32768", "Q4_K_M", "license", "gemma",
                     "chat template", m.path, "Q4_K ", "Q6_K ", "Q8_0 ", "F32 ", "268.10M"):
        assert fragment in text, (fragment, text)

    info = json.loads(infer(homes, "show", "acme/gemma-GGUF", "--json").stdout)
    from infer.models.gguf_file import read_gguf

    g = read_gguf(gemma_path)
    assert info["architecture"] == "gemma3" and info["context_length"] == 32768
    assert info["parameters"] == sum(int(np.prod(t.shape)) for t in g.tensors.values())
    types = {t["type"]: t for t in info["tensor_types"]}
    assert {"Q4_K", "Q6_K", "Q8_0", "F32"} <= set(types)
    assert sum(t["count"] for t in types.values()) == len(g.tensors)
    assert sum(t["bytes"] for t in types.values()) == sum(t.nbytes for t in g.tensors.values())
    assert info["chat_template"] is False  # Gemma 3 270M ships without one (infer has a built-in)
    assert info["license"] == "gemma" and info["repo"] == "acme/gemma-GGUF" and info["revision"] == SHA_A


def test_show_gguf_path_with_chat_template(homes, tmp_path):
    import gguf

    p = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_context_length(128)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    w.add_tensor("a", np.ones((4, 32), dtype=np.float32))
    w.add_tensor("b", np.ones((2, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = json.loads(infer(homes, "show", str(p), "--json").stdout)
    assert info["chat_template"] is True and info["context_length"] == 128 and info["parameters"] == 192
    assert {t["type"]: (t["count"], t["bytes"]) for t in info["tensor_types"]} == {"F32": (1, 512), "F16": (1, 128)}
    assert re.search(r"^  chat template +yes$", infer(homes, "show", str(p)).stdout, re.M)


def test_show_mlx_folder_and_pulled_mlx(homes, tmp_path):
    infer_home, hub = homes
    m = mlx_entry(hub, tmp_path)
    ModelStore(infer_home).add(m)
    for target in (m.name, m.path):
        r = infer(homes, "show", target, "--json")
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["format"] == "mlx" and info["architecture"] == "qwen2 (Qwen2ForCausalLM)"
        assert info["context_length"] == 4096 and info["quantization"] == "4-bit, group size 64"
        assert info["parameters"] == 128 * 64 + 64  # packed weight unpacked; scales and biases not counted
        assert info["chat_template"] is True and info["license"] == "apache-2.0"
        assert info["details"]["hidden size"] == "64"


# --- infer rm ---------------------------------------------------------------------------------


def test_rm_yes_removes_manifest_and_blob(homes, gemma_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    m = gguf_entry(hub, gemma_path)
    store.add(m)
    blob = Path(os.path.realpath(m.path))
    assert blob.exists() and blob.parent.name == "blobs"
    r = infer(homes, "rm", "acme/gemma-GGUF:q4_k_m", "--yes")
    assert r.returncode == 0, r.stderr
    assert "removed acme/gemma-GGUF:Q4_K_M" in r.stderr
    assert store.list() == [] and not blob.exists() and not os.path.lexists(m.path)
    assert not (hub / "models--acme--gemma-GGUF").exists()  # nothing left of the repo in the cache
    assert gemma_path.exists()
    assert_one_line_error(infer(homes, "rm", "acme/gemma-GGUF:Q4_K_M", "--yes"), "not pulled", "infer pull")


def test_rm_keeps_a_blob_another_model_uses(homes, gemma_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    # Two quants whose files are the same content, so the HF cache holds one blob for both.
    a = gguf_entry(hub, gemma_path, quant="Q4_K_M", blob="9" * 64)
    b = gguf_entry(hub, gemma_path, quant="Q4_K_S", blob="9" * 64)
    store.add(a)
    store.add(b)
    blob = Path(os.path.realpath(a.path))
    assert blob == Path(os.path.realpath(b.path))
    r = infer(homes, "rm", a.name, "--yes")
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(a.path) and blob.exists() and Path(b.path).exists()
    assert [m.name for m in store.list()] == [b.name]
    assert infer(homes, "rm", b.name, "-y").returncode == 0
    assert not blob.exists() and store.list() == []


def test_rm_mlx_snapshot(homes, tmp_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    m = mlx_entry(hub, tmp_path)
    (Path(m.path) / "extra.txt").write_text("a file infer did not pull")  # must survive
    store.add(m)
    assert infer(homes, "rm", m.name, "--yes").returncode == 0
    assert store.list() == []
    assert sorted(p.name for p in Path(m.path).iterdir()) == ["extra.txt"]
    assert not any((hub / "models--mlx-community--tiny-4bit" / "blobs").iterdir())


def test_rm_without_yes_needs_a_terminal(homes, gemma_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    m = gguf_entry(hub, gemma_path)
    store.add(m)
    assert_one_line_error(infer(homes, "rm", m.name, input="y\n"), "--yes", "not a terminal")
    assert store.list() == [m] and Path(m.path).exists()


# --- the resolver -----------------------------------------------------------------------------


def test_run_pulled_name_with_and_without_quant(homes, gemma_path):
    infer_home, hub = homes
    ModelStore(infer_home).add(gguf_entry(hub, gemma_path))
    outs = []
    for name in ("acme/gemma-GGUF:Q4_K_M", "acme/gemma-GGUF"):
        r = infer(homes, "run", name, "hi", "--max-tokens", "2", "--temperature", "0", "--json")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout)["token_ids"])
    assert outs[0] == outs[1] and 1 <= len(outs[0]) <= 2


def test_unknown_name_suggests_pull(homes):
    assert_one_line_error(infer(homes, "run", "acme/nothing:Q4_K_M", "hi"), "not found", "infer pull acme/nothing:Q4_K_M")
    assert_one_line_error(infer(homes, "show", "acme/nothing"), "infer pull acme/nothing")


def test_resolver_in_process(homes, gemma_path, tmp_path):
    infer_home, hub = homes
    store = ModelStore(infer_home)
    m = gguf_entry(hub, gemma_path)
    store.add(m)
    store.add(mlx_entry(hub, tmp_path))
    assert resolve_model("acme/gemma-GGUF:q4_k_m", store) == Path(m.path)
    assert resolve_model(str(gemma_path), store) == gemma_path
    assert resolve_model(str(Path(m.path).parent), store) == Path(m.path)  # a folder with one GGUF
    with pytest.raises(ModelNotFoundError, match="infer pull"):
        resolve_model("acme/unknown", store)
    mlx = store.get("mlx-community/tiny-4bit")
    assert resolve_model("mlx-community/tiny-4bit", store) == Path(mlx.path)  # the folder: MLX models run


def test_running_a_broken_mlx_model_is_a_clear_error(homes, tmp_path):
    infer_home, hub = homes
    ModelStore(infer_home).add(mlx_entry(hub, tmp_path))
    # The fake pull's config.json lacks hyperparameters (and it has no tokenizer.json nor real
    # weights): loading it says what is wrong in one line.
    assert_one_line_error(infer(homes, "run", "mlx-community/tiny-4bit", "hi"), "config.json",
                          "missing hyperparameter 'intermediate_size'")
