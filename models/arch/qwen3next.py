"""Qwen3-Next (Qwen3-Next-80B-A3B; llama.cpp's LLM_ARCH_QWEN3NEXT): as src/models/qwen3next.cpp
builds it, the layers Qwen3.5 MoE took over (qwen35moe.py: gated delta nets beside gated full attention, a mixture
of experts with a sigmoid-gated shared expert), with what differs in its files and graph:
- a delta net's value heads are grouped by key head (value head h reads key head h // (Hv / Hk):
  llama.cpp's repeat-interleave), where Qwen3.5's converter tiles them (h % Hk);
- beta's and alpha's products are one `ssm_ba` matrix, per key head its value heads' beta rows
  then their alpha rows (split apart at load: models/weights.py); Q|K|V and z are `attn_qkv` and
  `attn_gate` as in Qwen3.5 (the files of llama.cpp's converter before it split in_proj_qkvz, with
  one `ssm_in`, are refused as missing attn_qkv);
- RoPE is plain NeoX over rope.dimension_count dims of each head (no multi-section positions).
The norms are Qwen3.5's (the converter adds 1 to the HF weights but the gated norm's)."""
from __future__ import annotations

from dataclasses import replace

from . import qwen35

ARCHITECTURE = replace(
    qwen35.ARCHITECTURE,
    name="qwen3next",
    experts="always",
    shared_expert="sigmoid",
    ssm_v_heads_grouped=True,
    hf_model_types=(),  # the HF converter does not take Qwen3-Next checkpoints yet
    hf_class="",
)
