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


@dataclass(frozen=True, eq=False)
class StackedRows:
    """A matrix whose rows are its parts' rows one after another: QTensors of one type and row
    length, views of the file's rows in another order (a gated attention's Q, whose rows sit in
    attn_q per head between the gate's).  Nothing is copied until a backend asks for the matrix
    whole; the cpu backend packs the parts straight from the file instead, so the weights are not
    held twice (a copy beside the packed matrix)."""

    parts: tuple[QTensor, ...]

    @property
    def type_id(self) -> int:
        return self.parts[0].type_id

    @property
    def type_name(self) -> str:
        return self.parts[0].type_name

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def n(self) -> int:
        return self.parts[0].n

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.n

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def whole(self) -> QTensor:
        """The matrix as one QTensor: its parts' rows copied into memory, in order."""
        return QTensor(self.type_id, self.shape, np.concatenate([p.raw for p in self.parts]))

    def release(self) -> None:
        """QTensor.release of every part."""
        for p in self.parts:
            p.release()

    def dequantize(self) -> np.ndarray:
        return self.whole().dequantize()


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14 (the constant: Python >= 3.13)


def _file_map(a: np.ndarray) -> np.memmap | None:
    """The read-only np.memmap of a file that `a` views, the whole map (a slice of a memmap is a
    memmap too, but keeps the whole map's offset), or None."""
    found = None
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap):
            found = a
        a = a.base
    return found if found is not None and getattr(found, "mode", None) == "r" else None


def file_offset(a: np.ndarray) -> tuple[str, int] | None:
    """(file name, offset in the file of a's first byte) if `a` views a read-only np.memmap of a file."""
    m = _file_map(a)
    if m is None or not getattr(m, "filename", None):
        return None
    return m.filename, int(m.offset) + a.__array_interface__["data"][0] - m.__array_interface__["data"][0]


def _mapped_pages(a: np.ndarray) -> tuple[int, int] | None:
    """[start, end) of the whole pages inside `a`, if `a` views a read-only np.memmap on a system
    with madvise; else None (never writable or anonymous memory, whose contents DONTNEED discards)."""
    if _file_map(a) is None or not hasattr(mmap, "MADV_DONTNEED") or sys.platform == "win32":
        return None
    addr = a.__array_interface__["data"][0]
    start = -(-addr // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (addr + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    return (start, end) if end > start else None


def _madvise(pages: tuple[int, int], advice: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(pages[0]), ctypes.c_size_t(pages[1] - pages[0]), advice)


def release_mapped(a: np.ndarray) -> None:
    """madvise(MADV_DONTNEED) over the whole pages inside `a`, if `a` views a read-only np.memmap:
    the OS may drop them; they are read back from the file if touched again."""
    pages = _mapped_pages(a)
    if pages:
        _madvise(pages, mmap.MADV_DONTNEED)


def populate_mapped(a: np.ndarray) -> None:
    """Map in one call the pages of `a` (a view of a read-only np.memmap) that a pass over it is
    about to read: one madvise(MADV_POPULATE_READ) instead of a page fault per 4 KiB.  Only
    speed: where the kernel lacks it (Linux < 5.14; other systems) the faults happen as before."""
    pages = _mapped_pages(a)
    if pages and sys.platform.startswith("linux"):
        _madvise(pages, MADV_POPULATE_READ)
