"""float32 <-> f16 / bf16 in numba, the one rounding every part uses (quantizers, dequantizers, CPU kernels).

numba has no float16 scalar, so these work on the IEEE bits: `f32_bits` / `bits_f32` bitcast,
`f32_to_f16` / `f32_to_bf16` round to nearest even as ggml does (NaN/Inf kept), and `F16_TO_F32` /
`f16_at` read halves back through a 65536-entry table.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# f16 bits -> float32 for every 16-bit pattern, as numpy converts them (subnormals, inf, NaN).
# numba freezes this global into the compiled code as a constant (also with cache=True).
F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@intrinsic
def f32_bits(typingctx, f):
    """The IEEE bits of a float32, as uint32 (a bitcast; numba has no scalar view)."""
    if not isinstance(f, types.Float) or f.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(f), codegen


@intrinsic
def bits_f32(typingctx, u):
    """The float32 with these IEEE bits (a uint32): f32_bits' inverse."""
    if not isinstance(u, types.Integer) or u.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(u), codegen


@njit(cache=True, inline="always")
def f32_to_f16(f):
    # f: float32 -> f16 bits (int64), round to nearest even; overflow -> inf, NaN -> sign|0x7E00
    u = np.int64(f32_bits(f))
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return sign | 0x7E00
    if a >= 0x477FF000:  # >= 65520 rounds up past 65504
        return sign | 0x7C00
    if a < 0x38800000:  # below 2**-14: subnormal; scaling by 2**24 is exact, rint rounds to even
        return sign | np.int64(np.rint(np.abs(f) * np.float32(16777216.0)))
    h = (a >> 13) - (112 << 10)  # rebias the exponent 127 -> 15
    rem = a & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1) == 1):
        h += 1  # a carry into the exponent is still the right value
    return sign | h


@njit(cache=True, inline="always")
def f32_to_bf16(f):
    # f: float32 -> bf16 bits (int64): round to nearest even; NaN kept a quiet NaN (bit 6 set)
    u = np.int64(f32_bits(f))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 64) & 0xFFFF
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


@njit(cache=True, inline="always")
def f16_at(src, o):
    # src: (k,) uint8; the little-endian f16 at byte o, as float32
    return F16_TO_F32[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
