"""Qwen3 MoE (Qwen3-30B-A3B, 235B-A22B): the qwen3 layer with a mixture of experts for its FFN: a
softmax router over expert_count experts, the top expert_used_count of them per token, their
weights renormalized to sum 1, each a SwiGLU FFN of expert_feed_forward_length."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="qwen3moe",
    rope_neox=True,
    qk_norm="head",
    experts="always",
    chat_template="chatml",
)
