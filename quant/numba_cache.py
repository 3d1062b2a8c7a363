"""numba's on-disk kernel cache, made safe for processes that compile at the same time.

numba (0.60 to 0.68 at least) saves a compiled kernel by reading the function's index file,
picking the first free data-file name, rewriting the index, then writing the data file, with no
lock.  Two processes that compile different signatures of one kernel at once (`infer kernels
--warm -j 2` compiles a kernel for two quant types at once; two servers first loading models of
different types do too) can both pick `<kernel>.1.nbc`: the index then names one signature while
the file holds the other's machine code, and a later run loads a kernel compiled for another
quant type, which computes garbage without an error.  lock_cache_writes() holds an inter-process
file lock (filelock, the lock huggingface_hub uses for the same cache directories) across each
save, so saves run one at a time per cache directory; loads need none (numba replaces the index
and data files atomically).
"""
from __future__ import annotations

import os

from filelock import FileLock
from numba.core.caching import IndexDataCacheFile

LOCK_NAME = "infer-numba-cache.lock"  # one per cache directory, beside the index files


def lock_cache_writes() -> None:
    """Wrap numba's cache save in a per-directory file lock (once per process; idempotent)."""
    save = IndexDataCacheFile.save
    if getattr(save, "infer_locked", False):
        return

    def locked_save(self, key, data):
        with FileLock(os.path.join(self._cache_path, LOCK_NAME)):
            save(self, key, data)

    locked_save.infer_locked = True  # type: ignore[attr-defined]
    IndexDataCacheFile.save = locked_save  # type: ignore[method-assign]
