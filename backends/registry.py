"""Which backends exist, which can run here, and making a runner on one.

Optional backends are imported only when probed or asked for, so a missing extra costs nothing
until it is wanted, and then the error names the extra to install.
"""
from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass, field
from typing import Iterable

from .base import STATE_KINDS, BackendError, Runner, RunnerOptions

BACKENDS = ("cpu", "mlx", "llama.cpp")
BACKEND_CHOICES = ("auto",) + BACKENDS
INSTALL_HINT = {
    "mlx": "pip install 'infer[mlx]' (on Linux: mlx[cpu] or mlx[cuda])",
    "llama.cpp": "pip install 'infer[llamacpp]'",
}


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    devices: list[str] = field(default_factory=list)
    reason: str = ""  # why not available, or a remark (e.g. "CPU build: no GPU offload")
    gpu: bool = False  # computes on a GPU here


def _installed(module: str) -> bool:
    """Whether a module could be imported (without importing it); a None entry in sys.modules
    (how tests and some environments block a module) counts as absent."""
    import sys

    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _probe_cpu() -> BackendInfo:
    from .cpu.target import ISA

    return BackendInfo("cpu", True, [f"cpu: {os.cpu_count()} cores, {platform.machine()}, {ISA}"])


def _probe_mlx() -> BackendInfo:
    if not _installed("mlx"):
        return BackendInfo("mlx", False, reason=f"mlx is not installed: {INSTALL_HINT['mlx']}")
    try:
        import mlx.core as mx
    except Exception as e:  # a broken or foreign-platform wheel
        return BackendInfo("mlx", False, reason=f"mlx does not load here ({e}): {INSTALL_HINT['mlx']}")
    devices, gpu = [], False
    if mx.metal.is_available():
        info = mx.metal.device_info() if hasattr(mx.metal, "device_info") else {}
        devices.append(f"metal: {info.get('device_name', 'Apple GPU')}")
        gpu = True
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        devices.append("cuda: MLX CUDA build")
        gpu = True
    devices.append(f"cpu: MLX {mx.__version__} CPU")
    return BackendInfo("mlx", True, devices, gpu=gpu)


def _probe_llamacpp() -> BackendInfo:
    if not _installed("llama_cpp"):
        return BackendInfo("llama.cpp", False, reason=f"llama-cpp-python is not installed: {INSTALL_HINT['llama.cpp']}")
    try:
        from .llamacpp.devices import llamacpp_devices
    except Exception as e:
        return BackendInfo("llama.cpp", False, reason=f"llama-cpp-python does not load here ({e})")
    devices, gpu = llamacpp_devices()
    reason = "" if gpu else "CPU build: no GPU offload (reinstall llama-cpp-python with CUDA, Metal or Vulkan)"
    return BackendInfo("llama.cpp", True, devices, reason, gpu)


_PROBES = {"cpu": _probe_cpu, "mlx": _probe_mlx, "llama.cpp": _probe_llamacpp}


def probe(name: str) -> BackendInfo:
    if name not in _PROBES:
        raise BackendError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_CHOICES)})")
    return _PROBES[name]()


def probe_all() -> list[BackendInfo]:
    return [probe(n) for n in BACKENDS]


def choose_backend(requested: str, model_format: str = "gguf", state_kinds: Iterable[str] = ()) -> str:
    """The backend to use: `requested` checked for availability, or auto's choice.

    auto: MLX-format models and Apple Silicon go to MLX (hybrid models included where MLX keeps
    their kinds of recurrent state, STATE_KINDS: LFM2's, Qwen3.5's, Granite 4.0 H's); a llama.cpp build with
    a GPU takes GGUF models elsewhere, except a model with recurrent layers (state_kinds: the
    model's, ModelConfig.state_shapes), which stays on the cpu kernels; otherwise the cpu kernels.
    """
    if requested not in BACKEND_CHOICES:
        raise BackendError(f"unknown backend {requested!r} (choose from {', '.join(BACKEND_CHOICES)})")
    if requested != "auto":
        info = probe(requested)
        if not info.available:
            raise BackendError(f"backend {requested} is not available: {info.reason}")
        return requested
    if model_format == "mlx":
        info = probe("mlx")
        if not info.available:
            raise BackendError(f"this is an MLX-format model and MLX is not available: {info.reason}")
        return "mlx"
    kinds = frozenset(state_kinds)
    if is_apple_silicon() and kinds <= STATE_KINDS["mlx"] and probe("mlx").available:
        return "mlx"
    if not kinds and _installed("llama_cpp") and probe("llama.cpp").gpu:
        return "llama.cpp"
    return "cpu"


def create_runner(name: str, model, options: RunnerOptions = RunnerOptions()) -> Runner:
    """Upload a loaded model (infer.models.weights.Model: config, weights, path, format) to a backend."""
    fmt = getattr(model, "format", "gguf")
    if name == "cpu":
        if fmt != "gguf":
            raise BackendError(f"{model.path}: {fmt.upper()}-format weights run on --backend mlx, not cpu")
        from .cpu.runner import CpuRunner

        return CpuRunner(model.config, model.weights, n_threads=options.n_threads or os.cpu_count(),
                              max_tokens=options.max_tokens, mmap=options.mmap, mlock=options.mlock,
                              cache_type_k=options.cache_type_k, cache_type_v=options.cache_type_v)
    if name == "mlx":
        from .mlx.runner import MlxRunner

        return MlxRunner(model.config, model.weights, options)
    if name == "llama.cpp":
        if fmt != "gguf":
            raise BackendError(f"{model.path}: the llama.cpp backend runs GGUF files, not {fmt.upper()} folders")
        from .llamacpp.runner import LlamaCppRunner

        return LlamaCppRunner(model.path, model.config, options)
    raise BackendError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_CHOICES)})")
