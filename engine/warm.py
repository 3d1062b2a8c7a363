"""Compiling the cpu backend's kernels ahead, for every quant type (`infer kernels --warm`).

The cpu backend's kernels compile the first time a model of a new quant type runs (one
specialization per type, quant/static_type.py) and stay cached on disk.  Warming runs a tiny
all-zero model of each type (models/zero_model.py) through the engine as a request would run:
load (repacking), a prompt and a few decoded tokens, so every kernel a model of that type calls
is compiled and cached.  Types run in separate processes, numba compiling one kernel at a time
per process; their caches are the same files a later run reads.
"""
from __future__ import annotations

import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterable

from infer.quant.types import QTYPES

from .engine import EngineConfig
from .sampler import SamplingParams

WARM_TYPES = tuple(sorted(QTYPES))  # every type the cpu backend runs


def warm_type(type_id: int, cache_type: str = "f16") -> float:
    """Run a zero model of type_id through load, a prompt and decoding; returns the seconds taken."""
    from infer.models.zero_model import write_zero_model

    from .llm import LLM

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="infer-warm-") as d:
        path = write_zero_model(Path(d) / "zeros.gguf", type_id)
        config = EngineConfig(n_ctx=256, n_threads=1, max_seqs=1, backend="cpu", cache_type_k=cache_type,
                              cache_type_v=cache_type)
        llm = LLM.load(path, config)
        llm.runner.warmup()
        for _ in llm.generate(list(range(3, 40)), SamplingParams(temperature=0, max_tokens=4)):
            pass
    return time.perf_counter() - t0


def warm_kernels(type_ids: Iterable[int] = WARM_TYPES, jobs: int = 1, cache_types: Iterable[str] = ("f16", "q8_0"),
                 on_done: Callable[[int, str, float], None] = lambda type_id, cache_type, s: None) -> None:
    """Warm every type in type_ids (the first also with each KV cache type), `jobs` processes at
    once; on_done(type_id, cache_type, seconds) as each finishes."""
    ids = list(type_ids)
    tasks = [(t, "f16") for t in ids] + [(ids[0], c) for c in cache_types if c != "f16" and ids]
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(warm_type, t, c): (t, c) for t, c in tasks}
        for f in as_completed(futures):
            t, c = futures[f]
            on_done(t, c, f.result())
