"""Rows of a matrix looked up by index (the token embeddings), read from the file with pread
when the matrix lives in a file mapping.

Reading a row through the mapping faults in its page and, by the kernel's fault-around, the 15
pages beside it; a prompt of a few hundred varied tokens maps most of a large vocabulary's
embedding that way (measured: 1024 random tokens, +110 MiB RSS of a 125 MiB Q4_K embedding), and
a long conversation keeps adding to it. pread copies just the row from the page cache and maps
nothing, so the embedding stays out of the process's resident memory (the page cache keeps the
file, shared and reclaimable). A matrix in memory (--no-mmap), or a system without pread, is
read directly.
"""
from __future__ import annotations

import os

import numpy as np

from infer.quant.tensor import QTensor, file_offset


class RowReader:
    """Gathers rows of a QTensor (raw: (rows, row_bytes) uint8) into a caller's buffer."""

    def __init__(self, t: QTensor):
        self.raw = t.raw
        self.row_bytes = t.raw.shape[1]
        where = file_offset(t.raw) if hasattr(os, "preadv") and t.raw.flags.c_contiguous else None
        self._file = open(where[0], "rb", buffering=0) if where else None  # closed with the reader (__del__)
        self._offset = where[1] if where else 0

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """out[i] = raw[ids[i]] for i < len(ids); out: (>= len(ids), row_bytes) uint8, C-contiguous."""
        if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < self.raw.shape[0]:
            raise ValueError(f"token ids must be in [0, {self.raw.shape[0]})")
        if self._file is None:
            np.take(self.raw, ids, axis=0, out=out[:len(ids)])
            return
        fd, rb, off = self._file.fileno(), self.row_bytes, self._offset
        for i, r in enumerate(ids.tolist()):
            if os.preadv(fd, [out[i]], off + r * rb) != rb:
                raise OSError(f"{self._file.name}: short read of row {r}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __del__(self) -> None:
        self.close()
