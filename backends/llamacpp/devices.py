"""The devices llama.cpp's ggml can compute on here, read from its backend registry.

llama-cpp-python binds the llama_* API only, so the ggml_backend_dev_* functions are called
through ctypes on the ggml library bundled with it (or, failing that, through libllama, which
links it).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

# ggml_backend_dev_type: CPU, GPU, IGPU (integrated GPU), ACCEL, META
_KIND = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def _ggml_library(llama_cpp) -> ctypes.CDLL | None:
    """The ggml shared library llama_cpp loaded, with the device functions' signatures set."""
    names = {"linux": "libggml.so", "darwin": "libggml.dylib", "win32": "ggml.dll"}
    dirs = [Path(d) for d in (os.environ.get("LLAMA_CPP_LIB_PATH"),) if d]
    dirs.append(Path(llama_cpp.__file__).parent / "lib")
    lib = None
    for d in dirs:
        path = d / names.get(sys.platform, "libggml.so")
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                break
            except OSError:
                continue
    if lib is None:
        lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)  # libllama resolves ggml's symbols too
    if lib is None or not hasattr(lib, "ggml_backend_dev_count"):
        return None
    vp = ctypes.c_void_p
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_get.restype = vp
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
        fn.restype = ctypes.c_char_p
        fn.argtypes = [vp]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [vp]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    return lib


def device_list(llama_cpp) -> list[str]:
    """One line per ggml device: "CUDA0 (gpu): NVIDIA H100 80GB HBM3, 81079 MiB"."""
    lib = _ggml_library(llama_cpp)
    if lib is None:
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = (lib.ggml_backend_dev_name(dev) or b"?").decode(errors="replace")
        desc = (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace").strip()
        kind = _KIND.get(lib.ggml_backend_dev_type(dev), "device")
        mem = f", {total.value >> 20} MiB" if total.value else ""
        out.append(f"{name} ({kind}): {desc}{mem}")
    return out


def llamacpp_devices() -> tuple[list[str], bool]:
    """(the devices llama.cpp sees, whether this build can offload layers to a GPU)."""
    import llama_cpp

    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    devices = device_list(llama_cpp)
    if not devices:
        devices = ["llama.cpp: GPU offload build" if gpu else "llama.cpp: CPU"]
    return devices, gpu
