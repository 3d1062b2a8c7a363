"""Arrays backed by transparent huge pages, for the packed weights that every decode step streams
(and, lazy_zeros, arrays that should not be: a KV cache).

A decode step reads every weight once: with 4 KiB pages that is a TLB miss every 4 KiB, and on a
CPU with a small TLB the page walks cost a fair part of the memory bandwidth.  Linux backs an
anonymous mapping with 2 MiB pages when asked (madvise(MADV_HUGEPAGE); THP in "madvise" or
"always" mode), so large packed arrays are allocated that way.  Nothing is padded: only the
2 MiB-aligned stretches inside an array are advised, its tail stays in 4 KiB pages, so resident
memory is what the array holds.  Elsewhere (no MADV_HUGEPAGE, THP off) these are plain np.empty.
"""
from __future__ import annotations

import mmap

import numpy as np

HUGE = 2 << 20  # bytes of an x86-64 / aarch64 (4 KiB granule) transparent huge page
HUGE_MIN = 2 * HUGE  # smaller arrays gain little and keep np.empty's allocator


def huge_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty(shape, dtype), in an anonymous mapping advised to use huge pages if it is large
    and the OS has them.  The array keeps its mapping alive (through its base)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if n < HUGE_MIN or advice is None:
        return np.empty(shape, dtype)
    # HUGE more address space than needed so the array can start 2 MiB-aligned; the unused
    # stretch is never touched, so it takes no memory
    # private: a shared anonymous mapping is shmem, whose huge pages follow another setting
    m = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20))
    buf = np.frombuffer(m, np.uint8)
    off = -buf.ctypes.data % HUGE
    try:  # only the whole huge pages inside the array, so none ever covers bytes it does not use
        m.madvise(advice, off, n // HUGE * HUGE)
    except OSError:  # THP compiled out or disabled: ordinary pages
        pass
    return buf[off:off + n].view(dtype).reshape(shape)


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros(shape, dtype) in an anonymous mapping of ordinary pages, each zeroed by the OS when
    first written: memory in use only where written.  For a KV cache: numpy advises its own large
    allocations to use huge pages, so a sequence's first token would make the OS zero 2 MiB of K
    and 2 MiB of V in every layer (a quarter of a second on the 1.5B model in a virtual machine
    that hands out fresh memory slowly) for a few hundred bytes written."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0 or not hasattr(mmap, "MAP_PRIVATE"):  # (Windows: no such mapping; numpy's zeros)
        return np.zeros(shape, dtype)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)  # fileno -1: Python makes it anonymous
    return np.frombuffer(m, np.uint8).view(dtype).reshape(shape)


class HugeArena:
    """Many small arrays carved out of one huge_empty allocation: a mixture of experts' matrices
    (a few MB each, below HUGE_MIN on their own) get huge pages too.  Each array starts on a
    64-byte boundary, as np.empty's would for vector loads."""

    ALIGN = 64

    def __init__(self, nbytes: int):
        # ALIGN more than asked, so the first array starts aligned where np.empty's 16 bytes are all
        # a small arena gets (a huge-page one starts on its 2 MiB boundary)
        raw = huge_empty((max(nbytes, 1) + self.ALIGN,), np.uint8)
        off = -raw.ctypes.data % self.ALIGN
        self.buf = raw[off:off + max(nbytes, 1)]
        self.used = 0

    @classmethod
    def span(cls, shape: tuple[int, ...], dtype) -> int:
        """Bytes an array of this shape and dtype takes in an arena, alignment included."""
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return -(-n // cls.ALIGN) * cls.ALIGN

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized array in the arena (like np.empty)."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        n = -(-size // self.ALIGN) * self.ALIGN  # span(shape, dtype)
        if self.used + n > self.buf.shape[0]:
            raise MemoryError(f"arena of {self.buf.shape[0]} bytes cannot hold {n} more after {self.used}")
        a = self.buf[self.used:self.used + size].view(dtype).reshape(shape)
        self.used += n
        return a
