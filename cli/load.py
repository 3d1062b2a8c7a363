"""Loading a model for a command: the path resolved, a status line while weights load or kernels
compile on a terminal, the backend's warnings printed as one line each."""
from __future__ import annotations

import sys
import time
import warnings


def load_llm(model_name: str | None, config, quiet: bool):
    """The LLM for MODEL (None: the embedded default), its kernels warmed up, so that the first
    request pays for neither; quiet: no status line (also off when stderr is no terminal).

    Kernels compile the first time a quant type is used (and are cached for later runs), several
    processes at once where the machine has the cores (engine/llm.py's load_warm): the
    status line then counts them, names any that compile in this process, and a line after says
    how long it took."""
    from rich.console import Console

    from infer.backends.cpu.compiling import watch_compiles
    from infer.engine.llm import load_warm
    from infer.models.resolve import locate_model, resolve_model

    if not model_name:
        found = locate_model(None)
        if found.note:
            sys.stderr.write(f"note: {found.note}\n")
    path = resolve_model(model_name)
    console = Console(stderr=True)
    shown = not quiet and console.is_terminal
    status = console.status(f"Loading {path.name}…") if shown else None

    first_use = "Compiling kernels for this model's quant types (first use only)"
    ahead = [0, 0]  # kernels compiled ahead, processes

    def started(n_kernels: int, n_processes: int) -> None:
        ahead[:] = [n_kernels, n_processes]
        if status is not None:
            status.update(f"{first_use}: 0/{n_kernels} in {n_processes} processes…")

    def done(n: int) -> None:
        if status is not None:
            status.update(f"{first_use}: {n}/{ahead[0]} in {ahead[1]} processes…")

    def compiling(name: str, n: int) -> None:
        if status is not None:
            status.update(f"{first_use}: {ahead[0] + n} {name}…")

    with warnings.catch_warnings(record=True) as caught, watch_compiles(compiling) as log:
        warnings.simplefilter("always", RuntimeWarning)  # a backend's warnings (an --mlock refusal)
        if status is not None:
            status.start()
        try:
            t0 = time.perf_counter()
            llm = load_warm(path, config, started, done)
            took = time.perf_counter() - t0
        finally:
            if status is not None:
                status.stop()
    for message in dict.fromkeys(str(w.message) for w in caught):  # once: a load that stops to compile warns too
        sys.stderr.write(f"warning: {message}\n")
    if (ahead[0] or log.kernels) and shown:
        sys.stderr.write(f"compiled {ahead[0] + len(log.kernels)} kernels in {took if ahead[0] else log.seconds:.0f} s (kept for "
                         "later runs; `infer kernels --warm` compiles every quant type ahead)\n")
    return llm
