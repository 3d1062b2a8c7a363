"""A streaming GGUF v3 writer: header and tensor infos first, then tensor data one tensor at a time.

gguf.GGUFWriter keeps every tensor in memory until the end; a quantizer must not, since the input
model may be larger than RAM. The layout is gguf.cpp's (and GGUFWriter's): header, KVs, tensor infos,
zero padding to the alignment, then each tensor's bytes padded to the alignment. The file is written
as a hidden temporary next to the target and renamed only when complete, so an error or Ctrl-C
never leaves a partial model behind.
"""
from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from gguf import GGUFValueType as VT

from infer.quant.types import row_bytes

DEFAULT_ALIGNMENT = 32

# GGUF value types: their struct format and numpy dtype (the reader in models/gguf_file.py uses them too)
SCALAR_FORMAT = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
    VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}
VALUE_DTYPE = {vt: np.dtype(fmt) for vt, fmt in SCALAR_FORMAT.items()}
_DTYPE_VT = {dt.newbyteorder("="): vt for vt, dt in VALUE_DTYPE.items()}


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _array_elem_type(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return _DTYPE_VT[value.dtype.newbyteorder("=")]
    items = list(value)
    if all(isinstance(v, (str, bytes)) for v in items):
        return VT.STRING
    # Python lists carry no width: use gguf.GGUFWriter's defaults so hand-built metadata matches it.
    if all(isinstance(v, bool) for v in items):
        return VT.BOOL
    if all(isinstance(v, int) for v in items):
        return VT.INT32
    return VT.FLOAT32


def encode_value(vtype: int, value: Any) -> bytes:
    """One KV value's bytes (after its u32 type), exactly as gguf.cpp writes them."""
    vtype = VT(vtype)
    if vtype == VT.STRING:
        return _string(value)
    if vtype == VT.ARRAY:
        etype = _array_elem_type(value)
        if etype == VT.STRING:
            return struct.pack("<IQ", VT.STRING, len(value)) + b"".join(_string(v) for v in value)
        arr = np.ascontiguousarray(value, dtype=VALUE_DTYPE[etype])
        return struct.pack("<IQ", etype, arr.size) + arr.tobytes()
    return struct.pack(SCALAR_FORMAT[vtype], value)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class TensorInfo:
    __slots__ = ("name", "shape", "type_id", "nbytes")

    def __init__(self, name: str, shape: tuple[int, ...], type_id: int):
        self.name, self.shape, self.type_id = name, tuple(int(d) for d in shape), int(type_id)
        rows = int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1
        self.nbytes = rows * row_bytes(self.type_id, self.shape[-1])

    def encode(self, offset: int) -> bytes:
        ne = list(reversed(self.shape))
        while len(ne) > 1 and ne[-1] == 1:  # ggml_n_dims: trailing 1s (in ne order) are not written
            ne.pop()
        return _string(self.name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, self.type_id, offset)


class GGUFStreamWriter:
    """Use as a context manager; write_tensor() the tensors in the order given, then it renames.

    kvs: (key, GGUFValueType, value) in file order. tensors: TensorInfo in file order.
    """

    def __init__(self, path: str | Path, kvs: Iterable[tuple[str, int, Any]], tensors: list[TensorInfo]):
        self.path = Path(path)
        self.kvs = list(kvs)
        self.tensors = tensors
        align = next((v for k, _, v in self.kvs if k == "general.alignment"), DEFAULT_ALIGNMENT)
        self.alignment = int(align)
        self._next = 0
        self._file = None
        self._tmp: str | None = None

    def __enter__(self) -> "GGUFStreamWriter":
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent or ".")
        self._file = os.fdopen(fd, "wb")
        try:
            self._write_header()
        except BaseException:
            self._abort()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._abort()
            return
        try:
            if self._next != len(self.tensors):
                raise RuntimeError(f"GGUF writer closed after {self._next} of {len(self.tensors)} tensors")
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._tmp, 0o644 & ~_umask())
            os.replace(self._tmp, self.path)
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._tmp and os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def _write_header(self) -> None:
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs))
        for key, vtype, value in self.kvs:
            out += _string(key) + struct.pack("<I", int(vtype)) + encode_value(vtype, value)
        offset = 0
        for t in self.tensors:
            out += t.encode(offset)
            offset += _pad(t.nbytes, self.alignment)
        out += bytes(_pad(len(out), self.alignment) - len(out))
        self._file.write(out)

    def write_tensor(self, chunks: Iterable[np.ndarray | bytes | memoryview]) -> None:
        """The next tensor's data, in pieces (row chunks), so no tensor needs to be whole in memory."""
        t = self.tensors[self._next]
        written = 0
        for c in chunks:
            buf = memoryview(np.ascontiguousarray(c)).cast("B") if isinstance(c, np.ndarray) else memoryview(c).cast("B")
            self._file.write(buf)
            written += buf.nbytes
        if written != t.nbytes:
            raise RuntimeError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
        self._file.write(bytes(_pad(written, self.alignment) - written))
        self._next += 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
