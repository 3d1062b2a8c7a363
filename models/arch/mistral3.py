"""Mistral 3 as llama.cpp converts it (Ministral 3, Mistral Small 3.1/3.2, Devstral: arch mistral3):
the llama layer (RoPE on adjacent pairs, optional experts) with Llama 4's attention temperature:
where the file has attention.temperature_scale, Q after RoPE is multiplied at position p by
log(floor(p / n_ctx_orig) + 1) * scale + 1, n_ctx_orig the YaRN original context (llama.cpp's
mistral3.cpp: n_attn_temp_floor_scale, no offset). Its YaRN also reads beta_fast, beta_slow and
yarn_log_multiplier. HF checkpoints are Mistral3ForConditionalGeneration (the text model in
text_config and under language_model, beside a vision tower llama.cpp converts to a separate file)
or Ministral3ForCausalLM."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import ConvertError, Kvs
from .gemma3 import hf_text_name
from .hf_keys import generic_kvs, rope_scaling
from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for field, key in (("yarn_beta_fast", "rope.scaling.yarn_beta_fast"), ("yarn_beta_slow", "rope.scaling.yarn_beta_slow"),
                       ("yarn_log_mul", "rope.scaling.yarn_log_multiplier")):
        if get(key, None) is not None:
            out[field] = float(get(key, None))
    temp = float(get("attention.temperature_scale", 0.0) or 0.0)
    if temp:  # the floor is the YaRN original context, which defaults to the training context
        out["attn_temp_scale"] = temp
        out["attn_temp_floor_scale"] = float(get("rope.scaling.original_context_length", get("context_length", 0)) or 0)
    return out


def hf_text_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's hyperparameters: text_config over the top level, as llama.cpp's converter
    merges them."""
    if not isinstance(config.get("text_config"), dict):
        return dict(config)
    return {**config, **config["text_config"]}


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """llama's keys, YaRN's betas (the converter's TextModel writes them), and Ministral 3's YaRN
    log multiplier and attention temperature (its Ministral3Model: mscale_all_dim, llama_4_scaling_beta)."""
    extra = generic_kvs(kv, hp, path, llama=True)
    rs = rope_scaling(hp)
    if rs is not None and rs["rope_type"] == "yarn":
        for key, name in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if rs.get(key) is not None:
                kv.f32("{arch}.rope.scaling." + name, rs[key])
        if hp.get("model_type") == "ministral3":
            for key in ("mscale_all_dim", "llama_4_scaling_beta"):
                if rs.get(key) is None:
                    raise ConvertError(f"{path}: ministral3 rope_parameters has no {key}")
            kv.f32("{arch}.rope.scaling.yarn_log_multiplier", rs["mscale_all_dim"])
            kv.f32("{arch}.attention.temperature_scale", rs["llama_4_scaling_beta"])
    return extra


def hf_config(cfg, has_qkv_bias: bool) -> dict[str, Any]:
    """An MLX export's config.json: YaRN with its betas, and Ministral 3's log multiplier and
    temperature under its own model_type (which the converter reads them by)."""
    out: dict[str, Any] = {"attention_bias": has_qkv_bias, "mlp_bias": False}
    if cfg.rope_ext_factor:
        rs = {"rope_type": "yarn", "type": "yarn", "factor": 1.0 / cfg.rope_scale,
              "original_max_position_embeddings": cfg.n_ctx_orig, "beta_fast": cfg.yarn_beta_fast,
              "beta_slow": cfg.yarn_beta_slow}
        if cfg.attn_temp_scale:
            rs.update(mscale_all_dim=cfg.yarn_log_mul, llama_4_scaling_beta=cfg.attn_temp_scale)
            out["model_type"] = "ministral3"
        out["rope_scaling"] = rs
    return out


ARCHITECTURE = Architecture(
    name="mistral3",
    rope_neox=False,
    hf_model_types=("mistral3", "ministral3"),
    hf_class="Mistral3ForConditionalGeneration",
    experts="optional",
    scalars=scalars,
    hf_permute_qk=True,
    hf_spm=True,
    hf_kvs=hf_kvs,
    hf_text_hparams=hf_text_hparams,
    hf_text_name=hf_text_name,
    hf_config=hf_config,
)
