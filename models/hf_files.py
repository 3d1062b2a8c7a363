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


class ConvertError(ValueError):
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
    memmap then gives lazy, bounded-memory access to every dtype including BF16 (as uint16).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConvertError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise ConvertError(f"{path}: not a safetensors file (header size {n} is past the end)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConvertError(f"{path}: not a safetensors file (bad JSON header: {e})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: not a safetensors file (header is not a JSON object)")
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path}: malformed header entry for tensor {name!r}") from None
        if not 0 <= start <= end <= size - base:
            raise ConvertError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        if dtype in ST_NUMPY:
            expect = math.prod(shape) * np.dtype(ST_NUMPY[dtype]).itemsize
            if end - start != expect:
                raise ConvertError(f"{path}: tensor {name!r} has {end - start} bytes, expected {expect}")
        out[name] = StEntry(path, dtype, shape, base + start, end - start)
    return out


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

