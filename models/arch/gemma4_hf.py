"""Gemma 4's Hugging Face checkpoints (Gemma4ForCausalLM, and the text model of
Gemma4ForConditionalGeneration) -> the GGUF keys and tensors llama.cpp's converter writes (its
Gemma4Model, on Gemma3Model's keys):
- the kinds of layer from layer_types (attention.sliding_window_pattern, a flag per layer), each
  kind with its head size (global_head_dim -> key_length, head_dim -> key_length_swa), KV heads
  (num_global_key_value_heads / num_key_value_heads -> a head_count_kv per layer) and rotated dims
  (rope.dimension_count: the global head; rope.dimension_count_swa: head_dim times
  rope_parameters' top-level partial_rotary_factor, as the converter reads it);
- use_double_wide_mlp: a feed_forward_length per layer, the shared-KV layers' twice as wide;
- num_kv_shared_layers, hidden_size_per_layer_input;
- rope_freqs for the global layers' proportional RoPE: 1 for the rotated pairs, 1e30 for the rest;
- norm weights as they are (unlike Gemma 3, no w - 1 in the checkpoint); layer_scalar named
  layer_output_scale.weight;
- 26B-A4B's experts (num_experts -> expert_count, top_k_experts -> expert_used_count,
  moe_intermediate_size -> expert_feed_forward_length): router.proj the router, router.scale its
  input's scale (ffn_gate_inp.scale), router.per_expert_scale each expert's output scale
  (ffn_down_exps.scale), experts.gate_up_proj (experts, 2 * ff, embd) and experts.down_proj
  (experts, embd, ff) as they are (ffn_gate_up_exps, ffn_down_exps: neither split nor transposed),
  the branches' norms (pre_feedforward_layernorm_2, post_feedforward_layernorm_1 / _2) by gguf's
  names.
The vocabulary: models/hf_vocab.py's gemma4_vocab."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from .hf_keys import need

_OTHER_TOWERS = ("vision_tower.", "multi_modal_projector.", "audio_tower.", "embed_vision.", "embed_audio.")


def hf_text_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model, or None for the vision and audio towers'."""
    bare = name.removeprefix("model.")
    if bare.startswith(_OTHER_TOWERS):
        return None  # llama.cpp writes those to its separate mmproj file
    name = name.replace("model.language_model.", "model.")
    # bare parameters: the converter names them .weight (its filter_tensors), and writes the
    # router's two scales under the router's and the experts' down matrices' names, as .scale
    # (its modify_tensors)
    if name.endswith(("layer_scalar", ".experts.gate_up_proj", ".experts.down_proj")):
        name += ".weight"
    elif name.endswith(".router.scale"):
        name = name.removesuffix(".scale") + ".proj.scale"
    elif name.endswith(".router.per_expert_scale"):
        name = name.removesuffix(".router.per_expert_scale") + ".experts.down_proj.scale"
    return name


def _layer_types(hp: dict[str, Any], path: Path) -> list[bool]:
    types = need(hp, "layer_types", path)
    n_layer = int(need(hp, "num_hidden_layers", path))
    if not isinstance(types, list) or len(types) != n_layer or any(
            t not in ("sliding_attention", "full_attention") for t in types):
        raise ConvertError(f"{path}: layer_types must name sliding_attention or full_attention for each of the "
                           f"{n_layer} layers")
    return [t == "sliding_attention" for t in types]


def _global(hp: dict[str, Any], key: str, per_layer_key: str, swa: list[bool]) -> Any:
    """A global layer's value: its own config key, else the first global layer's per_layer_config."""
    if hp.get(key) is not None:
        return hp[key]
    per_layer = hp.get("per_layer_config")
    if isinstance(per_layer, dict):
        for il, cfg in per_layer.items():
            if str(il).isdecimal() and int(il) < len(swa) and not swa[int(il)] and isinstance(cfg, dict) \
                    and per_layer_key in cfg:
                return cfg[per_layer_key]
    return None


