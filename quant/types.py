"""GGML tensor types: ids, block sizes and the bytes each block takes."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InferError

# Ids are GGML's (and gguf.GGMLQuantizationType's), so raw GGUF type fields map directly.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
MXFP4 = 39  # OCP microscaling FP4: per 32 weights an E8M0 exponent byte, then 16 bytes of e2m1 codes

QK_K = 256


@dataclass(frozen=True)
class QType:
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


QTYPES: dict[int, QType] = {
    t.id: t
    for t in (
        QType(F32, "F32", 1, 4),
        QType(F16, "F16", 1, 2),
        QType(BF16, "BF16", 1, 2),
        QType(Q4_0, "Q4_0", 32, 18),
        QType(Q4_1, "Q4_1", 32, 20),
        QType(Q5_0, "Q5_0", 32, 22),
        QType(Q5_1, "Q5_1", 32, 24),
        QType(Q8_0, "Q8_0", 32, 34),
        QType(Q2_K, "Q2_K", QK_K, 84),
        QType(Q3_K, "Q3_K", QK_K, 110),
        QType(Q4_K, "Q4_K", QK_K, 144),
        QType(Q5_K, "Q5_K", QK_K, 176),
        QType(Q6_K, "Q6_K", QK_K, 210),
        QType(MXFP4, "MXFP4", 32, 17),
    )
}


class UnsupportedQuantType(InferError, ValueError):
    """A tensor type infer cannot compute with."""


def qtype(type_id: int) -> QType:
    try:
        return QTYPES[int(type_id)]
    except KeyError:
        supported = ", ".join(t.name for t in QTYPES.values())
        raise UnsupportedQuantType(f"unsupported tensor type {type_id} (supported: {supported})") from None


def row_bytes(type_id: int, n: int) -> int:
    """Bytes taken by a row of n elements of this type."""
    t = qtype(type_id)
    if n % t.block_size:
        raise UnsupportedQuantType(f"row of {n} elements is not a multiple of {t.name}'s block size {t.block_size}")
    return n // t.block_size * t.type_size
