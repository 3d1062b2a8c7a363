"""DeepSeek-V2 (V2-Lite, V2, V2.5; llama.cpp's LLM_ARCH_DEEPSEEK2, src/models/deepseek2.cpp). Its
multi-head latent attention (MLA) and the models built on it, in the form llama.cpp's converter
writes now: attn_kv_b split into attn_k_b and attn_v_b (attention.key_length_mla /
value_length_mla present), run as llama.cpp runs it, with the projections absorbed.

A layer: Q from `attn_q` (q_lora_rank 0: V2-Lite) or `attn_q_a`, RMSNorm `attn_q_a_norm`,
`attn_q_b`; per head the "nope" part (key_length_mla - rope.dimension_count) and the RoPE part
(rope.dimension_count, adjacent pairs, YaRN where scaled). `attn_kv_a_mqa` gives the compressed
latent (kv_lora_rank, RMSNorm `attn_kv_a_norm`) and one RoPE'd key part shared by every head. The
cache keeps per token only that: latent | RoPE'd key (attention.key_length = kv_lora_rank +
rope dims, one KV head), and V is the latent, the leading attention.value_length columns of the
same row (ModelConfig.kv_v_in_k). Each head's Q is absorbed into the latent space through
`attn_k_b` (its nope part times that head's (kv_lora_rank, nope) matrix), so attention is MQA over
the latent with Q = absorbed | RoPE'd part; each head's output (a mix of latents) goes back
through `attn_v_b` to value_length_mla, then `attn_output`. The attention scale: mscale² /
sqrt(key_length_mla), mscale YaRN's 1 + 0.1 rope_yarn_log_mul ln(factor) (1 unscaled).

Files in the older layout (converted before llama.cpp split kv_b_proj: `attn_kv_b`, no *_mla keys,
key_length and value_length per head, head_count_kv = head_count), which llama.cpp runs unabsorbed
with a K/V cache of every head, run here absorbed over the latent cache all the same (the same
mathematics): scalars reads their sizes as MLA's, and upgrade_tensors splits attn_kv_b at load.

The FFN: a dense SiLU FFN in the first `leading_dense_block_count` layers, then experts: the
router's softmax (V2) or sigmoid (V3-style files: expert_gating_func 2) over expert_count, the top
expert_used_count chosen by that plus `exp_probs_b` where present, their weights renormalized
where expert_weights_norm, times expert_weights_scale; plus expert_shared_count shared experts
(one SiLU FFN of expert_feed_forward_length times that count) over every token, added ungated.

From a Hugging Face folder (DeepseekV2ForCausalLM), as llama.cpp's converter (DeepseekV2Model):
one KV head, the cache's and MLA's head sizes from kv_lora_rank, qk_nope_head_dim,
qk_rope_head_dim and v_head_dim; first_k_dense_replace, n_routed_experts, n_shared_experts,
routed_scaling_factor, norm_topk_prob, 0.1 * mscale_all_dim; kv_b_proj split into attn_k_b (each
head's nope rows, transposed) and attn_v_b (each head's V rows).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from gguf import GGUFValueType as VT

from infer.quant.tensor import QTensor
from infer.quant.types import F32

from ..hf_files import ConvertError, Kvs
from ..limits import MAX_HEAD_DIM
from .decoder import Primitives, ffn_block
from .hf_keys import generic_kvs, need, rope_scaling
from .spec import Architecture

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*: 0 (none: files before the key, softmax), 1 softmax, 2 sigmoid
_GATING = {0: "softmax", 1: "softmax", 2: "sigmoid"}


def _yarn(get: Any, head_dim_k_mla: int) -> dict[str, float]:
    """The RoPE magnitude and attention scale llama.cpp runs deepseek2 with (float32 as there): its
    context's yarn_attn_factor (llama-context.cpp: with a rope_yarn_log_mul, deepseek2's mscale
    equals mscale_all_dim, so only the 1 / (1 + 0.1 ln factor) that ggml's rope multiplies back in
    remains), and deepseek2.cpp's kq_scale = mscale² / sqrt(key_length_mla)."""
    f32 = np.float32
    kind = str(get("rope.scaling.type", "linear"))
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    freq_scale = f32(1.0) / f32(factor) if factor > 0 and kind != "none" else f32(1.0)
    attn_factor = f32(get("rope.scaling.attn_factor", 1.0))
    # the converter writes 0.1 * mscale_all_dim; llama.cpp's loader divides the 0.1 back out
    log_mul = f32(f32(get("rope.scaling.yarn_log_multiplier", 0.0)) / f32(0.1))
    ln = f32(np.log(f32(1.0) / freq_scale))
    out: dict[str, float] = {}
    if kind == "yarn":
        fac = f32(1.0) / freq_scale
        ratio = f32(1.0) if log_mul != 0 or fac <= 1 else f32(f32(0.1) * f32(np.log(fac)) + f32(1.0))
        yaf = f32(ratio * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * f32(np.log(fac)))))
        yaf = f32(yaf * attn_factor)
        out["rope_attn_factor"] = float(yaf)
    else:
        yaf = attn_factor
    org = f32(yaf * f32(f32(1.0) + f32(0.1) * ln))
    mscale = f32(org * f32(f32(1.0) + f32(f32(0.1) * log_mul) * ln))
    out["attn_scale"] = float(f32(f32(mscale * mscale) / f32(math.sqrt(f32(head_dim_k_mla)))))
    return out


