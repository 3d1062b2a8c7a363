"""`infer quantize IN OUT --type Q4_K_M`: write a quantized GGUF, tensor for tensor as llama-quantize does;
`--format mlx`: write an MLX model folder (affine-quantized safetensors), as mlx-lm's convert does."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .app import app
from .errors import reported


@app.command(help="Quantize IN (a GGUF file or an HF safetensors folder) into OUT: a GGUF file, or with "
                  "--format mlx an MLX model folder.")
def quantize(
    src: Path = typer.Argument(..., metavar="IN", help="GGUF file (F32/F16/BF16, or quantized for --format mlx) or HF safetensors folder."),
    out: Path = typer.Argument(..., metavar="OUT", help="GGUF file to write (--format mlx: folder to write)."),
    type_: Optional[str] = typer.Option(None, "--type", help="GGUF: Q4_K_M (default), Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, Q5_0, MXFP4_MOE, F16 or BF16."),
    format_: str = typer.Option("gguf", "--format", help="gguf, or mlx: an MLX folder of affine-quantized safetensors."),
    bits: int = typer.Option(4, "--bits", help="MLX: bits per weight (4 or 8; also 2, 3, 5, 6)."),
    group_size: int = typer.Option(64, "--group-size", help="MLX: weights sharing one scale and bias (32, 64 or 128)."),
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
    if format_ not in ("gguf", "mlx"):
        raise typer.BadParameter(f"{format_!r}: choose gguf or mlx", param_hint="--format")
    if format_ == "mlx":
        gguf_only = {"--type": type_, "--output-tensor-type": output_tensor_type, "--imatrix": imatrix,
                     "--token-embedding-type": token_embedding_type, "--pure": pure or None}
        given = [k for k, v in gguf_only.items() if v is not None]
        if given:
            raise typer.BadParameter(f"{', '.join(given)}: for GGUF output only (MLX output takes --bits and --group-size)")
        _quantize_mlx(src, out, bits, group_size, force, console)
        return
    with reported():
        from infer.models.quantize_file import QuantizeOptions, quantize_model

        opts = QuantizeOptions(type_ or "Q4_K_M", output_tensor_type, token_embedding_type, pure, imatrix,
                               allow_requantize, force, threads)

        warn = _warner(console)
        if console.is_terminal:
            with _bar(console) as bar:
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


def _warner(console):
    def warn(msg: str) -> None:
        console.print(f"[yellow]warning:[/] {msg}", highlight=False, soft_wrap=True)

    return warn


def _bar(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, transient=True)


def _quantize_mlx(src: Path, out: Path, bits: int, group_size: int, force: bool, console) -> None:
    with reported():
        from infer.engine.tokenizer_json import write_tokenizer_files
        from infer.models.mlx_export import MlxExportOptions, export_mlx

        opts = MlxExportOptions(bits=bits, group_size=group_size, force=force)
        warn = _warner(console)
        if console.is_terminal:
            with _bar(console) as bar:
                task = bar.add_task("reading", total=None)

                def progress(i: int, n: int, name: str) -> None:
                    bar.update(task, total=n, completed=i, description=f"{name:<48}")

                summary = export_mlx(src, out, opts, write_tokenizer_files, progress, warn)
        else:
            summary = export_mlx(src, out, opts, write_tokenizer_files, None, warn)
    mib = 1024 * 1024
    sys.stderr.write(
        f"{summary.out_path}: MLX {summary.bits}-bit, group size {summary.group_size}, {summary.dtype}; "
        f"{summary.n_tensors} tensors ({summary.n_quantized} quantized); {summary.bytes_before / mib:.1f} MiB -> "
        f"{summary.bytes_after / mib:.1f} MiB in {summary.seconds:.1f} s\n"
    )
