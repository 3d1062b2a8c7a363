"""Turning the engine's expected errors into one-line messages and exit code 1."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import typer

from infer.quant.errors import InferError


def user_errors() -> tuple[type[BaseException], ...]:
    """What the user can cause and read in one line: every InferError, and the OS refusing a file."""
    return (InferError, OSError)


@contextmanager
def reported() -> Iterator[None]:
    """Report expected failures as `error: ...` on stderr and exit 1; let real bugs show their traceback."""
    try:
        yield
    except (InferError, OSError) as e:
        msg = str(e) or type(e).__name__
        if isinstance(e, OSError) and e.filename:
            msg = f"{e.filename}: {e.strerror}"
        sys.stderr.write(f"error: {msg.splitlines()[0]}\n")
        raise typer.Exit(1) from None
