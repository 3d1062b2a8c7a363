"""Reading llama.cpp importance-matrix files (`llama-imatrix` output) for `infer quantize --imatrix`.

Two formats exist: the legacy binary `.dat` and, since mid-2025, a GGUF file with `<name>.in_sum2`
and `<name>.counts` tensors. Both become one float32 vector per weight (ne0 values, times the
number of experts for 3-D tensors): the mean squared activation of each input column, which is
what the quantizers weight their error by.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infer.quant.errors import InferError

from .gguf_file import GGUF_MAGIC, GGUFError, read_gguf


class ImatrixError(InferError, ValueError):
    """An importance-matrix file that cannot be read or does not fit the model."""


@dataclass(frozen=True)
class Imatrix:
    path: Path
    values: dict[str, np.ndarray]  # weight name -> float32 importance per column (per expert slice)
    datasets: tuple[str, ...] = ()
    chunk_count: int = 0
    legacy: bool = True
    extra: dict = field(default_factory=dict)


def load_imatrix(path: str | Path) -> Imatrix:
    path = Path(path)
    if not path.is_file():
        raise ImatrixError(f"{path}: no such imatrix file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == GGUF_MAGIC:
        return _load_gguf(path)
    return _load_legacy(path)


def _load_legacy(path: Path) -> Imatrix:
    data = path.read_bytes()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise ImatrixError(f"{path}: truncated or not an imatrix file (at byte {pos})")
        b = data[pos:pos + n]
        pos += n
        return b

    def i32() -> int:
        return struct.unpack("<i", take(4))[0]

    n_entries = i32()
    if n_entries < 1 or n_entries > 1 << 20:
        raise ImatrixError(f"{path}: not an imatrix file ({n_entries} entries)")
    values: dict[str, np.ndarray] = {}
    for _ in range(n_entries):
        name = take(i32()).decode("utf-8", "replace")
        ncall, nval = i32(), i32()
        if nval < 1:
            raise ImatrixError(f"{path}: entry {name!r} has {nval} values")
        sums = _checked(path, name, np.frombuffer(take(4 * nval), dtype="<f4").astype(np.float32))
        # The file stores sums over ncall calls; llama.cpp divides in float32 before quantizing.
        values[name] = sums / np.float32(ncall) if ncall > 0 else sums
    chunks, datasets = 0, ()
    if pos + 4 <= len(data):  # optional trailer: chunk count and the dataset's file name
        chunks = i32()
        if pos + 4 <= len(data):
            datasets = (take(i32()).decode("utf-8", "replace"),)
    return Imatrix(path, values, datasets, chunks, legacy=True)


def _load_gguf(path: Path) -> Imatrix:
    try:
        g = read_gguf(path)
    except GGUFError as e:
        raise ImatrixError(str(e)) from None
    values: dict[str, np.ndarray] = {}
    for tname, t in g.tensors.items():
        if not tname.endswith(".in_sum2"):
            continue
        name = tname[: -len(".in_sum2")]
        counts_t = g.tensors.get(name + ".counts")
        if counts_t is None:
            raise ImatrixError(f"{path}: {tname} has no matching .counts tensor")
        sums = _checked(path, tname, t.dequantize().reshape(-1, t.shape[-1]).astype(np.float32))
        counts = _checked(path, name + ".counts", counts_t.dequantize().reshape(-1).astype(np.float32))
        if counts.size != sums.shape[0]:
            raise ImatrixError(f"{path}: {name}: {counts.size} counts for {sums.shape[0]} matrices")
        # Per matrix (expert): mean of the squared activations; unseen experts get a flat 1.
        out = np.ones_like(sums)
        seen = counts > 0
        out[seen] = sums[seen] / counts[seen, None]
        values[name] = out.reshape(-1)
    if not values:
        raise ImatrixError(f"{path}: GGUF file has no imatrix data (.in_sum2 tensors)")
    # Both end up in the output's metadata (quantize.imatrix.*): a string list and a uint32.
    ds, chunks = g.metadata.get("imatrix.datasets", []), g.metadata.get("imatrix.chunk_count", 0)
    if not isinstance(ds, list) or not all(isinstance(d, str) for d in ds):
        raise ImatrixError(f"{path}: imatrix.datasets is not a list of strings")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 0 <= chunks < 2**32:
        raise ImatrixError(f"{path}: imatrix.chunk_count {chunks!r} is not a uint32 count")
    return Imatrix(path, values, tuple(ds), chunks, legacy=False)


def _checked(path: Path, name: str, v: np.ndarray) -> np.ndarray:
    """Sums of squared activations (and call counts) are finite and never negative; the quantizers
    weigh their error by them, and a negative or NaN weight makes them zero out whole blocks."""
    if not np.isfinite(v).all():
        raise ImatrixError(f"{path}: entry {name!r} has non-finite values")
    if (v < 0).any():
        raise ImatrixError(f"{path}: entry {name!r} has negative values (it holds sums of squares)")
    return v
