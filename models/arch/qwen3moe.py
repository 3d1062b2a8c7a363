"""Qwen3 MoE (Qwen3-30B-A3B, 235B-A22B): the qwen3 layer with a mixture of experts for its FFN: a
softmax router over expert_count experts, the top expert_used_count of them per token, their
weights renormalized to sum 1, each a SwiGLU FFN of expert_feed_forward_length."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import Kvs
from .hf_keys import generic_kvs, need
from .spec import Architecture


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """The converter's keys and, as its Qwen2MoeModel adds, each expert's width."""
    extra = generic_kvs(kv, hp, path)
    kv.u32("{arch}.expert_feed_forward_length", need(hp, "moe_intermediate_size", path))
    return extra


ARCHITECTURE = Architecture(
    name="qwen3moe",
    rope_neox=True,
    qk_norm="head",
    experts="always",
    hf_model_types=("qwen3_moe",),
    hf_class="Qwen3MoeForCausalLM",
    hf_kvs=hf_kvs,
    chat_template="chatml",
)
