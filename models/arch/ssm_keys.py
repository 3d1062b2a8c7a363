"""llama.cpp's SSM hyperparameters (LLM_KV_SSM_*: `ssm.conv_kernel`, `ssm.state_size`,
`ssm.group_count`, `ssm.time_step_rank`, `ssm.inner_size`), which every architecture with such
recurrent layers writes with its own meaning (qwen35: key heads, value heads, head size; granitehybrid:
Mamba-2 groups, heads, state size): read and range-checked once here, each architecture checking how
they fit together."""
from __future__ import annotations

from typing import Any, Callable

from ..limits import MAX_CONV_WIDTH, MAX_HEAD_DIM, MAX_WIDTH

# each key and the ModelConfig field it becomes
SSM_KEYS = (("ssm.conv_kernel", "ssm_conv_kernel"), ("ssm.state_size", "ssm_state_size"),
            ("ssm.group_count", "ssm_group_count"), ("ssm.time_step_rank", "ssm_dt_rank"),
            ("ssm.inner_size", "ssm_inner_size"))


def ssm_sizes(get: Callable[[str, Any], Any]) -> dict[str, int]:
    """The five sizes as ModelConfig fields; ValueError where one is missing, not one number, or out
    of range (ModelConfig.from_metadata makes it a ModelConfigError)."""
    sizes = {}
    for key, field in SSM_KEYS:
        v = get(key, None)
        if v is None or hasattr(v, "__len__"):
            raise ValueError(f"{key} is missing (one number)")
        sizes[field] = int(v)
    if not 2 <= sizes["ssm_conv_kernel"] <= MAX_CONV_WIDTH:
        raise ValueError(f"ssm.conv_kernel {sizes['ssm_conv_kernel']} is out of range (2..{MAX_CONV_WIDTH})")
    n, g, h, inner = sizes["ssm_state_size"], sizes["ssm_group_count"], sizes["ssm_dt_rank"], sizes["ssm_inner_size"]
    if not (1 <= n <= MAX_HEAD_DIM and 1 <= g <= 4096 and 1 <= h <= 4096 and 1 <= inner <= MAX_WIDTH):
        raise ValueError(f"ssm.state_size {n}, group_count {g}, time_step_rank {h}, inner_size {inner} "
                         "are out of range")
    return sizes
