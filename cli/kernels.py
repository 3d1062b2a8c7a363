"""Remembering whether numba has compiled and cached the kernels, to tell the user on the first run."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from infer.models.default import infer_home


def _marker():
    try:
        v = version("infer")
    except PackageNotFoundError:
        v = "dev"
    return infer_home() / f"kernels-compiled-{v}"


def kernels_compiled() -> bool:
    return _marker().exists()


def mark_kernels_compiled() -> None:
    m = _marker()
    m.parent.mkdir(parents=True, exist_ok=True)
    m.touch()
