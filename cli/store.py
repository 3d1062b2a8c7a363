"""`infer list`, `infer show MODEL`, `infer rm MODEL`: the local model store (logic in infer.models)."""
from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Optional

import typer

from .app import app
from .errors import reported
from .sizes import format_size


@app.command("list", help="List pulled models: name, format, quant, size, when pulled.")
def list_models(as_json: bool = typer.Option(False, "--json", help="Print a JSON array.")) -> None:
    with reported():
        from infer.models.store import ModelStore

        models = ModelStore().list()
        if as_json:
            json.dump([m.to_json() for m in models], sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        if not models:
            sys.stderr.write("no models pulled yet (infer pull OWNER/REPO[:QUANT])\n")
            return
        rows = [("NAME", "FORMAT", "QUANT", "SIZE", "PULLED")] + [
            (m.name, m.format, m.quant or "-", format_size(m.size), _local_time(m.pulled_at)) for m in models
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


@app.command(help="Describe MODEL (a pulled name, a .gguf path, a model folder, or the embedded default).")
def show(
    model: Optional[str] = typer.Argument(None, help="Pulled name, .gguf path or folder (default: the embedded model)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    with reported():
        from infer.models.describe import describe_model

        info = describe_model(model)
        if as_json:
            json.dump(info.to_json(), sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        rows = [
            ("name", info.name),
            ("format", info.format),
            ("architecture", info.architecture),
            ("parameters", _count(info.parameters)),
            ("context length", str(info.context_length) if info.context_length else "unknown"),
            ("quantization", info.quantization or "none"),
            *info.details,
            ("chat template", "yes" if info.chat_template else "none in the model"),
            ("license", info.license or "not stated"),
            *((("repo", info.repo), ("revision", info.revision or "")) if info.repo else ()),
            ("path", info.path),
        ]
        width = max(len(k) for k, _ in rows)
        out = sys.stdout
        out.write("Model\n")
        for k, v in rows:
            out.write(f"  {k.ljust(width)}  {v}\n")
        if info.tensor_types:
            out.write("Tensor types\n")
            tw = max(len(t.type) for t in info.tensor_types)
            for t in info.tensor_types:
                out.write(f"  {t.type.ljust(tw)}  {t.count:>5} tensors  {format_size(t.bytes):>8}\n")


@app.command(help="Remove a pulled MODEL: its manifest and its files in the Hugging Face cache.")
def rm(
    model: str = typer.Argument(..., help="Pulled name: owner/repo:QUANT or owner/repo."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    with reported():
        from infer.models.store import ModelNotFoundError, ModelStore

        store = ModelStore()
        m = store.get(model)
        if m is None:
            raise ModelNotFoundError(store.unknown_message(model))
        if not yes:
            if not sys.stdin.isatty():
                sys.stderr.write(f"error: not removing {m.name} without confirmation: stdin is not a terminal (add --yes)\n")
                raise typer.Exit(1)
            if not typer.confirm(f"Remove {m.name} ({format_size(m.size)})?", default=False):
                sys.stderr.write(f"kept {m.name}\n")
                return
        store.remove(m.name)
        sys.stderr.write(f"removed {m.name} ({format_size(m.size)})\n")


def _count(n: int | None) -> str:
    if not n:
        return "unknown"
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{suffix} ({n:,})"
    return str(n)


def _local_time(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso
