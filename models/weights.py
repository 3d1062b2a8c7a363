"""A model's weights as the backends take them, checked against what its configuration needs:
the one description of a model's tensors for GGUF files and model folders alike."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infer.quant.affine import AffineTensor
from infer.quant.tensor import QTensor
from infer.quant.types import F32

from .config import ModelConfig


class ModelLoadError(ValueError):
    """A model file that cannot be run; the message names the file and the problem."""


# A weight matrix: GGML blocks (GGUF files; F16/F32/BF16 for dense MLX-folder matrices) or MLX's
# affine format (quantized MLX folders).
Matrix = QTensor | AffineTensor


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    post_attn_norm: np.ndarray | None
    ffn_norm: np.ndarray
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix
    post_ffn_norm: np.ndarray | None


@dataclass(frozen=True)
class ModelWeights:
    token_embd: Matrix
    output_norm: np.ndarray
    output: Matrix  # token_embd itself when the embeddings are tied
    rope_freqs: np.ndarray | None
    layers: tuple[LayerWeights, ...]


@dataclass(frozen=True, eq=False)
class Model:
    path: Path
    config: ModelConfig
    metadata: dict[str, Any]
    weights: ModelWeights
    format: str = "gguf"  # "gguf", or "mlx" for an MLX-format folder (affine-quantized safetensors)


def collect_weights(tensors: Mapping[str, Matrix | np.ndarray], path: Path | str, cfg: ModelConfig) -> ModelWeights:
    """The weights `cfg` needs, by GGUF name, shapes checked. Matrices are QTensor or AffineTensor;
    vectors QTensor or float32 arrays."""

    def get(name: str, shape: tuple[int, ...] | None, required: bool = True) -> Any:
        t = tensors.get(name)
        if t is None:
            if required:
                raise ModelLoadError(f"{path}: missing tensor {name!r} for architecture {cfg.arch}")
            return None
        if shape is not None and tuple(t.shape) != shape:
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t

    def vec(name: str, n: int, required: bool = True) -> np.ndarray | None:
        t = get(name, (n,), required)
        if t is None or isinstance(t, np.ndarray):
            return t
        if isinstance(t, AffineTensor):
            raise ModelLoadError(f"{path}: tensor {name!r} is a vector and cannot be affine-quantized")
        # Norm weights and biases are small: keep them as float32 (a copy only if not F32 already).
        return t.raw.view(np.float32).reshape(n) if t.type_id == F32 else t.dequantize().reshape(n)

    D, F = cfg.n_embd, cfg.n_ff
    q_dim, kv_dim, v_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    fl = cfg.flags
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", D),
            wq=get(p + "attn_q.weight", (q_dim, D)),
            wk=get(p + "attn_k.weight", (kv_dim, D)),
            wv=get(p + "attn_v.weight", (v_dim, D)),
            wo=get(p + "attn_output.weight", (D, cfg.n_head * cfg.head_dim_v)),
            bq=vec(p + "attn_q.bias", q_dim, required=False),
            bk=vec(p + "attn_k.bias", kv_dim, required=False),
            bv=vec(p + "attn_v.bias", v_dim, required=False),
            q_norm=vec(p + "attn_q_norm.weight", cfg.head_dim, required=fl.qk_norm),
            k_norm=vec(p + "attn_k_norm.weight", cfg.head_dim, required=fl.qk_norm),
            post_attn_norm=vec(p + "post_attention_norm.weight", D, required=fl.post_norms),
            ffn_norm=vec(p + "ffn_norm.weight", D),
            w_gate=get(p + "ffn_gate.weight", (F, D)),
            w_up=get(p + "ffn_up.weight", (F, D)),
            w_down=get(p + "ffn_down.weight", (D, F)),
            post_ffn_norm=vec(p + "post_ffw_norm.weight", D, required=fl.post_norms),
        ))
    token_embd = get("token_embd.weight", (cfg.n_vocab, D))
    output = get("output.weight", (cfg.n_vocab, D), required=False)
    if output is None:
        output = token_embd
    return ModelWeights(
        token_embd=token_embd,
        output_norm=vec("output_norm.weight", D),
        output=output,
        rope_freqs=vec("rope_freqs.weight", cfg.n_rot // 2, required=False),
        layers=tuple(layers),
    )
