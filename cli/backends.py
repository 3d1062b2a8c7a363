"""`infer backends`: which compute backends exist, which can run here, on what, and why not."""
from __future__ import annotations

import json
import sys

import typer

from .app import app
from .errors import reported


@app.command(name="backends", help="List the compute backends, whether each is available here, and its devices.")
def backends(as_json: bool = typer.Option(False, "--json", help="Print a JSON list.")) -> None:
    with reported():
        from infer.engine.llm import choose_backend, probe_all

        infos = probe_all()
        auto = choose_backend("auto")
        if as_json:
            rows = [{"name": i.name, "available": i.available, "gpu": i.gpu, "devices": i.devices,
                     "reason": i.reason, "auto": i.name == auto} for i in infos]
            json.dump(rows, sys.stdout)
            sys.stdout.write("\n")
            return
        for i in infos:
            mark = "yes" if i.available else "no "
            star = "  (auto)" if i.name == auto else ""
            sys.stdout.write(f"{i.name:<10} {mark}{star}\n")
            for d in i.devices:
                sys.stdout.write(f"           {d}\n")
            if i.reason:
                sys.stdout.write(f"           {i.reason}\n")
