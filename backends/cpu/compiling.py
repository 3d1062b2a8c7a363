"""Watching numba compile the cpu backend's kernels, for a progress line and a first-run report.

numba compiles a kernel the first time it is called with a new signature (here: a new quant type,
see quant/static_type.py) and caches the machine code on disk beside the source, so a first run
pays seconds per kernel and later runs load them.  `watch_compiles` reports each kernel as it
starts, outermost calls only (a kernel's callees compile inside it), so that a caller can say
what is happening instead of seeming to hang.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from numba.core import event


@dataclass
class CompileLog:
    """What compiled while watched: kernel names in order, and the seconds spent in them."""

    kernels: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Listener(event.Listener):
    def __init__(self, on_kernel: Callable[[str, int], None], log: CompileLog):
        self.on_kernel, self.log = on_kernel, log
        self.depth, self.t0 = 0, 0.0

    def on_start(self, ev) -> None:
        if self.depth == 0:
            fn = ev.data["dispatcher"].py_func
            self.log.kernels.append(fn.__name__)
            self.t0 = time.perf_counter()
            self.on_kernel(fn.__name__, len(self.log.kernels))
        self.depth += 1

    def on_end(self, ev) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.log.seconds += time.perf_counter() - self.t0


@contextmanager
def watch_compiles(on_kernel: Callable[[str, int], None] = lambda name, n: None) -> Iterator[CompileLog]:
    """Call on_kernel(name, n) as the n-th kernel starts compiling in this block (this thread's
    compiles: numba compiles one kernel at a time); yields the CompileLog it fills."""
    log = CompileLog()
    listener = _Listener(on_kernel, log)
    event.register("numba:compile", listener)
    try:
        yield log
    finally:
        event.unregister("numba:compile", listener)
