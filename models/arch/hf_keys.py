"""config.json hyperparameters -> the GGUF keys llama.cpp's converter (convert_hf_to_gguf.py) writes.

`generic_kvs` is its TextModel path, which most architectures take as is; an architecture module
adds its own keys after it, or (gemma3) writes its own set.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from ..limits import MAX_HEAD_DIM, MAX_LAYERS


def need(hp: dict[str, Any], key: str, path: Path) -> Any:
    if hp.get(key) is None:
        raise ConvertError(f"{path}: missing hyperparameter {key!r}")
    return hp[key]


# config.json keys read as numbers (by generic_kvs, the architectures' hf_kvs, the tensor loaders),
# checked once by check_hparams so that a hostile value is refused naming its key rather than
# failing some later int() / float(), or reaching a kernel as NaN or a wrapped-around size.
INT_HPARAMS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "max_position_embeddings", "n_ctx", "n_positions", "max_length",
               "sliding_window", "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
               "original_max_position_embeddings", "conv_L_cache", "block_ff_dim", "block_multiple_of",
               "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
               "linear_num_value_heads", "full_attention_interval", "num_dense_layers",
               "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
               "num_nextn_predict_layers", "n_group", "topk_group")
FLOAT_HPARAMS = ("rope_theta", "rms_norm_eps", "rope_local_base_freq", "final_logit_softcapping",
                 "attn_logit_softcapping", "partial_rotary_factor", "attention_multiplier", "embedding_multiplier",
                 "residual_multiplier", "logits_scaling", "norm_eps", "block_ffn_dim_multiplier",
                 "routed_scaling_factor")
ROPE_FLOATS = ("factor", "low_freq_factor", "high_freq_factor", "rope_theta", "attention_factor", "beta_fast",
               "beta_slow", "mscale_all_dim", "llama_4_scaling_beta")
F32_MAX = float(np.finfo(np.float32).max)  # GGUF keeps these as float32


def check_hparams(hp: dict[str, Any], path: Path) -> dict[str, Any]:
    """hp with its numeric keys checked: integers in uint32 range (GGUF stores them so), finite
    float32 numbers; null is dropped, which is how transformers reads it (the key's default)."""

    out = {k: v for k, v in hp.items() if not (v is None and k in INT_HPARAMS + FLOAT_HPARAMS)}
    for key in INT_HPARAMS:
        if key in out:
            out[key] = _check_int(out[key], key, path)
    if not 1 <= out.get("num_hidden_layers", 1) <= MAX_LAYERS:  # the tensor-name map is built per layer
        raise ConvertError(f"{path}: num_hidden_layers {out['num_hidden_layers']} is out of range (1..{MAX_LAYERS})")
    for key in FLOAT_HPARAMS:
        if key in out:
            _check_float(out[key], key, path)
    if not isinstance(out.get("tie_word_embeddings", False), bool):
        raise ConvertError(f"{path}: tie_word_embeddings {_short(out['tie_word_embeddings'])} is not true or false")
    for name in ("rope_scaling", "rope_parameters"):
        rs = out.get(name)
        if not isinstance(rs, dict):
            continue
        for key in ROPE_FLOATS:
            if rs.get(key) is not None:
                _check_float(rs[key], f"{name}.{key}", path)
        if rs.get("original_max_position_embeddings") is not None:
            key = "original_max_position_embeddings"
            out[name] = rs = {**rs, key: _check_int(rs[key], f"{name}.{key}", path)}
        for key in ("long_factor", "short_factor"):
            if rs.get(key) is not None:
                if not isinstance(rs[key], list):
                    raise ConvertError(f"{path}: {name}.{key} {_short(rs[key])} is not a list of numbers")
                for v in rs[key]:
                    _check_float(v, f"{name}.{key}", path)
        kind = rs.get("rope_type", rs.get("type"))
        if kind in ("linear", "yarn") and rs.get("factor") is None:  # the converters read it unguarded
            raise ConvertError(f"{path}: {name} of type {kind!r} has no factor")
    return out


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _check_int(v: Any, key: str, path: Path) -> int:
    # 2.0 is an integer too (some tools write every number as a float): returned as 2
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise ConvertError(f"{path}: {key} {_short(v)} is not an integer")
    if not 0 <= v < 2**32:
        raise ConvertError(f"{path}: {key} {_short(v)} is out of range (0..{2**32 - 1})")
    return int(v)


def _check_float(v: Any, key: str, path: Path) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= F32_MAX:  # NaN fails <= too
        raise ConvertError(f"{path}: {key} {_short(v)} is not a finite number")


def rope_scaling(hp: dict[str, Any]) -> dict[str, Any] | None:
    # transformers >= 4.56 renamed rope_scaling to rope_parameters (which also carries rope_theta)
    rs = hp.get("rope_scaling") or hp.get("rope_parameters")
    if not isinstance(rs, dict):
        return None
    kind = rs.get("rope_type", rs.get("type"))
    return None if kind in (None, "default") else {**rs, "rope_type": kind}


def rope_theta(hp: dict[str, Any], default: float | None) -> float | None:
    if hp.get("rope_theta") is not None:
        return float(hp["rope_theta"])
    rp = hp.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return default


def llama3_rope_factors(rs: dict[str, Any], base: float, n_rot: int) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's RoPE scaling (Meta's published rule): low frequencies
    are stretched by `factor`, high ones kept, the band between interpolated. llama.cpp takes them
    as the rope_freqs tensor."""
    factor = float(rs.get("factor", 8.0))
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    if not (factor > 0 and 0 < low < high and old_ctx > 0 and base > 0):  # else divisions by zero: NaN factors
        raise ConvertError(f"llama3 RoPE scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, "
                           f"original_max_position_embeddings > 0 and rope_theta > 0; got {factor}, {low}, {high}, "
                           f"{old_ctx:g}, {base}")

    if not 0 < n_rot <= MAX_HEAD_DIM:  # one factor per rotated pair: hidden_size 2**32 would ask for 2**31
        raise ConvertError(f"llama3 RoPE scaling over {n_rot} dims: out of range (1..{MAX_HEAD_DIM})")
    freqs = 1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    out = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, out)
    out = np.where(wavelen > old_ctx / low, factor, out)
    return out.astype(np.float32)


def head_counts(hp: dict[str, Any], path: Path) -> tuple[int, int]:
    n_head = int(need(hp, "num_attention_heads", path))
    n_head_kv = int(hp.get("num_key_value_heads") or n_head)
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ConvertError(f"{path}: head counts {n_head}/{n_head_kv} are not a valid grouped-query layout")
    return n_head, n_head_kv


def generic_kvs(kv: Kvs, hp: dict[str, Any], path: Path, llama: bool = False,
                ff_optional: bool = False) -> dict[str, np.ndarray]:
    """The converter's common keys; llama: also what its LlamaModel adds (vocab_size, the RoPE
    dimension count, Llama 3.1's rope_freqs); ff_optional: intermediate_size written only where
    the config has it (a model of experts only). Returns the tensors made from the config, by name."""
    n_embd = int(need(hp, "hidden_size", path))
    n_head, n_head_kv = head_counts(hp, path)
    head_dim = hp.get("head_dim")
    n_ctx = next((hp[k] for k in ("max_position_embeddings", "n_ctx", "n_positions", "max_length")
                  if hp.get(k) is not None), None)
    if n_ctx is not None:
        kv.u32("{arch}.context_length", n_ctx)
    kv.u32("{arch}.embedding_length", n_embd)
    kv.u32("{arch}.block_count", need(hp, "num_hidden_layers", path))
    if not ff_optional or hp.get("intermediate_size") is not None:
        kv.u32("{arch}.feed_forward_length", need(hp, "intermediate_size", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    theta = rope_theta(hp, None)
    if theta is not None:
        kv.f32("{arch}.rope.freq_base", theta)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", need(hp, "rms_norm_eps", path))
    if head_dim is not None:
        kv.u32("{arch}.attention.key_length", head_dim)
        kv.u32("{arch}.attention.value_length", head_dim)
    n_rot = int(head_dim) if head_dim is not None else n_embd // n_head
    n_expert = hp.get("num_local_experts", hp.get("num_experts"))
    if n_expert:  # a mixture of experts (the converter's TextModel writes these for any architecture)
        kv.u32("{arch}.expert_count", n_expert)
        kv.u32("{arch}.expert_used_count", need(hp, "num_experts_per_tok", path))
    if llama:
        kv.u32("{arch}.vocab_size", need(hp, "vocab_size", path))
        kv.u32("{arch}.rope.dimension_count", n_rot)
    rope_factors = None
    rs = rope_scaling(hp)
    if rs is not None:
        kind = rs["rope_type"]
        if kind == "llama3" and llama:
            try:
                rope_factors = llama3_rope_factors(rs, theta if theta is not None else 10000.0, n_rot)
            except ConvertError as e:
                raise ConvertError(f"{path}: {e}") from None
        elif kind in ("linear", "yarn"):
            kv.add("{arch}.rope.scaling.type", VT.STRING, kind)
            kv.f32("{arch}.rope.scaling.factor", rs["factor"])
            if kind == "yarn" and rs.get("original_max_position_embeddings") is not None:
                kv.u32("{arch}.rope.scaling.original_context_length", rs["original_max_position_embeddings"])
        else:
            raise ConvertError(f"{path}: {kv.arch} RoPE scaling {kind!r} is not supported (linear, yarn, llama3)")
    return {} if rope_factors is None else {"rope_freqs.weight": rope_factors}
