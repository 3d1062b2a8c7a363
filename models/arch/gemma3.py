"""Gemma 3 (text): embeddings scaled by sqrt(n_embd), GELU, per-head Q/K norms, norms after
attention and after the FFN as well as before, Q scaled before Q·K (the 27B by 1/sqrt(n_embd /
n_head), the others by 1/sqrt(head_dim)), and five sliding-window layers for each global one
(their own RoPE base). HF stores its norm weights as w - 1; the multimodal
checkpoints wrap the text model (text_config, language_model.* names) beside a vision tower that
llama.cpp converts to a separate file."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from .hf_keys import head_counts, need, rope_scaling, rope_theta
from .spec import Architecture


def scalars(get, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    query_dim = n_embd // n_head if n_layer == 62 else head_dim  # 62 layers: the 27B, as llama.cpp
    return {"embed_scale": math.sqrt(n_embd), "attn_scale": 1.0 / math.sqrt(query_dim)}


def hf_text_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's hyperparameters of a multimodal checkpoint (in text_config)."""
    if not isinstance(config.get("text_config"), dict):
        return dict(config)
    hp = dict(config["text_config"])
    hp.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
    return hp


def hf_text_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model, or None for the vision tower's."""
    if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector.")):
        return None  # the vision part goes to llama.cpp's separate mmproj file
    # Gemma3ForConditionalGeneration names: language_model.model.* (older) or model.language_model.*
    name = name.replace("language_model.model.", "model.").replace("model.language_model.", "model.")
    return name.replace("language_model.lm_head.", "lm_head.")


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, Any]:
    """Gemma 3 configs leave some fields at their transformers defaults, which llama.cpp also assumes."""
    n_head, n_head_kv = head_counts(hp, path)
    head_dim = int(hp.get("head_dim", 256))
    kv.u32("{arch}.context_length", hp.get("max_position_embeddings", 131072))
    kv.u32("{arch}.embedding_length", need(hp, "hidden_size", path))
    kv.u32("{arch}.block_count", need(hp, "num_hidden_layers", path))
    kv.u32("{arch}.feed_forward_length", need(hp, "intermediate_size", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", hp.get("rms_norm_eps", 1e-6))
    kv.u32("{arch}.attention.key_length", head_dim)
    kv.u32("{arch}.attention.value_length", head_dim)
    kv.f32("{arch}.rope.freq_base", rope_theta(hp, 1_000_000.0))
    if hp.get("rope_local_base_freq") is not None:
        kv.f32("{arch}.rope.freq_base_swa", hp["rope_local_base_freq"])
    kv.u32("{arch}.attention.sliding_window", need(hp, "sliding_window", path))
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hp.get(key) is not None:
            kv.f32("{arch}." + key, hp[key])
    rs = rope_scaling(hp)
    if rs is not None:
        if rs["rope_type"] != "linear":
            raise ConvertError(f"{path}: gemma3 RoPE scaling {rs['rope_type']!r} is not supported (linear only)")
        kv.add("{arch}.rope.scaling.type", VT.STRING, "linear")
        kv.f32("{arch}.rope.scaling.factor", rs["factor"])
    return {}


def hf_config(cfg, has_qkv_bias: bool) -> dict[str, Any]:
    return dict(
        hidden_activation="gelu_pytorch_tanh", rope_local_base_freq=cfg.rope_base_swa,
        sliding_window=cfg.sliding_window, sliding_window_pattern=cfg.architecture.swa_pattern,
        query_pre_attn_scalar=round(cfg.attn_scale ** -2),
        final_logit_softcapping=cfg.final_logit_softcap or None,
        attn_logit_softcapping=cfg.attn_logit_softcap or None,
    )


ARCHITECTURE = Architecture(
    name="gemma3",
    rope_neox=True,
    hf_model_types=("gemma3", "gemma3_text"),
    hf_class="Gemma3ForCausalLM",
    hf_export_type="gemma3_text",
    qk_norm="head",
    post_norms=True,
    activation="gelu",
    swa_pattern=6,
    prescale_q=True,
    scalars=scalars,
    hf_norm_shift=True,
    hf_tied_default=True,
    hf_spm=True,
    hf_space_prefix=False,
    hf_text_hparams=hf_text_hparams,
    hf_text_name=hf_text_name,
    hf_trim_embeddings=True,
    hf_kvs=hf_kvs,
    hf_config=hf_config,
    hf_bfloat16=True,
    chat_template="gemma",
)
