"""Embeddings: how one prompt's final hidden states become one vector, as llama.cpp pools them.

The hidden state of a token is the model's output norm ("result_norm", what llama.cpp returns as
the embedding of a token); a prompt's embedding pools them: "mean" averages every token's, "cls"
takes the first token's, "last" the last one's.  The GGUF's <arch>.pooling_type says which (an
embedding model's converter writes it); a file that says nothing is pooled by --pooling, by
default "mean" (what ollama and sentence-transformers do for a model without a pooling head).
"rank" (a reranker's) takes one row, the last where attention is causal (Qwen3-Reranker), else
the first (the mean where the file's classifier.pooling_type says so), and runs it through the
model's classification head: its output's first element is the score.  The model's pooling head
(models/pooling_head.py) is applied here, after the pooling (apply_head, as llama.cpp's
build_pooling and build_dense_out).  Vectors leave the engine so; the APIs normalize them
(normalize(): L2, llama.cpp's server default) where their clients expect unit vectors.
"""
from __future__ import annotations

import math

import numpy as np

from infer.models.pooling_head import PoolingHead
from infer.quant.errors import InferError

POOLINGS = ("mean", "cls", "last", "rank")
DEFAULT_POOLING = "mean"


class PoolingError(InferError, ValueError):
    """A pooling infer does not run, or a model/backend that cannot embed."""


def choose_pooling(model_pooling: str, flag: str = "") -> str:
    """--pooling when given (as llama.cpp's flag, it overrides the file), else the file's, else mean.
    Whether the model can rank is the engine's check (it knows the head)."""
    if flag and flag not in POOLINGS:
        raise PoolingError(f"--pooling takes {', '.join(POOLINGS)}, got {flag!r}")
    return flag or model_pooling or DEFAULT_POOLING


class Pooler:
    """One prompt's pooled hidden state, built chunk by chunk as prefill computes them.

    Positions are taken in order and at most once: a sequence that is preempted and computed
    again from the start contributes each position a single time."""

    def __init__(self, kind: str, n_tokens: int, n_embd: int):
        self.kind, self.n_tokens = kind, n_tokens
        self.sum = np.zeros(n_embd, np.float64)  # (n_embd,): mean's running sum, else the chosen row
        self.seen = 0  # positions < seen are pooled already

    def wanted(self, start: int, n: int) -> tuple[int, int]:
        """The positions [lo, hi) of a chunk start..start+n whose hidden states this pooling takes."""
        end = start + n
        if self.kind == "mean":
            lo = max(start, self.seen)
            return lo, max(lo, end)
        at = 0 if self.kind == "cls" else self.n_tokens - 1
        return (at, at + 1) if start <= at < end and self.seen <= at else (0, 0)

    def add(self, rows: np.ndarray, hi: int) -> None:
        """rows: (k, n_embd) hidden states of positions [hi - k, hi)."""
        if len(rows):
            if self.kind == "mean":
                self.sum += rows.sum(axis=0, dtype=np.float64)
            else:
                self.sum[:] = rows[-1]
            self.seen = hi

    @property
    def done(self) -> bool:
        return self.seen >= (1 if self.kind == "cls" else self.n_tokens)

    def vector(self) -> np.ndarray:
        """(n_embd,) float32: the pooled, not normalized, embedding."""
        v = self.sum / self.n_tokens if self.kind == "mean" else self.sum
        return v.astype(np.float32)


def row_pooling(kind: str, causal: bool, pooling_cls: str = "") -> str:
    """The rows a pooling takes, as Pooler runs them: rank pooling's (llama.cpp's inp_cls picks
    the last token under causal attention, the first otherwise; pooling_type_cls mean: the mean)."""
    if kind != "rank":
        return kind
    return "mean" if pooling_cls == "mean" else "last" if causal else "cls"


def apply_head(head: PoolingHead | None, kind: str, v: np.ndarray) -> np.ndarray:
    """v (n_embd,) pooled, through the model's head: the classifier under rank pooling, then the
    Dense projections whatever the pooling (float32 products of the dequantized weights)."""
    if head is None:
        return v
    x = v.astype(np.float32)
    if kind == "rank":
        if head.cls is not None:
            x = head.cls @ x
            if head.cls_b is not None:
                x = x + head.cls_b
            if head.gelu:  # ggml_gelu: the tanh approximation
                x = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
            else:
                x = np.tanh(x)
            if head.cls_norm is not None:  # llama.cpp's LLM_NORM: a LayerNorm, its weight only
                x = (x - x.mean()) / np.sqrt(x.var() + head.norm_eps) * head.cls_norm
        if head.cls_out is not None:
            x = head.cls_out @ x
            if head.cls_out_b is not None:
                x = x + head.cls_out_b
        if head.softmax:
            e = np.exp(x.astype(np.float64) - x.max())
            x = e / e.sum()
    if head.dense_2 is not None:
        x = head.dense_2 @ x
        if head.dense_2_b is not None:
            x = x + head.dense_2_b
    if head.dense_3 is not None:
        x = head.dense_3 @ x
    return np.asarray(x, np.float32)


def normalize(v: np.ndarray) -> np.ndarray:
    """v / ||v||_2 (a zero vector stays zero), as llama.cpp's common_embd_normalize with its default 2."""
    norm = float(np.sqrt(np.dot(v.astype(np.float64), v.astype(np.float64))))
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)
