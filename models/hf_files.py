"""Reading a Hugging Face model folder's files: errors, JSON, safetensors headers and tensors,
and the GGUF key/value list being built (shared by convert_hf.py and hf_vocab.py)."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

from infer.quant.errors import InferError


class ConvertError(InferError, ValueError):
    """A Hugging Face folder that cannot be converted; the message names the file and the problem."""


class ConvertWarning(UserWarning):
    """Converted, but with a guess the user should know about (e.g. an unrecognised pre-tokenizer)."""



def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: no such file ({what})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return data


class Kvs:
    def __init__(self, arch: str):
        self.arch = arch
        self.items: list[tuple[str, int, Any]] = []

    def add(self, key: str, vtype: int, value: Any) -> None:
        self.items.append((key.replace("{arch}", self.arch), int(vtype), value))

    def u32(self, key: str, value: Any) -> None:
        self.add(key, VT.UINT32, int(value))

    def f32(self, key: str, value: Any) -> None:
        self.add(key, VT.FLOAT32, float(value))


# ---- safetensors

ST_DTYPES = {"F32": (np.float32, GT.F32), "F16": (np.float16, GT.F16), "BF16": (np.uint16, GT.BF16)}
# Every dtype whose bytes can be viewed as is (BF16 as its uint16 bits; U32: MLX's packed codes).
ST_NUMPY = {**{k: v[0] for k, v in ST_DTYPES.items()}, "U32": np.uint32}


# Every dtype of the safetensors format, with its size in bits: a header naming any other is not a
# safetensors file (the reference implementation refuses it too), and each tensor's byte span must
# be exactly its element count times this size, whatever the dtype, before anything reads it.
ST_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
           "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
           "F64": 64, "I64": 64, "U64": 64}
MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class StEntry:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, StEntry]:
    """The tensor table of one safetensors file (8-byte little-endian header size, JSON header, data).

    Parsed here rather than with the `safetensors` package: the format is this small, and numpy's
    memmap then gives lazy, bounded-memory access to every dtype including BF16 (as uint16). Every
    entry is checked as the reference implementation checks it (known dtype, non-negative integer
    dims, integer offsets inside the data, byte span = element count x dtype size, no overlap), since
    memmap, reshape and the kernels trust all of them.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConvertError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER:
            raise ConvertError(f"{path}: not a safetensors file (header size {n} is past the end)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConvertError(f"{path}: not a safetensors file (bad JSON header: {e})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: not a safetensors file (header is not a JSON object)")
    base = 8 + n
    out = {name: _st_entry(path, name, info, base, size - base) for name, info in header.items()
           if name != "__metadata__"}
    spans = sorted((e.offset, e.offset + e.nbytes, name) for name, e in out.items() if e.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ConvertError(f"{path}: tensors {a!r} and {b!r} overlap in the file")
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true / false are not numbers


def _st_entry(path: Path, name: str, info: Any, base: int, data_size: int) -> StEntry:
    """One header entry, checked: {"dtype": ..., "shape": [...], "data_offsets": [start, end]}."""
    if not isinstance(info, dict):
        raise ConvertError(f"{path}: tensor {name!r}: header entry is not a JSON object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ST_BITS:
        raise ConvertError(f"{path}: tensor {name!r}: dtype {dtype!r} is not a safetensors dtype")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ConvertError(f"{path}: tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(v) for v in offsets):
        raise ConvertError(f"{path}: tensor {name!r}: data_offsets {offsets!r} are not two integers")
    start, end = offsets
    if not 0 <= start <= end:
        raise ConvertError(f"{path}: tensor {name!r}: data_offsets {offsets} are not a start and an end in order")
    if end > data_size:
        raise ConvertError(f"{path}: tensor {name!r}: data_offsets {offsets} run past the end of the {data_size} "
                           "bytes of data (truncated?)")
    bits = math.prod(shape) * ST_BITS[dtype]
    if bits != 8 * (end - start):
        want = f"{bits // 8} bytes" if bits % 8 == 0 else f"{bits} bits"  # F4 / F6: sub-byte elements
        raise ConvertError(f"{path}: tensor {name!r} has {end - start} bytes, expected {want} for {dtype} {shape}")
    return StEntry(path, dtype, tuple(shape), base + start, end - start)


def st_array(e: StEntry, name: str) -> np.ndarray:
    if e.dtype not in ST_DTYPES:
        raise ConvertError(
            f"{e.path}: tensor {name!r} has dtype {e.dtype} (supported: {', '.join(ST_DTYPES)}; "
            "pre-quantized checkpoints such as MLX 4-bit cannot be converted)"
        )
    return st_view(e)


def st_view(e: StEntry) -> np.ndarray:
    """The tensor's bytes as a read-only memory-mapped array of its dtype (see ST_NUMPY)."""
    np_dtype = ST_NUMPY[e.dtype]
    if e.nbytes == 0:
        return np.zeros(e.shape, dtype=np_dtype)
    mm = np.memmap(e.path, dtype=np.uint8, mode="r", offset=e.offset, shape=(e.nbytes,))
    return mm.view(np_dtype).reshape(e.shape)

