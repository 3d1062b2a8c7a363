"""AllenAI OLMo 2: no norm before attention or the FFN; instead RMSNorm of each block's output
before the residual add, and RMSNorm of Q and of K over the whole projection (not per head)
before RoPE on (x[i], x[i + d/2]) pairs. Files that set a sliding window (OLMo 3) have three
sliding-window layers to each global one."""
from __future__ import annotations

from .spec import Architecture

ARCHITECTURE = Architecture(
    name="olmo2",
    rope_neox=True,
    hf_model_types=("olmo2",),
    hf_class="Olmo2ForCausalLM",
    qk_norm="all",
    pre_norms=False,
    post_norms=True,
    swa_pattern=4,  # OLMo 3's sliding-window layers, where the metadata sets a window
    swa_rope_base=None,
)
