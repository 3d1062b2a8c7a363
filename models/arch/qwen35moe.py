"""Qwen3.5 MoE (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B; llama.cpp's LLM_ARCH_QWEN35MOE): as
src/models/qwen35moe.cpp builds it, Qwen3.5's layers (gated delta nets beside gated full attention,
qwen35.py) with a mixture of experts for the FFN: a softmax router over expert_count experts, the
top expert_used_count per token, their weights renormalized to sum 1 (build_moe_ffn), each a SwiGLU
FFN of expert_feed_forward_length; and beside them a shared expert, a SwiGLU FFN of
expert_shared_feed_forward_length over every token whose output, times
sigmoid(ffn_gate_inp_shexp · h), is added to the experts' sum (decoder.py's ffn_block).

The HF converter is Qwen3.5's (llama.cpp's Qwen3_5MoeTextModel differs from Qwen3_5TextModel only
in its GGUF architecture): the experts' keys and tensors are what its Qwen2MoeModel base makes of
mlp.gate, mlp.experts (one tensor per expert's matrix or transformers 5's fused gate_up_proj /
down_proj, models/convert_hf.py), mlp.shared_expert and mlp.shared_expert_gate."""
from __future__ import annotations

from dataclasses import replace

from . import qwen35

ARCHITECTURE = replace(
    qwen35.ARCHITECTURE,
    name="qwen35moe",
    experts="always",
    shared_expert="sigmoid",
    hf_model_types=("qwen3_5_moe_text", "qwen3_5_moe"),
    hf_class="Qwen3_5MoeForCausalLM",
)
