"""IBM Granite 3.x (dense): the llama layer with four multipliers of its own, all from the metadata:
embeddings times embedding_scale, each block's output times residual_scale before the residual
add, Q·K times attention.scale (instead of 1/sqrt(head_dim)), and the logits divided by
logit_scale. An absent or zero embedding, residual or attention multiplier is 1 (attention:
1/sqrt(head_dim)), as in llama.cpp; logit_scale, which llama.cpp requires, is 1 when absent."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import Kvs
from .hf_keys import generic_kvs
from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    out: dict[str, float] = {}
    if float(get("embedding_scale", 0.0) or 0.0):
        out["embed_scale"] = float(get("embedding_scale", 0.0))
    if float(get("residual_scale", 0.0) or 0.0):
        out["residual_scale"] = float(get("residual_scale", 0.0))
    if float(get("attention.scale", 0.0) or 0.0):
        out["attn_scale"] = float(get("attention.scale", 0.0))
    logit_scale = float(get("logit_scale", 0.0) or 0.0)
    if logit_scale:
        # llama.cpp scales by 1.0f / f_logit_scale, computed in float32
        out["logit_scale"] = float(np.float32(1.0) / np.float32(logit_scale))
    return out


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """llama's keys (GraniteModel is a LlamaModel in llama.cpp's converter) and the multipliers."""
    extra = generic_kvs(kv, hp, path, llama=True)
    for key, hf in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                    ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
        if hp.get(hf) is not None:
            kv.f32("{arch}." + key, hp[hf])
    return extra


def hf_config(cfg, has_qkv_bias: bool) -> dict[str, Any]:
    return {"attention_bias": has_qkv_bias, "mlp_bias": False, "attention_multiplier": cfg.attn_scale,
            "embedding_multiplier": cfg.embed_scale, "residual_multiplier": cfg.residual_scale,
            "logits_scaling": float(np.float32(1.0) / np.float32(cfg.logit_scale))}


ARCHITECTURE = Architecture(
    name="granite",
    rope_neox=False,
    hf_model_types=("granite",),
    hf_class="GraniteForCausalLM",
    scalars=scalars,
    hf_permute_qk=True,
    hf_kvs=hf_kvs,
    hf_config=hf_config,
)
