"""Llama 4 (Scout, Maverick; the text model of Llama4ForConditionalGeneration; llama.cpp's
LLM_ARCH_LLAMA4, src/models/llama4.cpp): llama's layer (RoPE on adjacent pairs, which HF's complex
rotary also uses, so Q/K rows are not permuted) with, as llama.cpp's load_arch_hparams sets them:
- every 4th layer (il + 1 divisible by 4) without RoPE and global; its Q multiplied by the
  attention temperature log(floor((pos + 1) / 8192) + 1) * 0.1 + 1 (1 below position 8191);
- the other layers with RoPE attend within chunks of 8192 positions (LLAMA_SWA_TYPE_CHUNKED:
  a token sees its own chunk's earlier tokens only), whatever attention.sliding_window says
  unless it is 0: then every layer is global and has RoPE but the last, no temperature (MobileLLM);
- on the layers with RoPE, Q and K of each head RMS-normalized without weight after RoPE
  (Llama4TextL2Norm), except in the 128-expert Maverick (llama.cpp's use_kq_norm);
- experts in every interleave_moe_layer_step-th layer, the others a dense FFN: a sigmoid router
  choosing by its logits, each chosen expert's input scaled by the sigmoid of its logit (the
  weight before the FFN), and a shared expert of the experts' width added as it is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import Kvs
from .hf_keys import generic_kvs, need
from .spec import Architecture

# llama.cpp's fixed chunk (n_swa) and temperature settings of Llama 4 (its GGUFs carry none of them)
CHUNK = 8192
TEMP_FLOOR_SCALE, TEMP_SCALE, TEMP_OFFSET = 8192, 0.1, 1.0
NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step
MAVERICK_EXPERTS = 128  # the model without the L2 norm of Q and K


def layer_plan(get, n_layer: int, n_expert: int, n_ff_exp: int) -> dict[str, Any]:
    """Which layers have RoPE and experts, the chunked attention and the temperature, from the
    raw metadata getter (as llama.cpp's llama_model_llama4::load_arch_hparams)."""
    if n_expert <= 0:
        raise ValueError("a llama4 model needs experts (expert_count)")
    step = get("interleave_moe_layer_step")
    if step is None or int(step) < 1:
        raise ValueError(f"interleave_moe_layer_step must be a positive number, got {step!r}")
    plan: dict[str, Any] = {"n_moe_layer_step": int(step), "n_ff_shexp": n_ff_exp,
                            "kq_l2_norm": n_expert != MAVERICK_EXPERTS}
    window = get("attention.sliding_window")
    if window is not None and int(window) == 0:  # no chunks; llama.cpp's no-RoPE step becomes n_layer
        plan["layer_nope"] = tuple((il + 1) % n_layer == 0 for il in range(n_layer))
        return plan
    plan.update(sliding_window=CHUNK, chunked=True,
                layer_nope=tuple((il + 1) % NO_ROPE_STEP == 0 for il in range(n_layer)),
                attn_temp_scale=TEMP_SCALE, attn_temp_floor_scale=TEMP_FLOOR_SCALE, attn_temp_offset=TEMP_OFFSET)
    return plan


def hf_text_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's hyperparameters (Llama4ForConditionalGeneration nests them in text_config)."""
    hp = dict(config["text_config"]) if isinstance(config.get("text_config"), dict) else dict(config)
    hp.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return hp


def hf_text_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model, or None for the vision part (llama.cpp's mmproj)."""
    if name.startswith(("vision_model.", "multi_modal_projector.")):
        return None
    return name.removeprefix("language_model.")


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """llama.cpp's Llama4Model: LlamaModel's keys with intermediate_size_mlp as the dense FFN's width,
    intermediate_size as the experts' (and the shared expert's), the interleave step, and a window of
    0 (no chunks) where every layer_types entry is full attention (MobileLLM)."""
    experts_width = need(hp, "intermediate_size", path)
    extra = generic_kvs(kv, {**hp, "intermediate_size": need(hp, "intermediate_size_mlp", path)}, path, llama=True)
    kv.u32("{arch}.interleave_moe_layer_step", need(hp, "interleave_moe_layer_step", path))
    kv.u32("{arch}.expert_feed_forward_length", experts_width)
    types = hp.get("layer_types")
    if types and all(t == "full_attention" for t in types):
        kv.u32("{arch}.attention.sliding_window", 0)
    return extra


ARCHITECTURE = Architecture(
    name="llama4",
    rope_neox=False,
    experts="always",
    moe_norm_weights=False,
    moe_gating="sigmoid_logits",
    moe_weight_before=True,
    shared_expert="plain",
    swa_pattern=NO_ROPE_STEP,  # 3 chunked layers, then a global one (attention.sliding_window_pattern may say otherwise)
    default_sliding_window=CHUNK,
    swa_rope_base=None,
    swa_rope_scaled=True,
    layer_plan=layer_plan,
    attn_temp_nope_only=True,
    layer_plan_kind="every 4th layer global without RoPE (attention temperature), the others chunked attention "
                    "(chunks of 8192) with L2-normed Q/K, experts in every n-th layer",
    hf_model_types=("llama4", "llama4_text"),
    hf_class="Llama4ForCausalLM",
    hf_text_hparams=hf_text_hparams,
    hf_text_name=hf_text_name,
    hf_experts_transposed=True,
    hf_kvs=hf_kvs,
    chat_template="llama4",
)
