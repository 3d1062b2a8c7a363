"""`infer pull REPO[:QUANT]`: download a model from the Hugging Face Hub into the local store."""
from __future__ import annotations

import sys
from typing import Optional

import typer

from .app import app
from .errors import reported
from .sizes import format_size


@app.command(help="Download a model from the Hugging Face Hub: owner/repo[:QUANT] (GGUF quant, default Q4_K_M), "
                  "or an MLX / safetensors repo.")
def pull(
    name: str = typer.Argument(..., metavar="REPO[:QUANT]", help="e.g. unsloth/gemma-3-270m-it-GGUF:Q8_0"),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token for gated or private repos "
                                        "(default: $HF_TOKEN or the saved login)."),
    offline: bool = typer.Option(False, "--offline", help="Use only what is cached (also: HF_HUB_OFFLINE=1)."),
) -> None:
    with reported():
        from rich.console import Console

        from infer.models.hub import pull as pull_model

        console = Console(stderr=True)
        if console.is_terminal and not offline:
            with _progress(console) as report:
                model = pull_model(name, revision=revision, token=token, offline=offline, progress=report)
        else:
            model = pull_model(name, revision=revision, token=token, offline=offline)
    sys.stdout.write(f"{model.name}\n{model.path}\n{format_size(model.size)}\n")


class _progress:
    """A rich progress bar per file (size, speed, ETA), fed by infer.models.hub's byte counts."""

    def __init__(self, console):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            TimeRemainingColumn(), console=console, transient=False)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bar.start()
        return self.report

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def report(self, name: str, done: int, total: int | None) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.bar.add_task(name, total=total)
        self.bar.update(self.tasks[name], completed=done, total=total)
