"""Llama (and the many models that share its GGUF layout: Mistral, Mixtral's mixture of experts,
SmolLM, DeepSeek-R1 Llama distills): the plain pre-norm decoder, RoPE on adjacent pairs (GGUF's Q/K row order; HF's is
rotate-half, so the converter interleaves each head's rows)."""
from __future__ import annotations

from functools import partial

from .hf_keys import generic_kvs
from .spec import Architecture

ARCHITECTURE = Architecture(
    name="llama",
    rope_neox=False,
    hf_model_types=("llama", "mixtral"),
    hf_class="LlamaForCausalLM",
    experts="optional",  # Mixtral: expert_count, ffn_gate_inp and ffn_{gate,up,down}_exps
    hf_permute_qk=True,
    hf_spm=True,
    hf_kvs=partial(generic_kvs, llama=True),
    hf_config=lambda cfg, has_qkv_bias: {"attention_bias": has_qkv_bias, "mlp_bias": False},
    chat_template="llama",
)
