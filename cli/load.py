"""Loading a model for a command: the path resolved, a status line while weights load or kernels
compile on a terminal, the backend's warnings printed as one line each."""
from __future__ import annotations

import sys
import warnings


def load_llm(model_name: str | None, config, quiet: bool):
    """The LLM for MODEL (None: the embedded default), its kernels warmed up, so that the first
    request pays for neither; quiet: no status line (also off when stderr is no terminal).

    Kernels compile the first time a quant type is used (and are cached for later runs): the
    status line then names each kernel as it compiles, and a line after says how long it took."""
    from rich.console import Console

    from infer.backends.cpu.compiling import watch_compiles
    from infer.engine.llm import LLM
    from infer.models.resolve import locate_model, resolve_model

    if not model_name:
        found = locate_model(None)
        if found.note:
            sys.stderr.write(f"note: {found.note}\n")
    path = resolve_model(model_name)
    console = Console(stderr=True)
    shown = not quiet and console.is_terminal
    status = console.status(f"Loading {path.name}…") if shown else None

    def compiling(name: str, n: int) -> None:
        if status is not None:
            status.update(f"Compiling kernels for this model's quant types (first use only): {n} {name}…")

    with warnings.catch_warnings(record=True) as caught, watch_compiles(compiling) as log:
        warnings.simplefilter("always", RuntimeWarning)  # a backend's warnings (an --mlock refusal)
        if status is not None:
            status.start()
        try:
            llm = LLM.load(path, config)
            llm.runner.warmup()
        finally:
            if status is not None:
                status.stop()
    for w in caught:
        sys.stderr.write(f"warning: {w.message}\n")
    if log.kernels and shown:
        sys.stderr.write(f"compiled {len(log.kernels)} kernels in {log.seconds:.0f} s (kept for later runs; "
                         "`infer kernels --warm` compiles every quant type ahead)\n")
    return llm