def scalars(get: Any, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, Any]:
    """MLA's sizes, the router's settings and YaRN's factors, as llama_model_deepseek2's
    load_arch_hparams reads them. A file in the older layout (attn_kv_b unsplit, no
    key_length_mla / value_length_mla; llama.cpp runs it unabsorbed with a full K/V cache of
    head_count_kv = head_count heads) runs absorbed all the same: its key_length and value_length
    are MLA's head sizes, and the cache's layout is replaced by the latent one (upgrade_tensors
    splits its attn_kv_b). ValueError for a file infer does not run: one MLA key without the
    other, no kv_lora_rank, or a cache layout (key_length, value_length, head_count_kv) that is
    neither layout's."""
    kv_rank = int(get("attention.kv_lora_rank", 0) or 0)
    k_mla = int(get("attention.key_length_mla", 0) or 0)
    v_mla = int(get("attention.value_length_mla", 0) or 0)
    n_rot = int(get("rope.dimension_count", 0) or 0)
    value_len = int(get("attention.value_length", 0) or 0)
    head_kv = int(get("attention.head_count_kv", 0) or 0)
    if bool(k_mla) != bool(v_mla):  # llama_hparams::is_mla asserts both or neither
        raise ValueError("attention.key_length_mla and value_length_mla go together; the file has one of them")
    if not kv_rank:
        raise ValueError("attention.kv_lora_rank is needed (the rank of MLA's compressed KV)")
    cache: dict[str, Any] = {}
    if not k_mla:  # the older layout: per head K = nope | RoPE part (key_length), V (value_length)
        if head_kv != n_head or not (0 < n_rot < head_dim and value_len > 0):
            raise ValueError(f"a file without key_length_mla (the older attn_kv_b layout) needs head_count_kv = "
                             f"head_count and key_length > rope.dimension_count; got {head_kv} KV heads of "
                             f"{n_head}, key_length {head_dim}, rope.dimension_count {n_rot}")
        if not 0 < kv_rank <= MAX_HEAD_DIM - n_rot:  # the cache's row, bounded as config.py bounds key_length
            raise ValueError(f"attention.kv_lora_rank {kv_rank} is out of range (1..{MAX_HEAD_DIM - n_rot})")
        k_mla, v_mla = head_dim, value_len
        head_dim, value_len, head_kv = kv_rank + n_rot, kv_rank, 1
        cache = {"n_head_kv": 1, "head_dim": head_dim, "head_dim_v": value_len}
    if head_dim != kv_rank + n_rot or value_len != kv_rank or head_kv != 1 or not 0 < n_rot < k_mla:
        raise ValueError(f"MLA's cache needs key_length = kv_lora_rank + rope.dimension_count, value_length = "
                         f"kv_lora_rank and one KV head; got {head_dim}, {value_len}, {head_kv} for kv_lora_rank "
                         f"{kv_rank}, rope.dimension_count {n_rot} (key_length_mla {k_mla})")
    if float(get("attention.temperature_scale", 0.0) or 0.0):  # llama.cpp scales Q by position then (mistral-large)
        raise ValueError("attention.temperature_scale (a query temperature by position) is not supported")
    # the "lite" models (V2-Lite: 27 layers, 26) have no Q compression; llama.cpp reads no q_lora_rank there
    q_rank = 0 if n_layer in (26, 27) else int(get("attention.q_lora_rank", 0) or 0)
    gating = int(get("expert_gating_func", 0) or 0)
    if gating not in _GATING:
        raise ValueError(f"expert_gating_func {gating} is not supported (1: softmax, 2: sigmoid)")
    return {
        "n_lora_kv": kv_rank, "n_lora_q": q_rank, "head_dim_k_mla": k_mla, "head_dim_v_mla": v_mla,
        "moe_gating": _GATING[gating], **cache,
        **_yarn(get, k_mla),
    }


