"""Qwen3.5 dense (llama.cpp's LLM_ARCH_QWEN35): Gated DeltaNet linear-attention layers
interleaved with gated full-attention layers, each followed by the gated SiLU FFN; pre-norm, the
FFN's norm named `post_attention_norm` (llama.cpp's src/models/qwen35.cpp, delta-net-base.cpp).

Which layers are recurrent: `attention.recurrent_layers` (a flag per layer), else every layer but
each `full_attention_interval`-th (default 4). A recurrent layer (build_layer_attn_linear): from
the normed input, Q|K|V (`attn_qkv`, key heads * S twice, then value heads * S), the output gate z
(`attn_gate`), beta = sigmoid(`ssm_beta` h) and the decay g = softplus(`ssm_alpha` h + `ssm_dt`) *
`ssm_a` per value head; a depthwise causal convolution of width `ssm.conv_kernel` over Q|K|V (its
last width - 1 inputs the sequence's "conv" state), SiLU; Q and K L2-normalized per head; the
gated delta rule per value head (its key head: value head % key heads, ggml's tiling) over a
(S x S) state matrix, the sequence's "delta" state (backends/cpu/delta_net.py); RMSNorm of each
head's output times `ssm_norm`, times SiLU(z); `ssm_out`. A full-attention layer: Q and a gate per
head interleaved in one `attn_q` product (split apart at load: models/mixer_weights.py), Q/K RMSNorm per
head, RoPE over the first rope.dimension_count dims of each head, attention, times sigmoid(gate),
`attn_output`. llama.cpp rotates with its interleaved multi-section RoPE (IMROPE); a text token's
positions are equal in every section, which makes it NeoX RoPE wherever every rotated pair falls
in a time/height/width section (checked: the fourth, extra section would rotate by position 0).
Multi-token-prediction layers (the last `nextn_predict_layers` blocks, `blk.N.nextn.*`) are
loaded by llama.cpp only for its MTP drafts and skipped by its graph: infer runs the blocks before
them (models/config.py) and never reads theirs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from .decoder import Primitives, ffn_block
from .hf_keys import generic_kvs, need
from .spec import Architecture
from .ssm_keys import ssm_sizes


def _imrope_is_neox(sections: Any, n_rot: int) -> bool:
    """Whether ggml's IMROPE (ggml_mrope_cache_init) takes every rotated pair's angle from the
    time, height or width position (all equal to the token's position for text), never from the
    fourth (extra) one, which is 0 for text tokens."""
    s = [int(v) for v in sections] + [0] * (4 - len(sections))
    total = sum(s[:4])
    if total <= 0:
        return True  # no sections: one position for every pair
    for pair in range(n_rot // 2):
        sector = pair % total
        if not ((sector % 3 == 0 and sector < 3 * s[0]) or (sector % 3 == 1 and sector < 3 * s[1])
                or (sector % 3 == 2 and sector < 3 * s[2])):
            return False
    return True


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """The recurrent layers and the gated delta net's sizes; ValueError for metadata that does not
    describe a qwen35 infer runs (ModelConfig.from_metadata makes it a ModelConfigError)."""
    sizes = ssm_sizes(get)
    S, hk, hv = sizes["ssm_state_size"], sizes["ssm_group_count"], sizes["ssm_dt_rank"]
    if hv % hk or sizes["ssm_inner_size"] != hv * S:
        raise ValueError(f"ssm.inner_size {sizes['ssm_inner_size']} must be time_step_rank {hv} * state_size {S}, "
                         f"and time_step_rank a multiple of group_count {hk}")
    flags = get("attention.recurrent_layers", None)
    if flags is not None:
        # a flag for every block, the multi-token-prediction layers' (past n_layer) included
        n_all = n_layer + int(get("nextn_predict_layers", 0) or 0)
        if not hasattr(flags, "__len__") or len(flags) != n_all:
            raise ValueError(f"attention.recurrent_layers must give a flag for each of {n_all} layers")
        layer_recurrent = tuple(bool(v) for v in flags[:n_layer])
    else:
        interval = int(get("full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"full_attention_interval {interval} must be positive")
        layer_recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    if all(layer_recurrent):
        raise ValueError("no full-attention layer (every layer recurrent) is not supported")
    head_dim = int(get("attention.key_length", 0) or 0)
    n_rot = int(get("rope.dimension_count", head_dim) or 0)
    sections = get("rope.dimension_sections", None)
    if sections is not None and not _imrope_is_neox(sections, n_rot):
        raise ValueError(f"rope.dimension_sections {list(sections)} rotate some pairs by the extra section's "
                         "position, which text tokens do not have")
    return {"layer_recurrent": layer_recurrent, **sizes}


# -- the HF converter (llama.cpp's Qwen3_5TextModel: Qwen3NextModel with the V heads reordered)

_DEFAULT_SECTIONS = [11, 11, 10, 0]  # llama.cpp's converter writes these where the checkpoint has none


def hf_text_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's hyperparameters (Qwen3_5ForConditionalGeneration nests them in text_config)."""
    if not isinstance(config.get("text_config"), dict):
        return dict(config)
    hp = dict(config["text_config"])
    if "tie_word_embeddings" in config:
        hp.setdefault("tie_word_embeddings", config["tie_word_embeddings"])
    return hp


def hf_text_name(name: str) -> str | None:
    """A checkpoint tensor's text-model name: the vision tower and the multi-token-prediction block
    dropped (llama.cpp's --no-mtp; the mmproj file has the vision part), dt_bias named as the
    converter renames it (dt_proj.bias, gguf's ssm_dt)."""
    if name.startswith(("model.visual.", "visual.", "mtp.", "model.mtp.")):
        return None
    name = name.replace("model.language_model.", "model.")
    return name.replace(".linear_attn.dt_bias", ".linear_attn.dt_proj.bias")


def _rope_parameters(hp: dict[str, Any]) -> dict[str, Any]:
    rp = hp.get("rope_parameters") or hp.get("rope_scaling") or {}
    return {**({"partial_rotary_factor": hp["partial_rotary_factor"]} if "partial_rotary_factor" in hp else {}),
            **(rp if isinstance(rp, dict) else {})}


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """What llama.cpp's converter writes for Qwen3.5 (its Qwen3_5TextModel / Qwen3_5MoeTextModel):
    Qwen3-Next's keys (gated_delta_net_kvs), and RoPE's sections, [11, 11, 10, 0] where the
    checkpoint has none."""
    extra = gated_delta_net_kvs(kv, hp, path)
    sections = list(_rope_parameters(hp).get("mrope_section") or _DEFAULT_SECTIONS)
    kv.add("{arch}.rope.dimension_sections", VT.ARRAY, np.array((sections + [0] * 4)[:4], np.int32))
    return extra


def gated_delta_net_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """What llama.cpp's Qwen3NextModel writes (Qwen3.5's converter too): the common keys, each
    expert's and the shared expert's width where the model has experts, the gated delta net's ssm.*
    sizes, full_attention_interval, RoPE over partial_rotary_factor of each head. llama.cpp also
    writes layer_types as attention.recurrent_layers; here a layer_types that the interval does not
    describe is refused (infer's GGUF writers have no boolean arrays)."""
    moe = bool(hp.get("num_experts"))
    # a MoE checkpoint may have no dense width (Qwen3.5 MoE's): the converter writes it only if given
    extra = generic_kvs(kv, hp, path, ff_optional=moe)
    if moe:
        if hp.get("mlp_only_layers"):  # dense layers among the MoE ones: llama.cpp's graphs have none
            raise ConvertError(f"{path}: mlp_only_layers {hp['mlp_only_layers']} (dense layers) are not supported")
        kv.u32("{arch}.expert_feed_forward_length", need(hp, "moe_intermediate_size", path))
        if hp.get("shared_expert_intermediate_size") is not None:
            kv.u32("{arch}.expert_shared_feed_forward_length", hp["shared_expert_intermediate_size"])
    n_layer = int(need(hp, "num_hidden_layers", path))
    interval = int(hp.get("full_attention_interval", 4))
    types = hp.get("layer_types")
    if types is not None and list(types) != ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                             for i in range(n_layer)]:
        raise ConvertError(f"{path}: layer_types that full_attention_interval {interval} does not describe "
                           "are not supported")
    hk, hv = int(need(hp, "linear_num_key_heads", path)), int(need(hp, "linear_num_value_heads", path))
    dk, dv = int(need(hp, "linear_key_head_dim", path)), int(need(hp, "linear_value_head_dim", path))
    if dk != dv or hk <= 0 or hv % hk:
        raise ConvertError(f"{path}: linear attention heads {hk} x {dk} (keys) / {hv} x {dv} (values) are not "
                           "a layout llama.cpp runs (equal head sizes, value heads a multiple of key heads)")
    kv.u32("{arch}.ssm.conv_kernel", need(hp, "linear_conv_kernel_dim", path))
    kv.u32("{arch}.ssm.state_size", dk)
    kv.u32("{arch}.ssm.group_count", hk)
    kv.u32("{arch}.ssm.time_step_rank", hv)
    kv.u32("{arch}.ssm.inner_size", dv * hv)
    kv.u32("{arch}.full_attention_interval", interval)
    head_dim = int(hp.get("head_dim") or int(need(hp, "hidden_size", path)) // int(need(hp, "num_attention_heads", path)))
    rp = _rope_parameters(hp)
    kv.u32("{arch}.rope.dimension_count", int(head_dim * float(rp.get("partial_rotary_factor", 0.25))))
    return extra


def _v_heads_tiled(w: np.ndarray, axis: int, hk: int, per_k: int, size: int) -> np.ndarray:
    """V heads from HF's grouped order (by key head) to ggml's tiled one (llama.cpp's
    _reorder_v_heads): along axis, (hk, per_k, size) becomes (per_k, hk, size)."""
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    w = w.reshape(hk, per_k, size, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(w, 0, axis))


def hf_tensor_steps(name: str, hp: dict[str, Any]) -> list[Callable[[np.ndarray], np.ndarray]]:
    """What llama.cpp's converter does to a gated delta net's tensors beyond renaming: A = -exp(A_log),
    and where value heads outnumber key heads, the V heads reordered to ggml's tiling (Q|K|V's V
    rows, z's rows, beta's and alpha's rows, A and dt, the convolution's V channels, out_proj's
    columns). Applied to the tensor as stored (1-D and conv kernels as float32 already)."""
    if ".linear_attn." not in name:
        return []
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    hk, hv = int(hp.get("linear_num_key_heads", 0)), int(hp.get("linear_num_value_heads", 0))
    if hk and hv and hk != hv:
        dk, dv, per_k = int(hp["linear_key_head_dim"]), int(hp["linear_value_head_dim"]), hv // hk
        qk = 2 * hk * dk

        def v_part(axis: int, size: int) -> Callable[[np.ndarray], np.ndarray]:
            def step(w: np.ndarray) -> np.ndarray:
                head, v = np.split(w, [qk], axis=axis)
                return np.concatenate([head, _v_heads_tiled(v, axis, hk, per_k, size)], axis=axis)
            return step

        if ".in_proj_qkv." in name or ".conv1d." in name:
            steps.append(v_part(0, dv))
        elif ".in_proj_z." in name:
            steps.append(lambda w: _v_heads_tiled(w, 0, hk, per_k, dv))
        elif ".in_proj_a." in name or ".in_proj_b." in name or name.endswith((".A_log", ".dt_proj.bias")):
            steps.append(lambda w: _v_heads_tiled(w, 0, hk, per_k, 1))
        elif ".out_proj." in name:
            steps.append(lambda w: _v_heads_tiled(w, 1, hk, per_k, dv))
    if name.endswith(".A_log"):
        steps.append(negated_exp)
    return steps


def negated_exp(a_log: np.ndarray) -> np.ndarray:
    """A = -exp(A_log): the converter stores the delta net's decay rate, not its log."""
    return -np.exp(a_log.astype(np.float32))


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """A gated delta net layer (a layer with ssm_in products) or a gated full-attention layer,
    then the FFN."""
    if ly.ssm_in:
        proj = ops.linear(ly.ssm_in, h, "ssm_in", il)  # Q|K|V, z, beta, alpha side by side
        y = ops.delta_net(proj, ly, il)
        o = ops.linear(ly.ssm_out, y, "linear_attn_out", il)
    else:
        qkv = ops.linear(ly.qkv, h, "qkv", il)  # Q|K|V, then the gate
        a = ops.attention(qkv, ly, il)
        a = ops.attn_gate(a, qkv, il)
        o = ops.linear(ly.wo, a, "attn_wo", il)
    return ffn_block(ops, ly, il, x, o, nxt)


ARCHITECTURE = Architecture(
    name="qwen35",
    rope_neox=True,
    hf_model_types=("qwen3_5_text", "qwen3_5"),
    hf_class="Qwen3_5ForCausalLM",
    hf_kvs=hf_kvs,
    hf_text_hparams=hf_text_hparams,
    hf_text_name=hf_text_name,
    hf_conv_kernels=("linear_attn.conv1d.weight",),
    # Qwen3.5's RMSNorms scale by (1 + w), all but the delta net's gated norm
    hf_norm_shift=True,
    hf_norm_shift_except=("linear_attn.norm.weight",),
    hf_tensor_steps=hf_tensor_steps,
    qk_norm="head",
    attn_output_gate=True,
    ffn_norm_tensor="post_attention_norm",
    extra_biases=("ssm_dt.bias",),
    recurrent=recurrent,
    recurrent_kind="gated delta nets",
    chat_template="chatml",
    layer=layer,
)
