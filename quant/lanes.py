"""Small numba helpers that keep the dequantization loops in narrow vector lanes.

`u32_at` loads an unaligned little-endian uint32, `int_to_f32` converts through int32, `shr`
shifts in the value's own width, and `opaque32` hides a trip count from LLVM's unroller; each
says beside it which vectorizer habit it works around.  Shared by `dequant.py`, `kquants.py` and
the CPU backend's repacking.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic


@njit(cache=True, inline="always")
def u32_at(src, o):
    # src: (k,) uint8; the little-endian uint32 at byte o, at any alignment (LLVM merges the loads)
    return np.uint32(
        np.int64(src[o])
        | (np.int64(src[o + 1]) << 8)
        | (np.int64(src[o + 2]) << 16)
        | (np.int64(src[o + 3]) << 24)
    )


@njit(cache=True, inline="always")
def int_to_f32(x):
    """Small integer -> float32 through int32.

    numba widens integer arithmetic to int64; truncating to int32 first lets LLVM narrow the
    whole expression and convert 16 lanes at a time (vcvtdq2ps) rather than 8 (vcvtqq2ps).
    """
    return np.float32(np.int32(x))


@intrinsic
def shr(typingctx, x, k):
    """x >> k in x's own width (uint8 stays 8-bit, uint32 32-bit); k must be below that width.

    numba's `>>` widens to int64, and LLVM cannot narrow a right shift back, so vector code would
    run in 64-bit lanes.  Shifting the narrow value keeps it in byte/dword lanes.
    """
    if not (isinstance(x, types.Integer) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        xv, kv = args
        kv = context.cast(builder, kv, signature.args[1], signature.args[0])
        return builder.ashr(xv, kv) if signature.args[0].signed else builder.lshr(xv, kv)

    return x(x, k), codegen


@njit(cache=True, inline="always")
def opaque32(n, nb, shift):
    """32 for a row of n == nb * (32 << shift) elements, computed so that LLVM cannot see the constant.

    Inner loops use it as their trip count: a literal range(32) is fully unrolled and then left
    scalar, because nothing tells LLVM's SLP vectorizer that src and dst do not overlap; an
    opaque count keeps the loop for the loop vectorizer, which checks the overlap at run time.
    The min() keeps a malformed row in bounds and tells LLVM the loop runs at most 32 times.
    Callers ensure nb > 0.
    """
    return min((n // nb) >> shift, 32)
