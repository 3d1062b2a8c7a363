"""The `infer` command line. Typer commands only: the work happens in infer.engine."""
from __future__ import annotations

import os
import sys


def _configure_numba_cache() -> None:
    """Keep numba's compiled kernels under the infer home when the package folder is read-only."""
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    from pathlib import Path

    pkg_dir = Path(__file__).resolve().parent.parent
    if not os.access(pkg_dir, os.W_OK):
        from infer.models.default import infer_home

        os.environ["NUMBA_CACHE_DIR"] = str(infer_home() / "numba-cache")


def register_commands() -> None:
    """Import every command module: each registers its commands on the Typer app as it loads."""
    from . import backends, bench, chat, embed, kernels, launch, ps, pull, quantize, run, serve, store  # noqa: F401


def main() -> None:
    # Everything inside the try, imports included: they take most of a second, and a Ctrl-C that lands
    # in them would otherwise print a traceback.
    try:
        _configure_numba_cache()
        from .app import app

        register_commands()

        app()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.exit(130)
