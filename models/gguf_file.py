"""Reading GGUF files: metadata into Python values, tensors as views of the file's memory map.

A model split by llama.cpp's gguf-split (NAME-00001-of-0000N.gguf, ...) reads as one file from its
first shard: every shard is a GGUF with the keys split.no / split.count / split.tensors.count, the
first holds the model's metadata, and each holds some of the tensors (llama.cpp's llama-model-loader).

gguf.GGUFReader builds a numpy view per string and takes ~25 s on a 262k-token vocab,
so the header is parsed here with struct; gguf supplies the type enums.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from infer.quant.errors import InferError
from infer.quant.tensor import QTensor
from infer.quant.types import UnsupportedQuantType, qtype

from .gguf_write import SCALAR_FORMAT, VALUE_DTYPE

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
# A shard's file name, as llama.cpp's llama_split_path writes it: PREFIX-%05d-of-%05d.gguf
SHARD_NAME = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)


def shard_path(first: Path, i: int, n: int) -> Path:
    """Shard i (0-based) of n, next to the first shard `first` (whose name follows SHARD_NAME)."""
    m = SHARD_NAME.match(first.name)
    return first.with_name(f"{m.group('base')}-{i + 1:05d}-of-{n:05d}.gguf")


class GGUFError(InferError, ValueError):
    """A file that is not a readable GGUF: the message names the file and the problem."""


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(f"{self.path}: truncated file (header runs past the end at byte {len(self.buf)})")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def scalar(self, fmt: str, size: int):
        return struct.unpack_from(fmt, self.take(size))[0]

    def u32(self) -> int:
        return self.scalar("<I", 4)

    def u64(self) -> int:
        return self.scalar("<Q", 8)

    def string(self) -> str:
        return bytes(self.take(self.u64())).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.u32(), self.u64()
            if etype == GGUFValueType.STRING:
                return self.string_array(count)
            if etype in VALUE_DTYPE:
                dt = VALUE_DTYPE[etype]
                return np.frombuffer(self.take(count * dt.itemsize), dtype=dt).copy()
            if etype == GGUFValueType.ARRAY:
                return [self.value(GGUFValueType.ARRAY) for _ in range(count)]
            raise GGUFError(f"{self.path}: unknown array element type {etype}")
        if vtype in SCALAR_FORMAT:
            fmt = SCALAR_FORMAT[vtype]
            return self.scalar(fmt, struct.calcsize(fmt))
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype}")

    def string_array(self, count: int) -> list[str]:
        # Hot path for vocabularies: local names and one bounds check per string.
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.unpack_from
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFError(f"{self.path}: truncated file (vocabulary runs past the end)")
            (n,) = unpack("<Q", buf, pos)
            pos += 8
            if pos + n > end:
                raise GGUFError(f"{self.path}: truncated file (vocabulary runs past the end)")
            append(str(buf[pos:pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out


@dataclass(frozen=True, eq=False)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, QTensor]
    # Each key's GGUF value type and, for arrays, the element type: rewriting a file (infer quantize)
    # must keep them, since a u32 stored back as an i32 changes the bytes llama.cpp would write.
    kv_types: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    shards: int = 1  # files the model is split into (path: the first)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file; tensor data stays on disk behind a read-only memory map.  The first shard
    of a split model reads as the whole model: the tensors of every shard, the first's metadata
    without the split.* keys (they describe the files, not the model)."""
    first = _read_one(Path(path))
    n = _split_key(first, SPLIT_COUNT, 0)
    if n <= 1:
        return first
    no = _split_key(first, SPLIT_NO, 0)
    m = SHARD_NAME.match(first.path.name)
    if m is None or int(m.group("i")) != no + 1 or int(m.group("n")) != n:
        raise GGUFError(f"{path}: shard {no + 1} of a model split in {n}, but its name does not end in "
                        f"-{no + 1:05d}-of-{n:05d}.gguf as llama.cpp names shards")
    if no != 0:
        raise GGUFError(f"{path}: shard {no + 1} of {n} of a split model; give the first, {shard_path(first.path, 0, n).name}")
    tensors = dict(first.tensors)
    for i in range(1, n):
        sp = shard_path(first.path, i, n)
        if not sp.exists():
            raise GGUFError(f"{path}: shard {i + 1} of {n} is missing ({sp.name})")
        shard = _read_one(sp)
        if _split_key(shard, SPLIT_NO, -1) != i or _split_key(shard, SPLIT_COUNT, 0) != n:
            raise GGUFError(f"{sp}: not shard {i + 1} of {n} (its split.no / split.count say otherwise)")
        for name, t in shard.tensors.items():
            if name in tensors:
                raise GGUFError(f"{sp}: tensor {name!r} is in an earlier shard too")
            tensors[name] = t
    expected = _split_key(first, SPLIT_TENSORS, len(tensors))
    if expected != len(tensors):
        raise GGUFError(f"{path}: the shards hold {len(tensors)} tensors, the first says {expected}")
    drop = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
    meta = {k: v for k, v in first.metadata.items() if k not in drop}
    kv_types = {k: v for k, v in first.kv_types.items() if k not in drop}
    return GGUFFile(first.path, first.version, meta, tensors, kv_types, shards=n)