def split_kv_b(kv_b: np.ndarray, n_head: int, nope: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    """attn_kv_b (n_head * (nope + dv), kv_lora_rank): per head its nope rows, then its V rows
    (kv_b_proj's layout) -> attn_k_b (n_head, kv_lora_rank, nope), each head's nope rows
    transposed, and attn_v_b (n_head, dv, kv_lora_rank), as llama.cpp's converter splits kv_b_proj."""
    w = kv_b.reshape(n_head, nope + dv, -1)
    return np.ascontiguousarray(w[:, :nope].transpose(0, 2, 1)), np.ascontiguousarray(w[:, nope:])


def upgrade_tensors(tensors: Mapping[str, Any], cfg: Any) -> Mapping[str, Any]:
    """A file in the older layout (scalars): each layer's attn_kv_b split into the attn_k_b and
    attn_v_b the absorbed attention takes (split_kv_b), dequantized to F32: the file's values
    exactly, and small (n_head * (nope + V) * kv_lora_rank per layer); other files as they are."""
    H, R, nope, dv = cfg.n_head, cfg.n_lora_kv, cfg.head_dim_k_mla - cfg.n_rot, cfg.head_dim_v_mla
    names = [f"blk.{il}.attn_kv_b.weight" for il in range(cfg.n_layer) if f"blk.{il}.attn_kv_b.weight" in tensors]
    if not names:
        return tensors
    out = dict(tensors)
    for name in names:
        t = out.pop(name)
        if name.replace("attn_kv_b", "attn_k_b") in out or name.replace("attn_kv_b", "attn_v_b") in out:
            # llama.cpp loads one form or the other and refuses a file with tensors left over
            raise ValueError(f"tensor {name!r} beside attn_k_b / attn_v_b: a file of both layouts at once")
        if not isinstance(t, QTensor) or tuple(t.shape) != (H * (nope + dv), R):
            raise ValueError(f"tensor {name!r} ({type(t).__name__} of shape {tuple(t.shape)}) is not the "
                             f"({H * (nope + dv)}, {R}) matrix in GGML blocks that attn_kv_b is")
        k_b, v_b = split_kv_b(t.dequantize(), H, nope, dv)
        for part, w in (("attn_k_b", k_b), ("attn_v_b", v_b)):
            out[name.replace("attn_kv_b", part)] = QTensor.from_bytes(F32, w.shape, w.astype(np.float32).view(np.uint8))
    return out


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """One deepseek2 layer: MLA (the Q and latent products, then the absorbed attention over the
    latent cache: the backend's mla_attention), attn_output, then decoder.py's FFN block (dense
    or experts with the shared expert)."""
    if ly.q_a:
        q = ops.linear(ly.q_a, h, "q_a", il)
        q = ops.linear(ly.q, ops.rms_norm(q, ly.q_a_norm, "q_a_norm", il), "q", il)
    else:
        q = ops.linear(ly.q, h, "q", il)
    kv = ops.linear(ly.kv_a, h, "kv_cmpr_pe", il)
    a = ops.mla_attention(q, kv, ly, il)
    o = ops.linear(ly.wo, a, "attn_wo", il)
    return ffn_block(ops, ly, il, x, o, nxt)


def _mla_sizes(hp: dict[str, Any], path: Path | None = None) -> tuple[int, int, int, int, int]:
    """(heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) of a config.json."""
    where = path or Path("config.json")
    sizes = (int(need(hp, "num_attention_heads", where)), int(hp.get("kv_lora_rank") or 512),
             int(need(hp, "qk_nope_head_dim", where)), int(need(hp, "qk_rope_head_dim", where)),
             int(need(hp, "v_head_dim", where)))
    if min(sizes) <= 0:
        raise ConvertError(f"{where}: MLA sizes {sizes} must be positive")
    return sizes


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """The keys llama.cpp's converter writes for DeepseekV2Model: the common ones with one KV head
    (MLA runs as MQA over the latent) and rms_norm_eps 1e-6 by default; the leading dense count,
    vocab_size, the Q and KV ranks, the cache's head sizes (latent | RoPE part, latent) and MLA's
    (nope + RoPE, v_head_dim), the experts' width, counts and weights' scale and norm, the RoPE
    dimensions and YaRN's 0.1 * mscale_all_dim. No expert_gating_func: DeepSeek-V2's softmax is
    llama.cpp's default."""
    H, R, nope, rope, v = _mla_sizes(hp, path)
    extra = generic_kvs(kv, {**hp, "num_key_value_heads": 1, "rms_norm_eps": hp.get("rms_norm_eps", 1e-6)}, path)
    moe = hp.get("n_routed_experts") is not None
    dense = hp.get("first_k_dense_replace")
    if hp.get("num_experts_per_tok") is not None:
        kv.u32("{arch}.expert_used_count", hp["num_experts_per_tok"])
    kv.u32("{arch}.leading_dense_block_count", (0 if moe else need(hp, "num_hidden_layers", path))
           if dense is None else dense)
    kv.u32("{arch}.vocab_size", need(hp, "vocab_size", path))
    if hp.get("q_lora_rank") is not None:
        kv.u32("{arch}.attention.q_lora_rank", hp["q_lora_rank"])
    kv.u32("{arch}.attention.kv_lora_rank", R)
    kv.u32("{arch}.attention.key_length", R + rope)
    kv.u32("{arch}.attention.value_length", R)
    kv.u32("{arch}.attention.key_length_mla", nope + rope)
    kv.u32("{arch}.attention.value_length_mla", v)
    kv.u32("{arch}.expert_feed_forward_length",
           hp["moe_intermediate_size"] if hp.get("moe_intermediate_size") is not None
           else need(hp, "intermediate_size", path))
    if moe:
        kv.u32("{arch}.expert_count", hp["n_routed_experts"])
    kv.u32("{arch}.expert_shared_count", hp.get("n_shared_experts") or 0)
    if hp.get("routed_scaling_factor") is not None:
        kv.f32("{arch}.expert_weights_scale", hp["routed_scaling_factor"])
    if hp.get("norm_topk_prob"):
        kv.add("{arch}.expert_weights_norm", VT.BOOL, True)
    kv.u32("{arch}.rope.dimension_count", rope)
    rs = rope_scaling(hp) or {}
    if rs.get("mscale_all_dim") is not None:  # the converter's legacy 0.1 factor, which llama.cpp divides out
        kv.f32("{arch}.rope.scaling.yarn_log_multiplier", 0.1 * float(rs["mscale_all_dim"]))
    return extra


def hf_tensor_parts(name: str, hp: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """kv_b_proj (per head its nope rows, then its V rows) split as llama.cpp's converter splits it
    for the absorbed form: k_b_proj (each head's nope rows) and v_b_proj (each head's V rows)."""
    if not name.endswith("self_attn.kv_b_proj.weight"):
        return None
    H, _, nope, _, v = _mla_sizes(hp)
    heads = np.arange(H)[:, None] * (nope + v)
    return [(name.replace("kv_b_proj", "k_b_proj"), (heads + np.arange(nope)).reshape(-1)),
            (name.replace("kv_b_proj", "v_b_proj"), (heads + nope + np.arange(v)).reshape(-1))]


_K_B, _V_B = "self_attn.k_b_proj.weight", "self_attn.v_b_proj.weight"  # kv_b_proj's parts (hf_tensor_parts)


def hf_tensor_steps(name: str, hp: dict[str, Any]) -> list[Callable[[np.ndarray], np.ndarray]]:
    """k_b_proj's rows (head by head, nope of them, kv_lora_rank wide) as llama.cpp writes
    attn_k_b: each head's matrix transposed, (heads, kv_lora_rank, nope); v_b_proj's as attn_v_b,
    (heads, v_head_dim, kv_lora_rank)."""
    if name.endswith(_K_B):
        H, R, nope, _, _ = _mla_sizes(hp)
        return [lambda w: np.ascontiguousarray(w.reshape(H, nope, R).transpose(0, 2, 1))]
    if name.endswith(_V_B):
        H, R, _, _, v = _mla_sizes(hp)
        return [lambda w: w.reshape(H, v, R)]
    return []


def hf_tensor_shape(name: str, shape: tuple[int, ...], hp: dict[str, Any]) -> tuple[int, ...]:
    """attn_k_b (heads, kv_lora_rank, nope) and attn_v_b (heads, v_head_dim, kv_lora_rank): 3-D."""
    if not name.endswith((_K_B, _V_B)):
        return shape
    H, R, nope, _, v = _mla_sizes(hp)
    return (H, R, nope) if name.endswith(_K_B) else (H, v, R)


ARCHITECTURE = Architecture(
    name="deepseek2",
    rope_neox=False,
    experts="always",
    shared_expert="counted",
    moe_weights_from_file=True,
    extra_biases=("exp_probs_b.bias",),
    optional_biases=("exp_probs_b.bias",),
    attention_kind="multi-head latent attention over a latent KV cache",
    hf_model_types=("deepseek_v2",),
    hf_class="DeepseekV2ForCausalLM",
    hf_kvs=hf_kvs,
    hf_tensor_parts=hf_tensor_parts,
    hf_tensor_steps=hf_tensor_steps,
    hf_tensor_shape=hf_tensor_shape,
    scalars=scalars,
    upgrade_tensors=upgrade_tensors,
    layer=layer,
)
