"""The `infer` Typer application: each command module registers its commands on `app`."""
from __future__ import annotations

import typer

app = typer.Typer(
    name="infer",
    help="Run quantized LLMs locally (GGUF and MLX; CPU, MLX or llama.cpp backends).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Run quantized LLMs locally: infer run, infer chat, infer bench, infer serve."""
