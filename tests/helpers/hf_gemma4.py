"""A tiny Gemma 4 Hugging Face folder made from tests/helpers/tiny_models.py's tiny gemma4 GGUF (its
float32 variant): the same weights under the checkpoint's names, a config.json with the keys
llama.cpp's Gemma4 converter reads, and a tokenizer.json of the same tokens, so that converting the
folder must give back that GGUF's tensors and hyperparameters (the MoE variant's experts as
26B-A4B's checkpoint stores them)."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from helpers.hf_models import write_safetensors

# GGUF tensor name (after blk.N.) -> the checkpoint's (after model.layers.N.)
_LAYER = {"attn_norm": "input_layernorm.weight", "attn_q": "self_attn.q_proj.weight",
          "attn_k": "self_attn.k_proj.weight", "attn_v": "self_attn.v_proj.weight",
          "attn_output": "self_attn.o_proj.weight", "attn_q_norm": "self_attn.q_norm.weight",
          "attn_k_norm": "self_attn.k_norm.weight", "post_attention_norm": "post_attention_layernorm.weight",
          "ffn_norm": "pre_feedforward_layernorm.weight", "post_ffw_norm": "post_feedforward_layernorm.weight",
          "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight",
          "layer_output_scale": "layer_scalar", "inp_gate": "per_layer_input_gate.weight",
          "proj": "per_layer_projection.weight", "post_norm": "post_per_layer_input_norm.weight",
          # 26B-A4B's experts: the router, its two scales and the fused expert matrices are bare
          # parameters in the checkpoint (no .weight)
          "ffn_gate_inp": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
          "ffn_down_exps.scale": "router.per_expert_scale", "ffn_gate_up_exps": "experts.gate_up_proj",
          "ffn_down_exps": "experts.down_proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2.weight",
          "post_ffw_norm_1": "post_feedforward_layernorm_1.weight",
          "post_ffw_norm_2": "post_feedforward_layernorm_2.weight"}
_GLOBAL = {"token_embd": "embed_tokens.weight", "output_norm": "norm.weight",
           "per_layer_token_embd": "embed_tokens_per_layer.weight",
           "per_layer_model_proj": "per_layer_model_projection.weight",
           "per_layer_proj_norm": "per_layer_projection_norm.weight"}


def _field(r: gguf.GGUFReader, key: str):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def gemma4_folder(gguf_path: Path, folder: Path, multimodal: bool = False) -> None:
    """The HF folder of the tiny GGUF at gguf_path (multimodal: Gemma4ForConditionalGeneration's
    layout, text_config and model.language_model.* names, with a vision tensor the converter drops)."""
    r = gguf.GGUFReader(gguf_path)
    a = "gemma4."
    n_layer = _field(r, a + "block_count")
    swa = [bool(v) for v in _field(r, a + "attention.sliding_window_pattern")]
    kv_heads = _field(r, a + "attention.head_count_kv")
    n_ff = _field(r, a + "feed_forward_length")
    n_shared = _field(r, a + "attention.shared_kv_layers")
    head_full, head_swa = _field(r, a + "attention.key_length"), _field(r, a + "attention.key_length_swa")
    rope_freqs = next(np.asarray(t.data) for t in r.tensors if t.name == "rope_freqs.weight")
    text = {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"],
        "hidden_size": _field(r, a + "embedding_length"), "num_hidden_layers": n_layer,
        "intermediate_size": min(n_ff) if isinstance(n_ff, list) else n_ff,
        "use_double_wide_mlp": isinstance(n_ff, list),
        "num_attention_heads": _field(r, a + "attention.head_count"),
        "num_key_value_heads": next(k for k, s in zip(kv_heads, swa) if s),
        "num_global_key_value_heads": next(k for k, s in zip(kv_heads, swa) if not s),
        "head_dim": head_swa, "global_head_dim": head_full,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in swa],
        "sliding_window": _field(r, a + "attention.sliding_window"),
        "max_position_embeddings": _field(r, a + "context_length"),
        "rms_norm_eps": _field(r, a + "attention.layer_norm_rms_epsilon"),
        "final_logit_softcapping": _field(r, a + "final_logit_softcapping"),
        "num_kv_shared_layers": n_shared,
        "hidden_size_per_layer_input": _field(r, a + "embedding_length_per_layer_input"),
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "rope_theta": _field(r, a + "rope.freq_base"),
                               "partial_rotary_factor": float((rope_freqs == 1.0).sum() * 2 / head_full)},
            "sliding_attention": {"rope_type": "default", "rope_theta": _field(r, a + "rope.freq_base_swa")}},
        "vocab_size": len(_field(r, "tokenizer.ggml.tokens")), "tie_word_embeddings": True,
        "enable_moe_block": _field(r, a + "expert_count") is not None,
        "num_experts": _field(r, a + "expert_count"), "top_k_experts": _field(r, a + "expert_used_count"),
        "moe_intermediate_size": _field(r, a + "expert_feed_forward_length"),
    }
    config = text if not multimodal else {
        "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
        "vision_config": {"model_type": "gemma4_vision"}}
    prefix = "model.language_model." if multimodal else "model."
    tensors = {}
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            continue  # the converter makes it from rope_parameters
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        data = np.asarray(t.data, dtype=np.float32).reshape(shape)
        base = t.name.removesuffix(".weight")
        if base.startswith("blk."):
            _, il, kind = base.split(".", 2)
            name = f"{prefix}layers.{il}.{_LAYER[kind]}"
        else:
            name = prefix + _GLOBAL[base]
        tensors[name] = (data, "F32")
    if multimodal:
        tensors["model.vision_tower.patch_embedder.weight"] = (np.zeros((4, 4), np.float32), "F32")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", tensors)
    tokens = _field(r, "tokenizer.ggml.tokens")
    special = [0, 1, 2]  # <unk>, <s>, </s>
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "added_tokens": [{"id": i, "content": tokens[i], "special": True} for i in special],
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [["▁a", "a"], ["▁b", "a"]],  # pairs as newer tokenizers store them
                  "byte_fallback": True},
        "decoder": {"type": "Sequence", "decoders": []}}))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": tokens[1], "eos_token": tokens[2], "unk_token": tokens[0], "add_bos_token": True}))
