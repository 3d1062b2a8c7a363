"""Qwen2 / Qwen2.5: the llama decoder with Q/K/V biases (optional tensors every architecture may
have) and RoPE on (x[i], x[i + d/2]) pairs."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="qwen2",
    rope_neox=True,
    hf_model_types=("qwen2",),
    hf_class="Qwen2ForCausalLM",
    chat_template="chatml",
)
