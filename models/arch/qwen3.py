"""Qwen3 (dense): qwen2 without the biases, with an RMSNorm over each head of Q and K before RoPE."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="qwen3",
    rope_neox=True,
    hf_model_types=("qwen3",),
    hf_class="Qwen3ForCausalLM",
    qk_norm="head",
    hf_config=lambda cfg, has_qkv_bias: {"attention_bias": has_qkv_bias},
    chat_template="chatml",
)