def _split_key(g: GGUFFile, key: str, default: int) -> int:
    v = g.metadata.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise GGUFError(f"{g.path}: metadata {key} is {v!r}, not an integer")
    return int(v)


def _read_one(path: Path) -> GGUFFile:
    """One GGUF file (a whole model, or one shard of a split one)."""
    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (ValueError, OSError) as e:  # empty files cannot be mapped
        raise GGUFError(f"{path}: cannot map file ({e})") from None
    cur = _Cursor(memoryview(mm), path)
    if len(mm) < 4 or bytes(cur.take(4)) != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic)")
    version = cur.u32()
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.u64(), cur.u64()
    if n_tensors > 1 << 24 or n_kv > 1 << 24:
        raise GGUFError(f"{path}: corrupt header ({n_tensors} tensors, {n_kv} metadata keys)")

    metadata: dict[str, Any] = {}
    kv_types: dict[str, tuple[int, int | None]] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.u32()
        etype = None
        if vtype == GGUFValueType.ARRAY and cur.pos + 4 <= len(cur.buf):
            (etype,) = struct.unpack_from("<I", cur.buf, cur.pos)
        kv_types[key] = (vtype, etype)
        metadata[key] = cur.value(vtype)

    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.u32()
        if n_dims > 4:
            raise GGUFError(f"{path}: corrupt tensor info for {name!r} ({n_dims} dimensions)")
        ne = [cur.u64() for _ in range(n_dims)] or [1]  # no dimensions: a scalar (gguf.cpp's default of 1)
        infos.append((name, ne, cur.u32(), cur.u64()))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two")  # as gguf.cpp checks
    alignment = int(alignment)
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, QTensor] = {}
    spans = []
    for name, ne, type_id, offset in infos:
        try:
            t = qtype(type_id)
        except UnsupportedQuantType as e:
            raise GGUFError(f"{path}: tensor {name!r} has an {e}") from None
        if name in tensors:
            raise GGUFError(f"{path}: tensor {name!r} appears twice")
        if any(d == 0 for d in ne):
            raise GGUFError(f"{path}: tensor {name!r} has an empty dimension {ne}")
        count = math.prod(ne)  # Python integers: absurd dimensions cannot overflow into a small size
        if ne[0] % t.block_size:
            raise GGUFError(f"{path}: tensor {name!r} row length {ne[0]} is not a multiple of {t.name}'s block size")
        if offset % alignment:
            raise GGUFError(f"{path}: tensor {name!r} data offset {offset} is not aligned to {alignment}")
        nbytes = count // t.block_size * t.type_size
        start = data_start + offset
        if start + nbytes > len(mm):
            raise GGUFError(
                f"{path}: truncated file (tensor {name!r} needs bytes up to {start + nbytes}, file has {len(mm)})"
            )
        spans.append((start, start + nbytes, name))
        shape = tuple(int(d) for d in reversed(ne))
        tensors[name] = QTensor.from_bytes(type_id, shape, mm[start:start + nbytes])
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise GGUFError(f"{path}: tensors {a!r} and {b!r} overlap in the file")
    return GGUFFile(path, version, metadata, tensors, kv_types)
