"""`infer quantize`: a GGUF (or HF safetensors folder) in, a quantized GGUF out, as llama-quantize writes it.

The tensor types come from quant/recipe.py, the bytes from infer.quant.quantizers, the file from the
streaming writer in gguf_write.py. Tensors are read, converted and written one row chunk at a
time, so memory stays bounded by the chunk size, not by the model.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT

from infer.quant import recipe
from infer.quant.errors import InferError
from infer.quant.types import BF16, F16, F32, qtype

from .arch import UnknownArchitecture, architecture
from .gguf_write import GGUFStreamWriter, TensorInfo
from .source import SourceModel, SourceTensor, source_from_gguf

# Elements converted per step: 16 MiB of float32, enough to keep every quantizer thread busy.
CHUNK_ELEMENTS = 1 << 22

# Keys llama.cpp rewrites (moved to the end with new values) or drops (split files become one).
_REWRITTEN = ("general.quantization_version", "general.file_type")
_DROPPED = ("split.no", "split.count", "split.tensors.count")
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: the block layouts' version


class QuantizeError(InferError, ValueError):
    """Input that cannot be quantized: the message names the file or tensor and the problem."""


@dataclass(frozen=True)
class QuantizeOptions:
    type: str = "Q4_K_M"
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    pure: bool = False
    imatrix: Path | None = None
    allow_requantize: bool = False
    force: bool = False
    threads: int | None = None


@dataclass(frozen=True)
class QuantizeSummary:
    out_path: Path
    file_type: str
    n_tensors: int
    bytes_before: int  # tensor data in the input, as stored
    bytes_after: int  # tensor data in the output
    file_size: int
    type_counts: dict[str, int]
    seconds: float
    warnings: tuple[str, ...] = field(default=())


# progress(index, total, tensor plan) before each tensor is converted or copied.
Progress = Callable[[int, int, recipe.TensorPlan], None]


def quantize_model(src: str | Path, out: str | Path, options: QuantizeOptions = QuantizeOptions(),
                   progress: Progress | None = None, warn: Callable[[str], None] | None = None) -> QuantizeSummary:
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    warnings: list[str] = []

    def note(msg: str) -> None:
        warnings.append(msg)
        if warn:
            warn(msg)

    ftype = recipe.file_type(options.type)
    ott = recipe.tensor_type(options.output_tensor_type) if options.output_tensor_type else None
    tet = recipe.tensor_type(options.token_embedding_type) if options.token_embedding_type else None
    if out.exists() and not options.force:
        raise QuantizeError(f"{out}: already exists (use --force to overwrite)")
    if out.is_dir():
        raise QuantizeError(f"{out}: is a directory")
    if not out.parent.exists():
        raise QuantizeError(f"{out.parent}: no such directory")
    if src.exists() and out.exists() and src.resolve() == out.resolve():
        raise QuantizeError(f"{out}: input and output are the same file")

    model = open_source(src)
    try:
        architecture(model.arch)
    except UnknownArchitecture as e:
        raise QuantizeError(f"{src}: {e}") from None
    params = _model_params(model, src)

    imatrix = None
    if options.imatrix is not None:
        from .imatrix import load_imatrix

        imatrix = load_imatrix(options.imatrix)
        for name, v in imatrix.values.items():
            if not np.isfinite(v).all():
                raise QuantizeError(f"{options.imatrix}: imatrix entry {name} has non-finite values")

    ropts = recipe.RecipeOptions(ftype, ott, tet, options.pure, imatrix is not None)
    by_name = {t.name: t for t in model.tensors}
    if len(by_name) != len(model.tensors):
        raise QuantizeError(f"{src}: duplicate tensor names")
    try:
        plans = recipe.plan([(t.name, t.shape, t.type_id) for t in model.tensors], params, ropts)
    except recipe.RecipeError as e:
        raise QuantizeError(f"{src}: {e}") from None

    requant = [p for p in plans if p.converts and p.src_type not in (F32, F16, BF16)]
    if requant and not options.allow_requantize:
        p = requant[0]
        raise QuantizeError(
            f"{src}: already quantized ({p.name} is {qtype(p.src_type).name}); requantizing loses quality, "
            "pass --allow-requantize to do it anyway")
    if requant:
        note(f"requantizing {len(requant)} already-quantized tensors: quality will be worse than from F16/F32")
    fallbacks = [p for p in plans if p.fallback]
    if fallbacks:
        # One line, not one per tensor: a model with 640-wide rows has them in every layer.
        mix = Counter(qtype(p.dst_type).name for p in fallbacks)
        note(f"{len(fallbacks)} tensors have rows that do not fit 256-element blocks (e.g. {fallbacks[0].name}, "
             f"{fallbacks[0].shape[-1]} wide): using " + ", ".join(f"{k} for {n}" for k, n in mix.items()))

    if options.threads:
        import numba

        numba.set_num_threads(max(1, min(options.threads, numba.config.NUMBA_NUM_THREADS)))

    kvs = output_kvs(model.kvs, ftype.file_type, imatrix, options.imatrix)
    infos = [TensorInfo(p.name, p.shape, p.dst_type) for p in plans]
    with GGUFStreamWriter(out, kvs, infos) as w:
        for i, p in enumerate(plans):
            if progress:
                progress(i, len(plans), p)
            t = by_name[p.name]
            if not p.converts:
                w.write_tensor(_copy_chunks(t))
                continue
            im = _imatrix_for(imatrix, p, note) if imatrix is not None and p.dst_type not in (F32, F16, BF16) else None
            w.write_tensor(_convert_chunks(t, p.dst_type, im))
    counts = Counter(qtype(p.dst_type).name for p in plans)
    return QuantizeSummary(
        out, ftype.name, len(plans), sum(i.nbytes for i in (TensorInfo(t.name, t.shape, t.type_id) for t in model.tensors)),
        sum(i.nbytes for i in infos), out.stat().st_size, dict(sorted(counts.items(), key=lambda kv: -kv[1])),
        time.perf_counter() - t0, tuple(warnings))


def open_source(src: Path) -> SourceModel:
    """A GGUF file, or an HF safetensors folder through the converter."""
    if src.is_dir():
        try:
            from .convert_hf import source_from_hf
        except ImportError:
            raise QuantizeError(f"{src}: is a folder, and reading HF safetensors folders is not available yet") from None
        return source_from_hf(src)
    return source_from_gguf(src)


def _model_params(model: SourceModel, src: Path) -> recipe.ModelParams:
    kv = {k: v for k, _, v in model.kvs}
    a = model.arch

    def num(key: str, default: int = 0) -> int:
        v = kv.get(f"{a}.{key}", default)
        # Per-layer arrays (e.g. head_count_kv in hybrid models): the rules only need a representative.
        return int(np.max(v)) if isinstance(v, np.ndarray) and v.size else int(v)

    n_layer = num("block_count")
    if n_layer <= 0:
        raise QuantizeError(f"{src}: missing {a}.block_count")
    return recipe.ModelParams(a, n_layer, num("expert_count"), num("head_count"), num("head_count_kv"))


def output_kvs(kvs: list[tuple[str, int, Any]], file_type: int, imatrix=None,
               imatrix_path: Path | None = None) -> list[tuple[str, int, Any]]:
    """The output's metadata in llama.cpp's order: the input's, then the quantization keys."""
    out = [kv for kv in kvs if kv[0] not in _REWRITTEN and kv[0] not in _DROPPED]
    out.append(("general.quantization_version", VT.UINT32, QUANTIZATION_VERSION))
    out.append(("general.file_type", VT.UINT32, file_type))
    if imatrix is not None:
        # llama-quantize records where the importance data came from (as the path it was given).
        out.append(("quantize.imatrix.file", VT.STRING, str(imatrix_path)[:127]))
        if imatrix.datasets:
            out.append(("quantize.imatrix.dataset", VT.STRING, imatrix.datasets[0][:127]))
        out.append(("quantize.imatrix.entries_count", VT.UINT32, len(imatrix.values)))
        if imatrix.chunk_count > 0:
            out.append(("quantize.imatrix.chunks_count", VT.UINT32, imatrix.chunk_count))
    return out


