"""What the CPU that numba compiles for offers, for the kernels written as explicit LLVM vector code.

Numba compiles for the host CPU unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise (for a
portable cache, say); its on-disk cache is keyed on that CPU, so these choices stay consistent
with the cached code.  Neither choice affects results, only speed.
"""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import config


def _features() -> str:
    if config.CPU_FEATURES is not None:
        return config.CPU_FEATURES
    return llvm.get_host_cpu_features().flatten() if (config.CPU_NAME or "host") == "host" else ""


_FEATURES = _features()
_TRIPLE = llvm.get_process_triple()

# float32 lanes per vector: 16 with AVX-512, else 8 (two 128-bit registers on NEON: LLVM splits)
VECTOR_WIDTH = 16 if "+avx512f" in _FEATURES else 8

# Parallel kernels split their work into this many chunks per thread (the workspace's scratch has a
# row per chunk): enough to even out uneven chunks, few enough that each is worth its dispatch.
CHUNKS_PER_THREAD = 4

# Whether f16 -> f32 has an instruction (x86 F16C: vcvtph2ps; every aarch64).  Without one, LLVM would
# call a runtime helper that numba does not link, so half_to_float below converts with integer ops.
F16_NATIVE = "+f16c" in _FEATURES or _TRIPLE.startswith(("aarch64", "arm64"))

# The packed matmul's integer kernel (qdot.py), by what the CPU has:
# - AVX-512 VNNI: vpdpbusd, u8 x s8 dot products of 4 bytes added into int32 lanes (16-lane vectors);
# - else AVX-512BW or AVX2: the same sums from vpmaddubsw (u8 x s8 pairs into int16) and vpmaddwd
#   (pairs of those into int32), as llama.cpp's AVX2 kernels form them, at the float vector width;
# - else none: the portable float kernel runs (same results).
VNNI = "+avx512vnni" in _FEATURES and VECTOR_WIDTH == 16
MADD = not VNNI and ("+avx512bw" in _FEATURES if VECTOR_WIDTH == 16 else "+avx2" in _FEATURES)
INT_KERNEL = VNNI or MADD
ISA = ("AVX-512 VNNI" if VNNI else ("AVX-512BW" if VECTOR_WIDTH == 16 else "AVX2") if MADD
       else "portable kernels")  # what `infer backends` and stats lines say

# The byte operands of llvm.x86.avx512.vpdpbusd.512: <64 x i8> in LLVM 22 (which reads the older
# <16 x i32> form only through its auto-upgrade), <16 x i32> before (their own form, or upgraded
# if the change came earlier).  Not probed: a mistyped intrinsic declaration can abort an LLVM
# built with assertions instead of raising an error.
VNNI_BYTES = llvm.llvm_version_info >= (22,)


def half_to_float(builder, bits):
    """<n x i16> f16 bits -> <n x float>.  Finite values only (K/V and block scales are finite)."""
    n = bits.type.count
    f32 = ir.VectorType(ir.FloatType(), n)
    if F16_NATIVE:
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), n)), f32)
    i32 = ir.VectorType(ir.IntType(32), n)
    b = builder.zext(bits, i32)
    const = lambda v: ir.Constant(i32, [v] * n)
    # exponent and mantissa moved into float32 position, then scaled by 2**112 to rebias the
    # exponent (15 -> 127); subnormal halves come out right too, as float32 denormals times 2**112
    mag = builder.bitcast(builder.shl(builder.and_(b, const(0x7FFF)), const(13)), f32)
    val = builder.fmul(mag, ir.Constant(f32, [2.0 ** 112] * n))
    sign = builder.shl(builder.and_(b, const(0x8000)), const(16))
    return builder.bitcast(builder.or_(builder.bitcast(val, i32), sign), f32)


def halving_sum(builder, v):
    """The lanes of a float vector summed by halving (lane i plus lane i + n/2 until one is left), the
    order of x86's _mm512_reduce_add_ps (and of tinyBLAS's 8-lane hsum), for ggml's reductions."""
    n = v.type.count
    undef = ir.Constant(v.type, ir.Undefined)
    width = n
    while width > 1:
        width //= 2
        lanes = [width + i if i < width else i for i in range(n)]
        v = builder.fadd(v, builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), n), lanes)))
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


def f32x16_reduce(builder, chains):
    """ggml's GGML_F32x16_REDUCE of its four 16-lane chains (GGML_F32_ARR): chains 0 + 2 and 1 + 3,
    then those, then the lanes halved (_mm512_reduce_add_ps) -- how ggml_vec_dot_f32 and
    ggml_ssm_scan end a sum on AVX-512."""
    a = chains
    return halving_sum(builder, builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3])))


def splat(builder, x, n: int = VECTOR_WIDTH):
    """A scalar (float32 or integer) broadcast to an n-lane vector (default: VECTOR_WIDTH)."""
    vt = ir.VectorType(x.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


def c_float32_args(arrays, floats, ints) -> bool:
    """Whether an intrinsic's argument types are what its vector code assumes: C-contiguous float32
    arrays, float32 scalars, integers (offsets); anything else is left to numba's typing error."""
    return (all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in arrays)
            and all(v == types.float32 for v in floats) and all(isinstance(i, types.Integer) for i in ints))
