"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (Z.ai; llama.cpp's LLM_ARCH_GLM4_MOE): as src/models/glm4-moe.cpp
builds it, pre-norm layers whose attention has Q/K/V biases, per-head Q/K RMSNorm where the file
has it (GLM-4.5, not -Air), and NeoX RoPE over the first rope.dimension_count dims of each head
(half of them in the released models); the pre-FFN norm is stored as post_attention_norm. The
first leading_dense_block_count layers keep a dense SwiGLU FFN; the others have a mixture of
experts: each expert's sigmoid of its router logit, the top expert_used_count chosen by that plus
the layer's selection bias (exp_probs_b, which only the choice sees), their sigmoids
renormalized where expert_weights_norm says so and multiplied by expert_weights_scale
(routed_scaling_factor) (build_moe_ffn); beside them expert_shared_count shared experts, one
SwiGLU FFN of that many expert widths, added ungated. Multi-token-prediction layers (the last
nextn_predict_layers blocks) are left unread, as llama.cpp's graph skips them (models/config.py).

GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is not this architecture: llama.cpp converts it to
deepseek2 (multi-head latent attention).

From a Hugging Face folder (Glm4MoeForCausalLM), as llama.cpp's converter (Glm4MoeModel): the
routed experts' count, width, the shared count, the leading dense count, sigmoid gating, the
weights' scale and norm, the RoPE dims (head_dim * partial_rotary_factor, 0.5 by default), the
MTP layers' count (they are converted as llama.cpp converts them: blocks after the others); each
layer's experts stacked."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from .hf_keys import generic_kvs, need
from .spec import Architecture

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID: its converter writes it, its loader takes an
# absent key as it
_SIGMOID = 2


def check_metadata(get: Callable[[str, Any], Any], n_rot: int) -> None:
    """ValueError for the values of keys llama.cpp reads for it that infer does not run: a gating
    other than sigmoid, grouped expert choice, and M-RoPE sections (the vision model's) that
    rotate some of a text token's pairs by another position than its own."""
    gating = get("expert_gating_func", None)
    if gating is not None and int(gating) not in (0, _SIGMOID):  # 0: none written, sigmoid
        raise ValueError(f"expert_gating_func {gating} is not supported (2: sigmoid)")
    groups = get("expert_group_count", None)
    if groups is not None and int(groups) > 1:  # llama.cpp's grouped choice (DeepSeek-V3's), not GLM's
        raise ValueError(f"expert_group_count {groups} is not supported (1)")
    sections = get("rope.dimension_sections", None)
    if sections is not None and not _mrope_is_neox([int(v) for v in sections], n_rot):
        raise ValueError(f"rope.dimension_sections {[int(v) for v in sections]} rotate some pairs by the extra "
                         f"section's position (not supported)")


def _mrope_is_neox(sections: list[int], n_rot: int) -> bool:
    """Whether ggml's M-RoPE with these sections (time, height, width, extra) rotates a text token
    as NeoX RoPE does: its pair i takes the position of the section of i mod their sum, the token's
    own in the first three, 0 in the extra one (llama.cpp's positions of a text token)."""
    s = (sections + [0] * 4)[:4]
    first3, total = sum(s[:3]), sum(s)
    return total == 0 or all(i % total < first3 for i in range(n_rot // 2))


def hf_text_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with the MTP layers counted in num_hidden_layers: llama.cpp's converter writes
    them as the last blocks (block_count counts them), which is how they are named and converted."""
    nextn = config.get("num_nextn_predict_layers")
    if isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > 0 \
            and isinstance(config.get("num_hidden_layers"), int):
        return {**config, "num_hidden_layers": config["num_hidden_layers"] + nextn}
    return dict(config)


def hf_text_name(name: str) -> str:
    """The router's selection bias with a .bias suffix, as llama.cpp's converter renames it
    (e_score_correction_bias -> gguf's exp_probs_b.bias)."""
    if name.endswith(".e_score_correction_bias"):
        return name.removesuffix("_bias") + ".bias"
    return name


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """The keys llama.cpp's Glm4MoeModel writes after the common ones (its TextModel's expert and
    expert-group counts among them)."""
    extra = generic_kvs(kv, hp, path)
    for key, gguf_key in (("num_experts_per_tok", "expert_used_count"), ("n_group", "expert_group_count"),
                          ("topk_group", "expert_group_used_count")):
        if hp.get(key) is not None:
            kv.u32("{arch}." + gguf_key, hp[key])
    n_embd, n_head = int(need(hp, "hidden_size", path)), int(need(hp, "num_attention_heads", path))
    head_dim = int(hp.get("head_dim") or n_embd // n_head)
    rp = hp.get("rope_parameters") or hp.get("rope_scaling")  # where llama.cpp's converter looks first
    factor = (rp if isinstance(rp, dict) else {}).get("partial_rotary_factor", hp.get("partial_rotary_factor", 0.5))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ConvertError(f"{path}: partial_rotary_factor {factor!r} is not a number")
    n_rot = int(head_dim * factor)
    if not 2 <= n_rot <= head_dim or n_rot % 2:
        raise ConvertError(f"{path}: partial_rotary_factor {factor} gives {n_rot} rotated dims of {head_dim}")
    kv.u32("{arch}.rope.dimension_count", n_rot)
    for key, gguf_key in (("n_routed_experts", "expert_count"), ("moe_intermediate_size", "expert_feed_forward_length"),
                          ("n_shared_experts", "expert_shared_count"),
                          ("first_k_dense_replace", "leading_dense_block_count")):
        if hp.get(key) is not None:
            kv.u32("{arch}." + gguf_key, hp[key])
    kv.u32("{arch}.expert_gating_func", _SIGMOID)
    if hp.get("routed_scaling_factor") is not None:
        kv.f32("{arch}.expert_weights_scale", hp["routed_scaling_factor"])
    if hp.get("norm_topk_prob") is not None:
        kv.add("{arch}.expert_weights_norm", VT.BOOL, bool(hp["norm_topk_prob"]))
    if hp.get("num_nextn_predict_layers") is not None:
        kv.u32("{arch}.nextn_predict_layers", hp["num_nextn_predict_layers"])
    return extra


ARCHITECTURE = Architecture(
    name="glm4moe",
    rope_neox=True,
    qk_norm="head",
    qk_norm_optional=True,
    experts="always",
    moe_gating="sigmoid",
    moe_weights_from_file=True,
    shared_expert="counted",
    extra_biases=("exp_probs_b.bias",),
    ffn_norm_tensor="post_attention_norm",
    check_metadata=check_metadata,
    hf_model_types=("glm4_moe",),
    hf_class="Glm4MoeForCausalLM",
    hf_kvs=hf_kvs,
    hf_text_hparams=hf_text_hparams,
    hf_text_name=hf_text_name,
    # llama.cpp's _set_vocab_glm: a turn ends at the next <|user|> (eot) or <|observation|> (eom)
    hf_special_tokens=(("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>")),
)
