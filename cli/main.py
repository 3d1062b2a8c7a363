"""The `infer` command line. Typer commands only: the work happens in infer.engine."""
from __future__ import annotations

import os
import sys

from .app import app


def _configure_numba_cache() -> None:
    """Keep numba's compiled kernels under the infer home when the package folder is read-only."""
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    from pathlib import Path

    pkg_dir = Path(__file__).resolve().parent.parent
    if not os.access(pkg_dir, os.W_OK):
        from infer.models.default import infer_home

        os.environ["NUMBA_CACHE_DIR"] = str(infer_home() / "numba-cache")


def main() -> None:
    _configure_numba_cache()
    from . import backends, bench, chat, ps, pull, quantize, run, serve, store  # noqa: F401  (registers the commands)

    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.exit(130)
