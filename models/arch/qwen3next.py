"""Qwen3-Next (Qwen3-Next-80B-A3B; llama.cpp's LLM_ARCH_QWEN3NEXT): as src/models/qwen3next.cpp
builds it, the layers Qwen3.5 MoE took over (qwen35moe.py: gated delta nets beside gated full attention, a mixture
of experts with a sigmoid-gated shared expert), with what differs in its files and graph:
- a delta net's value heads are grouped by key head (value head h reads key head h // (Hv / Hk):
  llama.cpp's repeat-interleave), where Qwen3.5's converter tiles them (h % Hk);
- beta's and alpha's products are one `ssm_ba` matrix, per key head its value heads' beta rows
  then their alpha rows (split apart at load: models/mixer_weights.py); Q|K|V and z are `attn_qkv` and
  `attn_gate` as in Qwen3.5 (the files of llama.cpp's converter before it split in_proj_qkvz, with
  one `ssm_in`, are refused as missing attn_qkv);
- RoPE is plain NeoX over rope.dimension_count dims of each head (no multi-section positions).
The norms are Qwen3.5's (the converter adds 1 to the HF weights but the gated norm's).

The HF converter (llama.cpp's Qwen3NextModel): Qwen3.5's keys without RoPE sections, Qwen3.5's
names (the multi-token-prediction block left out, as its --no-mtp does), A = -exp(A_log), and no
V-head reorder; in_proj_qkvz, per key head its Q, K, V and z rows, becomes attn_qkv (every head's
Q, then K, then V) and attn_gate (z) (hf_tensor_parts); in_proj_ba is ssm_ba as stored."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..hf_files import Kvs
from . import qwen35


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    return qwen35.gated_delta_net_kvs(kv, hp, path)


def hf_tensor_parts(name: str, hp: dict[str, Any]) -> list[tuple[str, np.ndarray]] | None:
    """in_proj_qkvz's rows, [q (dk), k (dk), v (Hv / Hk * dv), z (Hv / Hk * dv)] per key head,
    regrouped as the converter does: every head's q, then k, then v as in_proj_qkv; the z rows as
    in_proj_z."""
    if not name.endswith(".linear_attn.in_proj_qkvz.weight"):
        return None
    hk, hv = int(hp["linear_num_key_heads"]), int(hp["linear_num_value_heads"])
    dk, dv = int(hp["linear_key_head_dim"]), int(hp["linear_value_head_dim"])
    per_k = hv // hk * dv  # one key head's V (and z) rows
    start = np.arange(hk)[:, None] * (2 * dk + 2 * per_k)  # each key head's first row

    def rows(lo: int, n: int) -> np.ndarray:
        return (start + lo + np.arange(n)).ravel()

    base = name[:-len("in_proj_qkvz.weight")]
    qkv = np.concatenate([rows(0, dk), rows(dk, dk), rows(2 * dk, per_k)])
    return [(base + "in_proj_qkv.weight", qkv), (base + "in_proj_z.weight", rows(2 * dk + per_k, per_k))]


def hf_tensor_steps(name: str, hp: dict[str, Any]) -> list[Callable[[np.ndarray], np.ndarray]]:
    return [qwen35.negated_exp] if name.endswith(".linear_attn.A_log") else []


ARCHITECTURE = replace(
    qwen35.ARCHITECTURE,
    name="qwen3next",
    experts="always",
    shared_expert="sigmoid",
    ssm_v_heads_grouped=True,
    hf_model_types=("qwen3_next",),
    hf_class="Qwen3NextForCausalLM",
    hf_kvs=hf_kvs,
    hf_tensor_parts=hf_tensor_parts,
    hf_tensor_steps=hf_tensor_steps,
)