def _imatrix_for(imatrix, p: recipe.TensorPlan, note) -> np.ndarray | None:
    v = imatrix.values.get(p.name)
    if v is None:
        note(f"no imatrix data for {p.name}")
        return None
    n_mat = p.shape[-3] if len(p.shape) >= 3 else 1
    if v.size != p.shape[-1] * n_mat:
        if p.name in ("token_embd.weight", "per_layer_token_embd.weight"):
            return None  # embeddings are lookups: imatrix tools record no sensible data for them
        raise QuantizeError(f"{imatrix.path}: imatrix entry {p.name} has {v.size} values, the tensor needs "
                            f"{p.shape[-1] * n_mat}")
    return v.reshape(n_mat, p.shape[-1])


def rows_view(t: SourceTensor) -> np.ndarray:
    data = t.load()
    k = t.shape[-1]
    rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
    if t.type_id in (F32, F16, BF16):
        return data.reshape(rows, k)
    return np.asarray(data, dtype=np.uint8).reshape(rows, -1)


def _copy_chunks(t: SourceTensor):
    rows = rows_view(t)
    step = max(1, CHUNK_ELEMENTS // max(1, rows.shape[1]))
    for r in range(0, rows.shape[0], step):
        yield np.ascontiguousarray(rows[r:r + step]).view(np.uint8)


def rows_to_f32(t: SourceTensor, chunk: np.ndarray) -> np.ndarray:
    if t.type_id == F32:
        return np.ascontiguousarray(chunk, dtype=np.float32)
    if t.type_id == F16:
        return chunk.astype(np.float32)  # exact: every f16 is a float32
    if t.type_id == BF16:
        return (np.ascontiguousarray(chunk).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    from infer.quant.dequant import dequantize

    return dequantize(np.ascontiguousarray(chunk), t.type_id, (chunk.shape[0], t.shape[-1]))


def _convert_chunks(t: SourceTensor, dst: int, im: np.ndarray | None):
    quantize = _quantizer()
    rows = rows_view(t)
    k = t.shape[-1]
    n_mat = im.shape[0] if im is not None else 1
    per_mat = rows.shape[0] // n_mat  # experts are quantized separately: each has its own imatrix slice
    step = max(1, CHUNK_ELEMENTS // k)
    for m in range(n_mat):
        for r in range(m * per_mat, (m + 1) * per_mat, step):
            end = min(r + step, (m + 1) * per_mat)
            x = rows_to_f32(t, rows[r:end])
            if dst in (F32, F16, BF16) and not np.isfinite(x).all():
                # Block types check inside quantize(); float outputs would carry the NaN silently.
                raise QuantizeError(f"tensor {t.name} has NaN or infinite weights")
            if dst == F32:
                yield x
                continue
            try:
                yield quantize(dst, x, None if im is None else im[m])
            except ValueError as e:
                raise QuantizeError(f"tensor {t.name}: {e}") from None


def _quantizer():
    # Imported late: compiling the numba kernels is only worth it when something is converted.
    from infer.quant.quantizers import quantize

    return quantize