def _int(value: Any, key: str, path: Path, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 1 << 32:
        raise ConvertError(f"{path}: {key} {str(value)[:40]!r} is not an integer of at least {low}")
    return value


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, Any]:
    if hp.get("enable_moe_block") and not hp.get("num_experts"):
        raise ConvertError(f"{path}: enable_moe_block is set but num_experts is not")
    if hp.get("attn_logit_softcapping") is not None:
        raise ConvertError(f"{path}: attn_logit_softcapping is set; Gemma 4 (as llama.cpp's converter) has none")
    swa = _layer_types(hp, path)
    n_layer = len(swa)
    rope = hp.get("rope_parameters") if isinstance(hp.get("rope_parameters"), dict) else {}
    full, local = rope.get("full_attention"), rope.get("sliding_attention")
    if not isinstance(full, dict) or full.get("rope_type") != "proportional":
        raise ConvertError(f"{path}: rope_parameters.full_attention must be Gemma 4's proportional RoPE")
    head_full = _int(_global(hp, "global_head_dim", "head_dim", swa), "global_head_dim", path)
    head_swa = _int(need(hp, "head_dim", path), "head_dim", path)
    n_shared = _int(hp.get("num_kv_shared_layers", 0), "num_kv_shared_layers", path, 0)
    n_ff = _int(need(hp, "intermediate_size", path), "intermediate_size", path)
    # Gemma3Model's keys (TextModel's, then its own defaults), in its order
    kv.u32("{arch}.block_count", n_layer)
    kv.u32("{arch}.context_length", hp.get("max_position_embeddings", 131072))
    kv.u32("{arch}.embedding_length", need(hp, "hidden_size", path))
    if hp.get("use_double_wide_mlp"):
        kv.add("{arch}.feed_forward_length", VT.ARRAY, np.asarray(
            [n_ff if il < n_layer - n_shared else 2 * n_ff for il in range(n_layer)], dtype=np.int32))
    else:
        kv.u32("{arch}.feed_forward_length", n_ff)
    kv.u32("{arch}.attention.head_count", hp.get("num_attention_heads", 8))
    kv.f32("{arch}.rope.freq_base", full.get("rope_theta", 1_000_000.0))
    if isinstance(local, dict) and local.get("rope_theta") is not None:
        kv.f32("{arch}.rope.freq_base_swa", local["rope_theta"])
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", hp.get("rms_norm_eps", 1e-6))
    if hp.get("final_logit_softcapping"):
        kv.f32("{arch}.final_logit_softcapping", hp["final_logit_softcapping"])
    kv.u32("{arch}.attention.sliding_window", need(hp, "sliding_window", path))
    n_kv_full = _global(hp, "num_global_key_value_heads", "num_key_value_heads", swa)
    n_kv_swa = hp.get("num_key_value_heads")
    if n_kv_full is not None and n_kv_swa is not None:
        kv.add("{arch}.attention.head_count_kv", VT.ARRAY, np.asarray(
            [_int(n_kv_swa if s else n_kv_full, "num_key_value_heads", path) for s in swa], dtype=np.int32))
    else:
        kv.u32("{arch}.attention.head_count_kv", n_kv_swa if n_kv_swa is not None else 4)
    if hp.get("num_experts"):  # TextModel's expert keys, then Gemma4Model's expert width
        n_expert = _int(hp["num_experts"], "num_experts", path)
        kv.u32("{arch}.expert_count", n_expert)
        kv.u32("{arch}.expert_used_count", _int(need(hp, "top_k_experts", path), "top_k_experts", path))
        if not hp["top_k_experts"] <= n_expert:
            raise ConvertError(f"{path}: top_k_experts {hp['top_k_experts']} is more than num_experts {n_expert}")
        n_ff_exp = hp.get("expert_intermediate_size", hp.get("moe_intermediate_size"))
        kv.u32("{arch}.expert_feed_forward_length", _int(n_ff_exp, "moe_intermediate_size", path))
    # Gemma4Model's
    kv.u32("{arch}.attention.shared_kv_layers", n_shared)
    kv.u32("{arch}.embedding_length_per_layer_input", hp.get("hidden_size_per_layer_input") or 0)
    kv.add("{arch}.attention.sliding_window_pattern", VT.ARRAY, np.asarray(swa, dtype=np.bool_))
    for key, value in (("key_length", head_full), ("value_length", head_full), ("key_length_swa", head_swa),
                       ("value_length_swa", head_swa)):
        kv.u32("{arch}.attention." + key, value)
    kv.u32("{arch}.rope.dimension_count", head_full)
    kv.u32("{arch}.rope.dimension_count_swa", int(head_swa * float(rope.get("partial_rotary_factor", 1.0))))
    factor = full.get("partial_rotary_factor")
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConvertError(f"{path}: rope_parameters.full_attention.partial_rotary_factor {factor!r} is not in (0, 1]")
    n_rot = int(head_full * factor / 2)
    return {"rope_freqs.weight": np.asarray([1.0] * n_rot + [1e30] * (head_full // 2 - n_rot), dtype=np.float32)}
