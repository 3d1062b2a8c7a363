"""gpt-oss (OpenAI's gpt-oss-20b and -120b; llama.cpp's LLM_ARCH_OPENAI_MOE): a mixture of experts
whose quirks are all here:
- attention: Q/K/V and output biases, a learned sink logit per head that joins every softmax
  (attention can go "nowhere"), every other layer a sliding window (the even ones: 128 tokens),
  YaRN RoPE on all layers (the metadata's scaling, config.py);
- the pre-FFN norm is stored as post_attention_norm;
- the router has a bias and picks the top logits before a softmax over those alone
  (SOFTMAX_WEIGHT), and each expert's three products have biases;
- the experts' activation is swiglu_oai: min(gate, 7) * sigmoid(1.702 * min(gate, 7)) *
  (clamp(up, -7, 7) + 1).
Its released GGUFs keep the experts in MXFP4. Its chat format (harmony: analysis and final
channels) is handled by the engine's reasoning parser."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="gpt-oss",
    rope_neox=True,
    experts="always",
    moe_norm_weights=False,
    moe_gating="softmax_weight",
    activation="swiglu_oai",
    attn_sinks=True,
    extra_biases=("attn_output.bias", "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias",
                  "ffn_down_exps.bias"),
    ffn_norm_tensor="post_attention_norm",
    swa_pattern=2,
    default_sliding_window=128,
    swa_rope_base=None,
    swa_rope_scaled=True,
)
