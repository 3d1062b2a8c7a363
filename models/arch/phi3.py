"""Microsoft Phi-3 / Phi-4 (dense): the llama layer with Q, K, V in one fused matrix (attn_qkv) and
gate and up in one (ffn_up, gate first), RoPE on (x[i], x[i + d/2]) pairs. The 128k models use
LongRoPE: per-frequency factors, short ones within the context they were trained at, long ones
beyond (models/weights.py Model.for_context), and cos/sin scaled by rope.scaling.attn_factor.
Their sliding window is ignored, as llama.cpp (this version) does: it disables Phi's SWA."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="phi3",
    rope_neox=True,
    prescale_q=True,  # Q times 1/sqrt(head_dim) before Q·K, as llama.cpp's phi3 graph
    chat_template="phi3",
)
