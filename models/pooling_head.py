"""A model's pooling head: the small layers llama.cpp puts after an embedding's pooled row.

Rank pooling (a reranker's, <arch>.pooling_type 4; llama-graph.cpp's build_pooling) runs the
pooled row through the classification head: `cls` (+ `cls.bias`) then tanh (GELU for
modern-bert), `cls.norm` (a LayerNorm without bias), then `cls.output` (+ `cls.output.bias`),
and a softmax for qwen3 (Qwen3-Reranker's converter writes the lm_head rows of "yes" and "no" as
cls.output: the score is P(yes)).  After any pooling, sentence-transformers' Dense modules
(`dense_2` (+ bias), `dense_3`; build_dense_out: EmbeddingGemma, LFM2) project the vector.  Each
part is optional, as in llama.cpp.

The head is a few small matrices applied once per embedding: it is kept here dequantized to
float32 (numpy, computed by the engine: engine/pooling.py), never given to the backends' layers,
so a file with one loads on every backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infer.quant.affine import AffineTensor, dequantize_affine
from infer.quant.errors import InferError
from infer.quant.tensor import QTensor

from .config import ModelConfig

# the head's tensors as llama.cpp names them (LLM_TENSOR_CLS, _CLS_OUT, _CLS_NORM, _DENSE_2_OUT, _DENSE_3_OUT)
HEAD_TENSORS = ("cls.weight", "cls.bias", "cls.norm.weight", "cls.output.weight", "cls.output.bias",
                "dense_2.weight", "dense_2.bias", "dense_3.weight")
HEAD_BIASES = tuple(n for n in HEAD_TENSORS if n.endswith(".bias"))
SOFTMAX_ARCHS = ("qwen3", "qwen3vl")  # build_pooling's softmax over the classifier's outputs
GELU_ARCHS = ("modern-bert",)  # GELU after `cls` rather than tanh


class PoolingHeadError(InferError, ValueError):
    """A pooling head whose tensors do not fit together."""


@dataclass(frozen=True, eq=False)
class PoolingHead:
    """The head's float32 weights, (out, in) as the GGUF's rows; None where the file has none."""

    cls: np.ndarray | None = None  # (C, n_embd): the classifier's dense layer (rank pooling)
    cls_b: np.ndarray | None = None  # (C,)
    cls_norm: np.ndarray | None = None  # (C,): LayerNorm weight after the activation
    cls_out: np.ndarray | None = None  # (n_cls_out, C or n_embd): the scores
    cls_out_b: np.ndarray | None = None  # (n_cls_out,)
    dense_2: np.ndarray | None = None  # (F2, n_embd): after pooling, whatever the pooling
    dense_2_b: np.ndarray | None = None  # (F2,)
    dense_3: np.ndarray | None = None  # (F3, F2 or n_embd)
    norm_eps: float = 1e-5  # cls_norm's epsilon (the model's layer_norm_epsilon)
    gelu: bool = False  # GELU (tanh approximation, ggml_gelu) after cls rather than tanh
    softmax: bool = False  # a softmax over the scores (qwen3)

    @property
    def ranks(self) -> bool:
        """Whether the file has a classification head for rank pooling."""
        return self.cls is not None or self.cls_out is not None

    def out_dim(self, n_embd: int, rank: bool) -> int:
        """The length of the vector an embedding leaves the head with (rank: through the classifier)."""
        n = n_embd
        if rank:
            n = self.cls_out.shape[0] if self.cls_out is not None else self.cls.shape[0] if self.cls is not None else n
        n = self.dense_2.shape[0] if self.dense_2 is not None else n
        return self.dense_3.shape[0] if self.dense_3 is not None else n


def load_head(tensors: Mapping[str, Any], path: Path | str, cfg: ModelConfig) -> PoolingHead | None:
    """The model's pooling head from its tensors (None: it has none), shapes checked against each other."""
    if not any(n in tensors for n in HEAD_TENSORS):
        return None

    def f32(name: str) -> np.ndarray | None:
        t = tensors.get(name)
        if t is None:
            return None
        if isinstance(t, QTensor):
            a = t.dequantize()
        elif isinstance(t, AffineTensor):
            a = dequantize_affine(t)
        else:
            a = np.asarray(t)
        return np.asarray(a, np.float32)

    parts = {k: f32(n) for k, n in zip(("cls", "cls_b", "cls_norm", "cls_out", "cls_out_b", "dense_2", "dense_2_b",
                                        "dense_3"), HEAD_TENSORS)}

    def check(name: str, a: np.ndarray | None, shape: tuple[int, ...]) -> None:
        if a is not None and a.shape != shape:
            raise PoolingHeadError(f"{path}: tensor {name!r} has shape {a.shape}, expected {shape}")

    n = cfg.n_embd
    cls, cls_out, d2 = parts["cls"], parts["cls_out"], parts["dense_2"]
    if cls is not None:
        if cls.ndim != 2:
            raise PoolingHeadError(f"{path}: tensor 'cls.weight' must be a matrix, has shape {cls.shape}")
        check("cls.weight", cls, (cls.shape[0], n))
        n_cls = cls.shape[0]
    else:
        n_cls = n
    for name, part in (("cls.bias", "cls_b"), ("cls.norm.weight", "cls_norm")):
        if parts[part] is not None and cls is None:
            raise PoolingHeadError(f"{path}: tensor {name!r} without 'cls.weight'")
        check(name, parts[part], (n_cls,))
    if cls_out is not None:
        if cls_out.ndim != 2:
            raise PoolingHeadError(f"{path}: tensor 'cls.output.weight' must be a matrix, has shape {cls_out.shape}")
        check("cls.output.weight", cls_out, (cls_out.shape[0], n_cls))
    elif parts["cls_out_b"] is not None:
        raise PoolingHeadError(f"{path}: tensor 'cls.output.bias' without 'cls.output.weight'")
    if cls_out is not None:
        check("cls.output.bias", parts["cls_out_b"], (cls_out.shape[0],))
    n_dense = n
    if d2 is not None:
        if d2.ndim != 2:
            raise PoolingHeadError(f"{path}: tensor 'dense_2.weight' must be a matrix, has shape {d2.shape}")
        check("dense_2.weight", d2, (d2.shape[0], n))
        n_dense = d2.shape[0]
    elif parts["dense_2_b"] is not None:
        raise PoolingHeadError(f"{path}: tensor 'dense_2.bias' without 'dense_2.weight'")
    if d2 is not None:
        check("dense_2.bias", parts["dense_2_b"], (n_dense,))
    d3 = parts["dense_3"]
    if d3 is not None:
        if d3.ndim != 2:
            raise PoolingHeadError(f"{path}: tensor 'dense_3.weight' must be a matrix, has shape {d3.shape}")
        check("dense_3.weight", d3, (d3.shape[0], n_dense))
    return PoolingHead(**parts, norm_eps=cfg.norm_eps, gelu=cfg.arch in GELU_ARCHS,
                       softmax=cfg.arch in SOFTMAX_ARCHS)
