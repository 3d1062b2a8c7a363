"""A tensor kept in its GGML storage type: raw blocks, dequantized only on demand."""
from __future__ import annotations

import ctypes
import mmap
import sys
from dataclasses import dataclass

import numpy as np

from .types import qtype, row_bytes


@dataclass(frozen=True, eq=False)
class QTensor:
    type_id: int
    shape: tuple[int, ...]  # numpy order: (..., rows, n); n (GGML's ne0) is the row length
    raw: np.ndarray  # (rows, row_bytes) uint8, usually a view of the memory-mapped file

    @classmethod
    def from_bytes(cls, type_id: int, shape: tuple[int, ...], buf: np.ndarray) -> "QTensor":
        n = shape[-1]
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        rb = row_bytes(type_id, n)
        if buf.size != rows * rb:
            raise ValueError(f"tensor of shape {shape} and type {qtype(type_id).name} needs {rows * rb} bytes, got {buf.size}")
        return cls(type_id, tuple(shape), buf.reshape(rows, rb))

    @property
    def type_name(self) -> str:
        return qtype(self.type_id).name

    @property
    def rows(self) -> int:
        return self.raw.shape[0]

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return self.raw.size

    def release(self) -> None:
        """Let the OS drop this tensor's pages from memory when it is a view of a read-only file
        mapping; they are read back from the file if touched again.  Whoever keeps a repacked
        copy calls it, so the weights are not resident twice.  Any other array: nothing happens."""
        release_mapped(self.raw)

    def dequantize(self) -> np.ndarray:
        from .dequant import dequantize

        return dequantize(self.raw, self.type_id, self.shape)


def release_mapped(a: np.ndarray) -> None:
    """madvise(MADV_DONTNEED) over the whole pages inside `a`, if `a` views a read-only np.memmap
    (never on writable or anonymous memory, whose contents that would discard)."""
    base = a
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    if base is None or getattr(base, "mode", None) != "r" or not hasattr(mmap, "MADV_DONTNEED") or sys.platform == "win32":
        return
    addr = a.__array_interface__["data"][0]
    start = -(-addr // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (addr + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)
