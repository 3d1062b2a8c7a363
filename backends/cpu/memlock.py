"""Pinning the runner's weights in RAM (--mlock), as llama.cpp's --mlock pins its model buffer."""
from __future__ import annotations

import ctypes
import os
import sys

import numpy as np


def mlock_arrays(arrays) -> int:
    """mlock(2) every array's memory, so the OS never pages the weights out; returns the bytes
    locked.  Raises OSError naming the limit when the OS refuses (RLIMIT_MEMLOCK, `ulimit -l`)."""
    if sys.platform == "win32":
        raise OSError("--mlock is not supported on Windows")
    libc = ctypes.CDLL(None, use_errno=True)
    done = 0
    for a in arrays:
        a = np.asarray(a)
        if a.nbytes == 0:
            continue
        addr = a.__array_interface__["data"][0]
        if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(a.nbytes)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"failed to mlock a {a.nbytes}-byte buffer after locking {done} bytes: "
                               f"{os.strerror(err)}; try raising RLIMIT_MEMLOCK ('ulimit -l')")
        done += a.nbytes
    return done
