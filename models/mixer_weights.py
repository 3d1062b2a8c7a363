"""The tensors of the token mixers other than plain attention: multi-head latent attention
(deepseek2), gated attention's Q and gate (Qwen3.5, Qwen3-Next), and the recurrent layers (LFM2's
short convolutions, gated delta nets, Mamba-2). Apart from weights.py, which collects what every
architecture shares and calls these for the layers that have them."""
from __future__ import annotations

from typing import Any

import numpy as np

from infer.quant.tensor import QTensor, StackedRows

from .config import ModelConfig
from .matrix import Matrix, ModelLoadError, rows


def mla(get, vec, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """A multi-head latent attention's tensors (deepseek2; llama.cpp's load_arch_tensors for is_mla):
    attn_k_b (n_head, n_lora_kv, nope) and attn_v_b (n_head, head_dim_v_mla, n_lora_kv) as a
    matrix per head."""
    D, H, R, dk = cfg.n_embd, cfg.n_head, cfg.n_lora_kv, cfg.head_dim_k_mla
    nope, dv = dk - cfg.n_rot, cfg.head_dim_v_mla
    if cfg.n_lora_q:
        out = {"q_a": get(p + "attn_q_a.weight", (cfg.n_lora_q, D)),
               "q_a_norm": vec(p + "attn_q_a_norm.weight", cfg.n_lora_q),
               "wq": get(p + "attn_q_b.weight", (H * dk, cfg.n_lora_q))}
    else:
        out = {"wq": get(p + "attn_q.weight", (H * dk, D))}
    k_b, v_b = get(p + "attn_k_b.weight", (H, R, nope)), get(p + "attn_v_b.weight", (H, dv, R))
    for name, t in (("attn_k_b", k_b), ("attn_v_b", v_b)):
        if not isinstance(t, QTensor):
            raise ModelLoadError(f"{p}{name}.weight in {type(t).__name__} form is not supported")
    out.update(kv_a=get(p + "attn_kv_a_mqa.weight", (R + cfg.n_rot, D)),
               kv_a_norm=vec(p + "attn_kv_a_norm.weight", R),
               k_b=tuple(rows(k_b, h * R, (h + 1) * R) for h in range(H)),
               v_b=tuple(rows(v_b, h * dv, (h + 1) * dv) for h in range(H)))
    return out


def shortconv(get, vec, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """A short-convolution layer's tensors (LFM2; llama.cpp's LLM_TENSOR_SHORTCONV_*)."""
    D = cfg.n_embd
    return {"shortconv_in": get(p + "shortconv.in_proj.weight", (3 * D, D)),
            "shortconv": vec(p + "shortconv.conv.weight", (D, cfg.shortconv_l_cache)),
            "shortconv_out": get(p + "shortconv.out_proj.weight", (D, D))}


def q_and_gate(wq: Matrix, n_head: int, path, p: str) -> tuple[StackedRows, StackedRows]:
    """Q's rows and the gate's rows of a gated attention's attn_q, whose rows are per head Q's
    head_dim then the gate's (llama.cpp's views of Qcur_full): two matrices of per-head views of
    the file, copied only by a backend that needs them whole (quant.tensor.StackedRows)."""
    if not isinstance(wq, QTensor):
        raise ModelLoadError(f"{path}: {p}attn_q.weight in {type(wq).__name__} form cannot be split into Q and gate")
    hd = wq.shape[0] // (2 * n_head)
    return (StackedRows(tuple(rows(wq, 2 * h * hd, (2 * h + 1) * hd) for h in range(n_head))),
            StackedRows(tuple(rows(wq, (2 * h + 1) * hd, (2 * h + 2) * hd) for h in range(n_head))))


def gated_delta_net(get, vec, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """A gated delta net layer's tensors (Qwen3.5, Qwen3-Next; llama.cpp's load_block_trunk for is_recr)."""
    D, C, inner, hv = cfg.n_embd, cfg.ssm_conv_channels, cfg.ssm_inner_size, cfg.ssm_dt_rank
    if get(p + "ssm_ba.weight", None, required=False) is not None:  # Qwen3-Next: beta and alpha in one
        beta, alpha = _beta_alpha(get(p + "ssm_ba.weight", (2 * hv, D)), cfg.ssm_group_count, p)
    else:
        beta, alpha = get(p + "ssm_beta.weight", (hv, D)), get(p + "ssm_alpha.weight", (hv, D))
    return {"ssm_qkv": get(p + "attn_qkv.weight", (C, D)), "ssm_z": get(p + "attn_gate.weight", (inner, D)),
            "ssm_beta": beta, "ssm_alpha": alpha,
            "ssm_conv": vec(p + "ssm_conv1d.weight", (C, cfg.ssm_conv_kernel)),
            "ssm_dt": vec(p + "ssm_dt.bias", hv), "ssm_a": vec(p + "ssm_a", hv),
            "ssm_norm": vec(p + "ssm_norm.weight", cfg.ssm_state_size),
            "ssm_out": get(p + "ssm_out.weight", (D, inner))}


def mamba2(get, vec, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """A Mamba-2 mixer's tensors (granitehybrid; llama.cpp's load_arch_tensors for is_recr): A and
    D stored (H, 1), the grouped norm's weight (G, I / G), both flattened here."""
    D, C, inner, H, G = cfg.n_embd, cfg.ssm_conv_channels, cfg.ssm_inner_size, cfg.ssm_dt_rank, cfg.ssm_group_count
    return {"ssm_in": get(p + "ssm_in.weight", (inner + C + H, D)),
            "ssm_conv": vec(p + "ssm_conv1d.weight", (C, cfg.ssm_conv_kernel)),
            "ssm_conv_b": vec(p + "ssm_conv1d.bias", C),
            "ssm_dt": vec(p + "ssm_dt.bias", H), "ssm_a": vec(p + "ssm_a", (H, 1)).reshape(H),
            "ssm_d": vec(p + "ssm_d", (H, 1)).reshape(H),
            "ssm_norm": vec(p + "ssm_norm.weight", (G, inner // G)).reshape(inner),
            "ssm_out": get(p + "ssm_out.weight", (D, inner))}


def _beta_alpha(ba: Matrix, n_k_heads: int, p: str) -> tuple[Matrix, Matrix]:
    """Beta's and alpha's rows of Qwen3-Next's ssm_ba, whose rows are per key head its value heads'
    beta logits, then their alpha logits (llama.cpp's views of mixed_ba): two matrices, in value
    head order, rows copied once."""
    if not isinstance(ba, QTensor):
        raise ModelLoadError(f"{p}ssm_ba.weight in {type(ba).__name__} form cannot be split into beta and alpha")
    per_k = ba.shape[0] // (2 * n_k_heads)
    grouped = ba.raw.reshape(n_k_heads, 2, per_k, -1)
    shape = (n_k_heads * per_k, ba.shape[1])

    def part(i: int) -> QTensor:
        return QTensor(ba.type_id, shape, np.ascontiguousarray(grouped[:, i]).reshape(shape[0], -1))

    beta, alpha = part(0), part(1)
    ba.release()  # the file pages copied from are not read again
    return beta, alpha
