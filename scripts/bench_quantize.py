"""Quantization speed of `infer quantize` against llama.cpp's llama_model_quantize on the same F32 GGUF.

The embedded Gemma 3 270M is dequantized once by infer into an F32 GGUF in a temporary folder; then
both quantize it to the same type with the same thread count, in one process, alternating
repetitions (infer's numba kernels are loaded by a warm-up first, as after the first `infer` run).
Prints each time, the ratio (target: infer <= 2x llama.cpp) and whether the two outputs are identical.

    python scripts/bench_quantize.py [--type Q4_K_M] [--threads 2] [--repetitions 2] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF to dequantize (default: the embedded Gemma 3 270M Q4_K_M)")
    p.add_argument("--type", default="Q4_K_M")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repetitions", type=int, default=2)
    p.add_argument("--keep", default=None, help="folder for the F32 file and outputs (default: a temporary one)")
    return p.parse_args(argv)


def dequantize_to_f32(src: Path, dst: Path) -> None:
    """Every tensor as F32, metadata as is but general.file_type = 0 (all F32)."""
    import numpy as np
    from gguf import GGUFValueType as VT

    from infer.models.gguf_write import GGUFStreamWriter, TensorInfo
    from infer.models.source import source_from_gguf
    from infer.quant.dequant import dequantize
    from infer.quant.types import F32

    model = source_from_gguf(src)
    kvs = [(k, t, 0 if k == "general.file_type" else v) for k, t, v in model.kvs]
    if not any(k == "general.file_type" for k, _, _ in kvs):
        kvs.append(("general.file_type", VT.UINT32, 0))
    infos = [TensorInfo(t.name, t.shape, F32) for t in model.tensors]
    with GGUFStreamWriter(dst, kvs, infos) as w:
        for t in model.tensors:
            raw = t.load()
            if t.type_id == F32:
                w.write_tensor([np.ascontiguousarray(raw)])
                continue
            if raw.dtype != np.uint8:
                raw = raw.view(np.uint8)
            w.write_tensor([dequantize(raw, t.type_id, t.shape)])


def main(argv=None) -> int:
    args = parse_args(argv)
    import llama_cpp

    from infer.models.default import default_model_path
    from infer.models.quantize_file import QuantizeOptions, quantize_model
    from infer.quant.recipe import file_type

    ftype_value = file_type(args.type).file_type
    import ctypes

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):  # llama.cpp logs every tensor; only the timings matter here
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    src = Path(args.model) if args.model else default_model_path()
    tmp = tempfile.TemporaryDirectory() if args.keep is None else None
    d = Path(args.keep or tmp.name)
    d.mkdir(parents=True, exist_ok=True)
    f32 = d / "model-f32.gguf"
    if not f32.exists():
        t = time.perf_counter()
        dequantize_to_f32(src, f32)
        print(f"dequantized {src.name} -> {f32} ({f32.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")

    # Warm-up: load (or compile) the numba kernels on a few rows, outside the timing.
    import numpy as np

    from infer.quant.quantizers import quantize
    from infer.quant.types import Q4_K, Q5_0, Q6_K, Q8_0

    for tid in (Q4_K, Q6_K, Q8_0, Q5_0):
        quantize(tid, np.ones((2, 256), np.float32))

    ours, ref = d / "infer.gguf", d / "llama.gguf"
    times: dict[str, list[float]] = {"infer": [], "llama.cpp": []}
    for _ in range(args.repetitions):
        t = time.perf_counter()
        quantize_model(f32, ours, QuantizeOptions(type=args.type, threads=args.threads, force=True))
        times["infer"].append(time.perf_counter() - t)

        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.nthread = ftype_value, args.threads
        t = time.perf_counter()
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(ref).encode(), p) != 0:
            print("llama_model_quantize failed", file=sys.stderr)
            return 1
        times["llama.cpp"].append(time.perf_counter() - t)

    a, b = statistics.median(times["infer"]), statistics.median(times["llama.cpp"])
    print(f"{args.type} of {f32.name}, {args.threads} threads, median of {args.repetitions}:")
    print(f"  infer      {a:7.2f} s  (best {min(times['infer']):.2f})")
    print(f"  llama.cpp  {b:7.2f} s  (best {min(times['llama.cpp']):.2f})")
    print(f"  ratio      {a / b:7.2f}x  (target <= 2x)")
    print(f"  identical output: {ours.read_bytes() == ref.read_bytes()}")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
