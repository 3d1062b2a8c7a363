"""One ggml op at a time from llama-cpp-python's own libggml on the CPU, through ctypes: what the
kernels that match ggml bit for bit (mamba.py's scan, delta_net.py's delta rule) are checked against."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

GGML_F32, GGML_I32 = 0, 26  # enum ggml_type


class _GgmlInit(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _GgmlTensor(ctypes.Structure):
    # struct ggml_tensor (ggml.h) as far as its data (as scripts/compare_llamacpp.py's)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def run_op(name: str, build: Callable[[Callable[..., int]], tuple[list[int], list[int]]], n_out: int) -> np.ndarray:
    """ggml_<name>(ctx, *tensors, *params) computed on one thread: the first n_out float32 values of
    its result. build gets tensor(arr, ggml_type=GGML_F32), which copies a numpy array (its shape
    reversed, as ggml's ne) into a new tensor, and returns the op's tensors and its int64 parameters."""
    llama_cpp = pytest.importorskip("llama_cpp")
    lib = Path(llama_cpp.__file__).parent / "lib"
    if not (lib / "libggml-cpu.so").exists():
        pytest.skip("llama-cpp-python's libggml-cpu.so is not where this test looks for it")
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = vp, [_GgmlInit]
    base.ggml_new_tensor.restype = vp
    base.ggml_new_tensor.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    op = getattr(base, f"ggml_{name}")
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = vp, [vp]
    base.ggml_build_forward_expand.argtypes = [vp, vp]
    base.ggml_free.argtypes = [vp]
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    ctx = base.ggml_init(_GgmlInit(256 << 20, None, False))

    def tensor(arr: np.ndarray, ggml_type: int = GGML_F32) -> int:
        arr = np.ascontiguousarray(arr)
        ne = (ctypes.c_int64 * 4)(*arr.shape[::-1], *[1] * (4 - arr.ndim))
        t = base.ggml_new_tensor(ctx, ggml_type, arr.ndim, ne)
        ctypes.memmove(ctypes.cast(t, ctypes.POINTER(_GgmlTensor)).contents.data, arr.ctypes.data, arr.nbytes)
        return t

    try:
        tensors, params = build(tensor)
        op.restype = vp
        op.argtypes = [vp] * (1 + len(tensors)) + [ctypes.c_int64] * len(params)
        out = op(ctx, *tensors, *params)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
        data = ctypes.cast(ctypes.cast(out, ctypes.POINTER(_GgmlTensor)).contents.data, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(data, shape=(n_out,)).copy()
    finally:
        base.ggml_free(ctx)
