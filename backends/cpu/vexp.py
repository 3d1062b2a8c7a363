"""ggml's vector exp (ggml_v_expf, as its AVX-512 build computes it: a polynomial of the remainder
scaled by 2**n), written per element with exact fused multiply-adds so that a numba loop over it
vectorizes and gives ggml's floats: llama.cpp takes it for SiLU (glu.py) and for the softmax
(attention.py).  Its AVX2 build forms the same exp with a different last rounding (an ulp apart).

The intrinsics live in this module on purpose: numba's on-disk cache of a function is keyed on
its own file only.  No caller may be compiled with fastmath: numba then compiles what a parallel
loop calls with the caller's flags (attention.py's kernel was fastmath, and softmax_exp cached that
way summed in another order, which moved the embedded Gemma's pooled embeddings outside llama.cpp's
spread), and LLVM could fold the rounding trick z - SHIFTER away.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_F32, _I32 = ir.FloatType(), ir.IntType(32)


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c for float32s, rounded once (llvm.fma: a vector FMA once the loop vectorizes)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def pow2(typingctx, n):
    """2**n as a float32, for a float32 n holding an integer in -126..127 (its exponent bits)."""
    if n != types.float32:
        return None

    def codegen(context, builder, signature, args):
        e = builder.add(builder.fptosi(args[0], _I32), ir.Constant(_I32, 127))
        return builder.bitcast(builder.shl(e, ir.Constant(_I32, 23)), _F32)

    return types.float32(types.float32), codegen


_f = lambda h: np.float32(float.fromhex(h))
_SHIFTER, _LOG2E, _LN2_HI, _LN2_LO = _f("0x1.8p23"), _f("0x1.715476p+0"), _f("0x1.62e4p-1"), _f("0x1.7f7d1cp-20")
_P1, _P2, _P3, _P4, _P5 = _f("0x1.ffffecp-1"), _f("0x1.fffdb6p-2"), _f("0x1.555e66p-3"), _f("0x1.573e2ep-5"), _f("0x1.0e4020p-7")
_ONE = np.float32(1.0)
EXP_SAFE = np.float32(87.0)  # below this |x|, ggml_v_expf's n is within -126..126 (2**n normal)


@njit(cache=True, inline="always")
def expf_parts(x):
    # ggml_v_expf (AVX-512) up to its last step: exp(x) = j * 2**n
    z = fma32(x, _LOG2E, _SHIFTER)
    n = z - _SHIFTER
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_P5, b, _P4), u, fma32(_P3, b, _P2)), u, fma32(_P1, b, _ONE))
    return n, j


@njit(cache=True)
def expf_wide(x):
    # ggml_v_expf for any x: _mm512_scalef_ps(j, n) rounds j * 2**n once (here: from the exact
    # double product), and |n| > 192 gives 0 or infinity
    n, j = expf_parts(x)
    if abs(n) > 192.0:
        return np.float32(0.0) if n <= 0.0 else np.float32(np.inf)
    return np.float32(math.ldexp(np.float64(j), int(n)))




@njit(cache=True, inline="always")
def expf_fast(x):
    """ggml_v_expf of x for |x| <= EXP_SAFE (elsewhere a finite stand-in: see expf_wide)."""
    n, j = expf_parts(x)
    return j * pow2(min(max(n, np.float32(-126.0)), np.float32(126.0)))


@njit(cache=True, inline="always", error_model="numpy")
def expf_row(x, negate, shift, out):
    """out[i] = ggml_v_expf(+-x[i] - shift) (minus where negate) for every i: x, out (n,) f32, out may
    be x.  Where every argument is within EXP_SAFE (almost always) one branch-free pass, which
    vectorizes; else each value beyond it the exact way (expf_wide), the rest as usual."""
    n = x.shape[0]
    sign = np.float32(-1.0) if negate else np.float32(1.0)
    wide = 0
    for i in range(n):
        d = sign * x[i] - shift
        wide += (d > EXP_SAFE) | (d < -EXP_SAFE)
    if wide:
        for i in range(n):
            d = sign * x[i] - shift
            out[i] = expf_wide(d) if (d > EXP_SAFE) | (d < -EXP_SAFE) else expf_fast(d)
    else:
        for i in range(n):
            out[i] = expf_fast(sign * x[i] - shift)


@njit(cache=True, error_model="numpy")
def softmax_exp(x, mx):
    """x (n,) f32 in place: ggml_v_expf(x - mx); returns the results' sum as ggml_vec_soft_max_f32
    forms it: each 16's in float32 the way _mm512_reduce_add_ps adds them (halves, then halves
    again), those sums in float64.  llama.cpp's rows are padded to whole 16s of masked keys (whose
    exp is 0): so every key takes the vector exp, and the last 16 is summed with zeros."""
    n = x.shape[0]
    expf_row(x, False, mx, x)
    total = 0.0
    for c in range(0, n, 16):
        h0, h1, h2, h3 = _lane(x, c + 8) + _lane(x, c), _lane(x, c + 9) + _lane(x, c + 1), \
            _lane(x, c + 10) + _lane(x, c + 2), _lane(x, c + 11) + _lane(x, c + 3)
        h4, h5, h6, h7 = _lane(x, c + 12) + _lane(x, c + 4), _lane(x, c + 13) + _lane(x, c + 5), \
            _lane(x, c + 14) + _lane(x, c + 6), _lane(x, c + 15) + _lane(x, c + 7)
        q0, q1, q2, q3 = h4 + h0, h5 + h1, h6 + h2, h7 + h3
        total += np.float64((q0 + q2) + (q1 + q3))
    return total


@njit(cache=True, inline="always")
def _lane(x, i):
    # x[i], or a masked key's 0 past the end
    return x[i] if i < x.shape[0] else np.float32(0.0)
