"""Loading a model for a command: the path resolved, a status line while kernels compile or
weights load on a terminal, the backend's warnings printed as one line each."""
from __future__ import annotations

import sys
import warnings


def load_llm(model_name: str | None, config, quiet: bool):
    """The LLM for MODEL (None: the embedded default), its kernels warmed up, so that the first
    request pays for neither; quiet: no status line (also off when stderr is no terminal)."""
    from rich.console import Console

    from infer.engine.llm import LLM
    from infer.models.resolve import locate_model, resolve_model

    from .kernels import kernels_compiled, mark_kernels_compiled

    if not model_name:
        found = locate_model(None)
        if found.note:
            sys.stderr.write(f"note: {found.note}\n")
    path = resolve_model(model_name)
    console = Console(stderr=True)
    first = not kernels_compiled()
    msg = "Compiling kernels (first run only)…" if first else f"Loading {path.name}…"
    with warnings.catch_warnings(record=True) as caught:  # a backend's warnings (an --mlock refusal)
        warnings.simplefilter("always", RuntimeWarning)
        if quiet or not console.is_terminal:
            llm = LLM.load(path, config)
            llm.runner.warmup()
        else:
            with console.status(msg):
                llm = LLM.load(path, config)
                llm.runner.warmup()
    for w in caught:
        sys.stderr.write(f"warning: {w.message}\n")
    if first:
        mark_kernels_compiled()
    return llm
