"""Random quantized blocks with valid scales: the input of the dequantization and MLX weight tests."""
from __future__ import annotations

import numpy as np

from infer.quant import types as qt

# Byte offsets of the f16 fields (d, m / dmin) inside one block of each type (ggml-common.h).
F16_FIELDS = {
    qt.Q4_0: (0,),
    qt.Q4_1: (0, 2),
    qt.Q5_0: (0,),
    qt.Q5_1: (0, 2),
    qt.Q8_0: (0,),
    qt.Q2_K: (80, 82),
    qt.Q3_K: (108,),
    qt.Q4_K: (0, 2),
    qt.Q5_K: (0, 2),
    qt.Q6_K: (208,),
    qt.MXFP4: (),  # its scale is an E8M0 exponent byte: every value is a valid one
}


# Finite f16 values that random scales are drawn from besides the uniform ones: zeros, the
# smallest subnormal, a subnormal, the smallest normal, and a large one.
SPECIAL_F16 = np.array([0.0, -0.0, 6e-8, -3e-6, 6.1035e-05, 1000.0], dtype=np.float16)


def random_blocks(type_id: int, rows: int, n: int, seed: int = 0) -> np.ndarray:
    """(rows, row_bytes) uint8: random bytes, with every f16 field a random finite value."""
    t = qt.qtype(type_id)
    rng = np.random.default_rng(seed * 1000 + type_id)
    nb = n // t.block_size
    raw = rng.integers(0, 256, size=(rows, nb, t.type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(type_id, ()):
        vals = rng.uniform(-4.0, 4.0, size=(rows, nb)).astype(np.float16)
        special = rng.random((rows, nb)) < 0.1
        vals[special] = rng.choice(SPECIAL_F16, size=int(special.sum()))
        raw[:, :, off : off + 2] = vals.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * t.type_size)
