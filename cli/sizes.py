"""Byte sizes as people type them: 512M, 2G, 1.5GiB, 1000000."""
from __future__ import annotations

import re

import typer

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise typer.BadParameter(f"cannot read {text!r} as a size (examples: 512M, 2G, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: int) -> str:
    """Bytes in decimal units, as `ollama list` shows them: 253 MB, 4.7 GB."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"
