"""`infer kernels --warm`: compile the cpu backend's kernels for every quant type ahead of use."""
from __future__ import annotations

import os
import sys
import time
from typing import List

import typer

from .app import app
from .errors import reported


@app.command(name="kernels", help="Compile the cpu backend's kernels ahead (--warm), for every quant type or "
                                  "those named: a model of a new type then answers without compiling.")
def kernels(
    warm: bool = typer.Option(False, "--warm", help="Compile (and cache) the kernels now."),
    types: List[str] = typer.Option([], "--type", help="Only this quant type (repeatable), e.g. Q4_K."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Types compiled at once, one process each (0: every core)."),
) -> None:
    with reported():
        from infer.engine.warm import WARM_TYPES, warm_kernels
        from infer.quant.types import QTYPES

        by_name = {QTYPES[t].name: t for t in WARM_TYPES}
        unknown = [n for n in types if n.upper() not in by_name]
        if unknown:
            raise typer.BadParameter(f"unknown quant type {unknown[0]!r} (one of {', '.join(by_name)})",
                                     param_hint="--type")
        ids = [by_name[n.upper()] for n in types] or list(WARM_TYPES)
        if not warm:
            sys.stdout.write(f"the cpu backend compiles kernels for: {', '.join(QTYPES[t].name for t in ids)}\n"
                             "run `infer kernels --warm` to compile them now\n")
            return
        n_jobs = jobs or os.cpu_count() or 1
        t0 = time.perf_counter()
        done = 0

        def report(type_id: int, cache_type: str, seconds: float) -> None:
            nonlocal done
            done += 1
            kv = "" if cache_type == "f16" else f" (KV cache {cache_type})"
            sys.stderr.write(f"[{done}] {QTYPES[type_id].name}{kv}: {seconds:.0f} s\n")

        sys.stderr.write(f"compiling kernels for {len(ids)} quant types, {n_jobs} at a time…\n")
        warm_kernels(ids, n_jobs, on_done=report)
        sys.stderr.write(f"done in {time.perf_counter() - t0:.0f} s\n")
