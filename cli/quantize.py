"""`infer quantize IN OUT --type Q4_K_M`: write a quantized GGUF, tensor for tensor as llama-quantize does."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .errors import reported
from .main import app


@app.command(help="Quantize IN (a GGUF file or an HF safetensors folder) into the GGUF file OUT.")
def quantize(
    src: Path = typer.Argument(..., metavar="IN", help="F32/F16/BF16 GGUF file or HF safetensors folder."),
    out: Path = typer.Argument(..., metavar="OUT", help="GGUF file to write."),
    type_: str = typer.Option("Q4_K_M", "--type", help="Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, Q5_0, F16 or BF16."),
    output_tensor_type: Optional[str] = typer.Option(None, "--output-tensor-type", help="Type for output.weight (e.g. Q8_0)."),
    token_embedding_type: Optional[str] = typer.Option(None, "--token-embedding-type", help="Type for token_embd.weight."),
    pure: bool = typer.Option(False, "--pure", help="Every quantized tensor gets --type: no per-tensor mixing."),
    imatrix: Optional[Path] = typer.Option(None, "--imatrix", help="llama.cpp importance matrix (.dat or GGUF imatrix)."),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="Accept an already-quantized input."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: all cores)."),
) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    with reported():
        from infer.models.quantize import QuantizeOptions, quantize_model

        opts = QuantizeOptions(type_, output_tensor_type, token_embedding_type, pure, imatrix, allow_requantize,
                               force, threads)

        def warn(msg: str) -> None:
            console.print(f"[yellow]warning:[/] {msg}", highlight=False, soft_wrap=True)

        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=console, transient=True) as bar:
                task = bar.add_task("reading", total=None)

                def progress(i: int, n: int, plan) -> None:
                    from infer.quant.types import qtype

                    action = "→ " + qtype(plan.dst_type).name if plan.converts else "copy " + qtype(plan.src_type).name
                    bar.update(task, total=n, completed=i, description=f"{plan.name:<32} {action:<9}")

                summary = quantize_model(src, out, opts, progress, warn)
        else:
            summary = quantize_model(src, out, opts, None, warn)
    mib = 1024 * 1024
    mix = ", ".join(f"{name} {n}" for name, n in summary.type_counts.items())
    sys.stderr.write(
        f"{summary.out_path}: {summary.file_type}, {summary.n_tensors} tensors ({mix}); "
        f"{summary.bytes_before / mib:.1f} MiB -> {summary.bytes_after / mib:.1f} MiB in {summary.seconds:.1f} s\n"
    )
