"""Gemma 2: the Gemma layer (embeddings times sqrt(n_embd), GELU, norms before and after each block,
Q scaled before Q·K) without Q/K norms, with soft-capped attention scores and logits (50 and 30
unless the metadata says otherwise) and every other layer sliding-window (4096 unless set). The
27B scales Q by 1/sqrt(n_embd / n_head) rather than 1/sqrt(head_dim), as llama.cpp does."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..hf_files import Kvs
from .hf_keys import head_counts, need
from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    query_dim = n_embd // n_head if n_layer == 46 else head_dim  # 46 layers: the 27B
    return {"embed_scale": math.sqrt(n_embd), "attn_scale": 1.0 / math.sqrt(query_dim)}


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, Any]:
    """llama.cpp's Gemma2Model keys."""
    n_head, n_head_kv = head_counts(hp, path)
    kv.u32("{arch}.context_length", need(hp, "max_position_embeddings", path))
    kv.u32("{arch}.embedding_length", need(hp, "hidden_size", path))
    kv.u32("{arch}.block_count", need(hp, "num_hidden_layers", path))
    kv.u32("{arch}.feed_forward_length", need(hp, "intermediate_size", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", need(hp, "rms_norm_eps", path))
    kv.u32("{arch}.attention.key_length", need(hp, "head_dim", path))
    kv.u32("{arch}.attention.value_length", need(hp, "head_dim", path))
    kv.f32("{arch}.attn_logit_softcapping", need(hp, "attn_logit_softcapping", path))
    kv.f32("{arch}.final_logit_softcapping", need(hp, "final_logit_softcapping", path))
    kv.u32("{arch}.attention.sliding_window", need(hp, "sliding_window", path))
    return {}


def hf_config(cfg, has_qkv_bias: bool) -> dict[str, Any]:
    return dict(hidden_activation="gelu_pytorch_tanh", head_dim=cfg.head_dim, sliding_window=cfg.sliding_window,
                query_pre_attn_scalar=round(cfg.attn_scale ** -2), attn_logit_softcapping=cfg.attn_logit_softcap,
                final_logit_softcapping=cfg.final_logit_softcap)


ARCHITECTURE = Architecture(
    name="gemma2",
    rope_neox=True,
    hf_model_types=("gemma2",),
    hf_class="Gemma2ForCausalLM",
    post_norms=True,
    activation="gelu",
    swa_pattern=2,
    default_sliding_window=4096,
    swa_rope_base=None,
    swa_rope_scaled=True,
    prescale_q=True,
    default_softcaps=(30.0, 50.0),
    scalars=scalars,
    hf_norm_shift=True,
    hf_tied_default=True,
    hf_spm=True,
    hf_space_prefix=False,
    hf_kvs=hf_kvs,
    hf_config=hf_config,
    hf_bfloat16=True,
    chat_template="gemma",
)
