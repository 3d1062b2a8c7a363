"""What `infer quantize` reads: a model's metadata and lazily loaded tensors, from a GGUF or an HF folder.

Both sources (this module's GGUF reader and models/convert_hf.py) produce the same SourceModel, so the
quantizer never knows where the weights came from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType

from .gguf_file import read_gguf
from .gguf_write import VALUE_DTYPE


@dataclass(frozen=True)
class SourceTensor:
    name: str  # GGUF tensor name
    shape: tuple[int, ...]  # numpy order (rows, ..., K): K = ne0 is the last
    type_id: int  # GGML type of the stored data (F32/F16/BF16, or a quant type for requantizing)
    # The data as stored: float32 / float16 arrays, BF16 as uint16 bits, quant types as raw uint8 rows.
    # Called once, when the tensor is written, so a model never has to fit in memory.
    load: Callable[[], np.ndarray]


@dataclass
class SourceModel:
    arch: str
    # Metadata in file order: (key, GGUFValueType, value). Arrays are numpy arrays (the dtype is the
    # element type) or lists of str; exact types let the output's KV bytes match llama.cpp's.
    kvs: list[tuple[str, int, Any]]
    tensors: list[SourceTensor]


def source_from_gguf(path: str | Path) -> SourceModel:
    """A GGUF file as a SourceModel: metadata parsed now, tensor data left in the memory map."""
    g = read_gguf(path)
    kvs: list[tuple[str, int, Any]] = []
    for key, value in g.metadata.items():
        vtype, etype = g.kv_types[key]
        if vtype == GGUFValueType.ARRAY and etype in VALUE_DTYPE:
            # An empty array reads back as float32 regardless of its element type: restore the dtype.
            value = np.asarray(value, dtype=VALUE_DTYPE[etype].newbyteorder("="))
        kvs.append((key, int(vtype), value))
    tensors = []
    for name, qt in g.tensors.items():
        tensors.append(SourceTensor(name, qt.shape, qt.type_id, _loader(qt)))
    return SourceModel(g.architecture, kvs, tensors)


def _loader(qt) -> Callable[[], np.ndarray]:
    from infer.quant.types import BF16, F16, F32

    def load() -> np.ndarray:
        # Views of the map: nothing is read until the bytes are touched.
        if qt.type_id == F32:
            return qt.raw.view(np.float32).reshape(qt.shape)
        if qt.type_id == F16:
            return qt.raw.view(np.float16).reshape(qt.shape)
        if qt.type_id == BF16:
            return qt.raw.view(np.uint16).reshape(qt.shape)
        return qt.raw

    return load
