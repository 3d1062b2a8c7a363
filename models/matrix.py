"""A weight matrix as the loaders hand it on, row views of one, and ModelLoadError: what every
collector of a model's tensors shares (weights.py, encoder_weights.py, mixer_weights.py), apart
so that they import it and not each other."""
from __future__ import annotations

import numpy as np

from infer.quant.affine import AffineTensor
from infer.quant.errors import InferError
from infer.quant.tensor import QTensor


class ModelLoadError(InferError, ValueError):
    """A model file that cannot be run; the message names the file and the problem."""


# A weight matrix: GGML blocks (GGUF files; F16/F32/BF16 for dense MLX-folder matrices) or MLX's
# affine format (quantized MLX folders).
Matrix = QTensor | AffineTensor


def rows(t: Matrix | np.ndarray, lo: int, hi: int) -> Matrix | np.ndarray:
    """Rows lo:hi of a matrix (a view: each row of a block-quantized matrix is whole blocks) or of a vector."""
    if isinstance(t, QTensor):
        return QTensor(t.type_id, (hi - lo, t.shape[-1]), t.raw[lo:hi])
    if isinstance(t, AffineTensor):
        raise ModelLoadError("a fused matrix (Q/K/V or gate/up) in MLX's affine format is not supported")
    return t[lo:hi]
