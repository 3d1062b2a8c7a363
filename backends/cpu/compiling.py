"""Compiling the cpu backend's kernels: watching numba compile them, and compiling them ahead in
parallel processes.

numba compiles a kernel the first time it is called with a new signature (here: a new quant type,
see quant/static_type.py) and caches the machine code on disk beside the source, so a first run
pays seconds per kernel and later runs load them.  `watch_compiles` reports each kernel as it
starts, outermost calls only (a kernel's callees compile inside it), so that a caller can say
what is happening instead of seeming to hang.

numba compiles one kernel at a time per process (a global compiler lock), and a first run's
kernels are many (attention, the packed matmul and the repacking pass per quant type, the
norms...): `compile_ahead` finds which of them a model will call and the cache lacks, by a dry
run of loading and warming it in which no kernel runs (`dry_run`: a call that would compile
records its signature and returns 0 at once; the arrays it would have written stay as they are,
which the dry run does not look at), then compiles those in worker processes, one kernel each,
into the same cache (quant/numba_cache.py makes their saves safe), so that the real load and
warmup after it find them there.
"""
from __future__ import annotations

import importlib
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Callable, Iterable, Iterator

from numba.core import event, types
from numba.core.dispatcher import Dispatcher, OmittedArg


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


@dataclass(frozen=True)
class KernelJob:
    """One kernel to compile: where it is defined (importable by name) and its argument types."""

    module: str
    qualname: str
    sig: tuple  # numba types, one per argument
    parallel: bool = False  # a parfor kernel: these take longest to compile, so they start first


def _in_cache(disp: Dispatcher, sig: tuple) -> bool:
    # whether numba's on-disk cache holds this signature of disp (its own lookup, without loading
    # it: a loaded kernel would run for real on the dry run's next call)
    cache = disp._cache
    if not getattr(cache, "_enabled", False):
        return True  # not cached on disk: nothing a worker could compile for this process
    return cache._index_key(sig, disp.targetctx.codegen()) in cache._cache_file._load_index()


def _resolve(module: str, qualname: str):
    # the object a module's dotted name holds (how a worker finds the kernel it is sent)
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_can_compile(disp: Dispatcher, sig: tuple) -> bool:
    # numba's disk cache lacks this signature of disp, and a worker process can find disp by name
    # (a kernel made inside a function cannot be)
    if _in_cache(disp, sig):
        return False
    try:
        return _resolve(disp.py_func.__module__, disp.py_func.__qualname__) is disp
    except (ImportError, AttributeError):
        return False


def _nothing(*args):
    return 0  # what the kernels that return anything return: counts (repack.pack_rows's unfit blocks)


def _signature(disp: Dispatcher, args: tuple) -> tuple:
    return tuple(types.Omitted(a.value) if isinstance(a, OmittedArg) else disp.typeof_pyval(a) for a in args)


_HOOK_LOCK = threading.Lock()  # one hook at a time: each puts back the method it replaced


@contextmanager
def _on_compile(handler: Callable[[Dispatcher, tuple], object]) -> Iterator[None]:
    # Within the block, a kernel call of this thread that finds no machine code in memory for its
    # arguments goes to handler(dispatcher, args) instead of numba's compile (or cache load), and
    # what handler returns is called with the arguments.  numba's hook is process-wide: other
    # threads (a server's requests while it loads another model) go on as usual, and a second
    # thread's block waits for this one to end.
    with _HOOK_LOCK:
        compile_for_args = Dispatcher._compile_for_args
        owner = threading.get_ident()

        def hook(self, *args, **kws):
            if threading.get_ident() != owner:
                return compile_for_args(self, *args, **kws)
            return handler(self, args)

        Dispatcher._compile_for_args = hook  # type: ignore[method-assign]
        try:
            yield
        finally:
            Dispatcher._compile_for_args = compile_for_args  # type: ignore[method-assign]


@contextmanager
def dry_run() -> Iterator[list[KernelJob]]:
    """Within the block, a kernel call of this thread that would compile (no machine code for its
    argument types in memory) runs nothing and returns 0; yields the list it fills with the calls
    whose signature numba's disk cache lacks, once each.  Kernels already in memory run as usual."""
    jobs: list[KernelJob] = []
    seen: set[KernelJob] = set()

    def record(disp: Dispatcher, args: tuple):
        sig = _signature(disp, args)
        job = KernelJob(disp.py_func.__module__, disp.py_func.__qualname__, sig,
                        bool(disp.targetoptions.get("parallel")))
        if job not in seen:
            seen.add(job)
            if _worker_can_compile(disp, sig):
                jobs.append(job)
        return _nothing

    with _on_compile(record):
        yield jobs


class WouldCompile(BaseException):
    """Raised by stop_before_compiling.  A BaseException, as KeyboardInterrupt is: no `except
    Exception` on the way (a fallback around a kernel) may take it for a kernel's error."""


@contextmanager
def stop_before_compiling() -> Iterator[None]:
    """Within the block, a kernel call of this thread that numba would compile (its signature in
    neither memory nor the disk cache, and a kernel workers could compile) raises WouldCompile;
    loading from the cache goes on as usual."""
    compile_for_args = Dispatcher._compile_for_args

    def check(disp: Dispatcher, args: tuple):
        if _worker_can_compile(disp, _signature(disp, args)):
            raise WouldCompile(disp.py_func.__qualname__)
        return compile_for_args(disp, *args)

    with _on_compile(check):
        yield


def compile_job(job: KernelJob) -> float:
    """Compile one kernel into numba's disk cache (in a worker process); the seconds it took."""
    t0 = time.perf_counter()
    _resolve(job.module, job.qualname).compile(job.sig)
    return time.perf_counter() - t0


def compile_jobs(jobs: list[KernelJob], workers: int,
                 on_done: Callable[[KernelJob, int], None] = lambda job, n: None) -> None:
    """Compile jobs in `workers` processes (spawned: numba is not fork-safe once it has compiled);
    on_done(job, n) as the n-th finishes.  A job that fails is left to compile in the caller's
    process when it is called (it raises there, where the error belongs)."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(compile_job, job): job for job in sorted(jobs, key=lambda job: not job.parallel)}
        for n, f in enumerate(as_completed(futures), 1):
            f.exception()  # consumed: see above
            on_done(futures[f], n)


MAX_WORKERS = 8  # each worker holds numba and LLVM (a few hundred MB while compiling)


def compile_ahead(steps: Iterable[Callable[[], object]], workers: int,
                  on_start: Callable[[int, int], None] = lambda n_jobs, n_workers: None,
                  on_done: Callable[[KernelJob, int], None] = lambda job, n: None) -> int:
    """Dry-run each of steps (loading a model's parts, warming it up), then compile the kernels
    they called that the cache lacks in up to `workers` processes; returns how many.
    on_start(jobs, workers) before compiling.  Nothing to gain from one job or one worker: those
    compile as they are called.  A step's errors in the dry run are not reported: kernels returned
    nothing, so later lines may fail on what they read (each step runs apart, so one that stops
    early does not hide the next); the real load after this raises the errors that matter."""
    with dry_run() as jobs:
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 (see above)
                pass
    n_workers = min(len(jobs), workers)
    if n_workers < 2:
        return 0
    on_start(len(jobs), n_workers)
    compile_jobs(jobs, n_workers, on_done)
    return len(jobs)
