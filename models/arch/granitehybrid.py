"""IBM Granite 4.0 H (llama.cpp's LLM_ARCH_GRANITE_HYBRID): Mamba-2 layers interleaved with
attention layers, each followed by the gated SiLU FFN, pre-norm, with dense granite's four
multipliers (granite.py: embedding_scale, residual_scale on both blocks' outputs, attention.scale,
logit_scale) (llama.cpp's src/models/granite-hybrid.cpp, mamba-base.cpp's build_mamba2_layer).

Which layers are recurrent: those whose `attention.head_count_kv` (a value per layer) is 0. A
Mamba-2 layer: `ssm_in` gives z (I = ssm.inner_size), xBC (x, then B and C: ssm.group_count groups
of ssm.state_size each) and dt (ssm.time_step_rank heads); a depthwise causal convolution of width
ssm.conv_kernel over xBC plus `ssm_conv1d.bias` (its last width - 1 inputs the sequence's "conv"
state), SiLU; the selective scan per head with a scalar `ssm_a`, softplus(dt + `ssm_dt.bias`), the
head's group's B and C, over the sequence's "ssm" state (backends/cpu/mamba.py); plus x times
`ssm_d`; times SiLU(z); RMSNorm per group times `ssm_norm`; `ssm_out`. An attention layer is
granite's, without RoPE where rope.scaling.finetuned is false (the Granite 4.0 H models: NoPE).
llama.cpp runs only an inner size of twice n_embd. The mixture-of-experts variants (Granite 4.0
H Tiny and Small: experts and a shared expert) are refused for now (a follow-up).
"""
from __future__ import annotations

from typing import Any, Callable

from ..limits import MAX_CONV_WIDTH, MAX_HEAD_DIM, MAX_WIDTH
from .decoder import Primitives, dense_layer, ffn_block
from .granite import scalars
from .spec import Architecture


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """The layers' kinds from the per-layer head_count_kv, the attention layers' one KV head count,
    the Mamba-2 sizes and whether attention rotates by position. ValueError for metadata that does
    not describe a granitehybrid infer runs (ModelConfig.from_metadata makes it a ModelConfigError)."""
    if int(get("expert_count", 0) or 0):
        raise ValueError("the mixture-of-experts variant (expert_count > 0) is not supported yet")
    kv = get("attention.head_count_kv", None)
    if kv is None:
        raise ValueError("attention.head_count_kv is missing (a value per layer, 0 for a Mamba-2 layer)")
    per_layer = [int(v) for v in kv] if hasattr(kv, "__len__") and not isinstance(kv, str) else [int(kv)] * n_layer
    if len(per_layer) != n_layer:
        raise ValueError(f"attention.head_count_kv has {len(per_layer)} values for {n_layer} layers")
    heads = {v for v in per_layer if v}
    if len(heads) != 1 or min(per_layer) < 0:
        raise ValueError(f"attention.head_count_kv {per_layer} must give the attention layers one positive KV "
                         "head count (and 0 to the Mamba-2 layers)")
    sizes = {}
    for key, field in (("ssm.conv_kernel", "ssm_conv_kernel"), ("ssm.state_size", "ssm_state_size"),
                       ("ssm.group_count", "ssm_group_count"), ("ssm.time_step_rank", "ssm_dt_rank"),
                       ("ssm.inner_size", "ssm_inner_size")):
        v = get(key, None)
        if v is None or hasattr(v, "__len__"):
            raise ValueError(f"{key} is missing (one number)")
        sizes[field] = int(v)
    if not 2 <= sizes["ssm_conv_kernel"] <= MAX_CONV_WIDTH:
        raise ValueError(f"ssm.conv_kernel {sizes['ssm_conv_kernel']} is out of range (2..{MAX_CONV_WIDTH})")
    N, G, H, inner = sizes["ssm_state_size"], sizes["ssm_group_count"], sizes["ssm_dt_rank"], sizes["ssm_inner_size"]
    if not (1 <= N <= MAX_HEAD_DIM and 1 <= G <= 4096 and 1 <= H <= 4096 and 1 <= inner <= MAX_WIDTH):
        raise ValueError(f"ssm.state_size {N}, group_count {G}, time_step_rank {H}, inner_size {inner} "
                         "are out of range")
    if inner % H or H % G or inner // H > MAX_HEAD_DIM:
        raise ValueError(f"ssm.inner_size {inner} must be a multiple of time_step_rank {H} (heads), and the heads "
                         f"a multiple of group_count {G}")
    n_embd = int(get("embedding_length", 0) or 0)
    if inner != 2 * n_embd:  # llama.cpp asserts it (its only expansion factor)
        raise ValueError(f"ssm.inner_size {inner} must be twice embedding_length {n_embd}")
    layer_recurrent = tuple(v == 0 for v in per_layer)
    return {"layer_recurrent": layer_recurrent if any(layer_recurrent) else (), "n_head_kv": heads.pop(),
            **sizes, "mamba2": True, "rope": bool(get("rope.scaling.finetuned", True))}


def layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """A Mamba-2 layer (a layer with an ssm_in product) or granite's attention layer, then the FFN."""
    if not ly.ssm_in:
        return dense_layer(ops, ly, il, x, h, nxt)
    proj = ops.linear(ly.ssm_in, h, "ssm_in", il)  # z | xBC | dt
    y = ops.mamba2(proj, ly, il)
    o = ops.linear(ly.ssm_out, y, "mamba_out", il)
    return ffn_block(ops, ly, il, x, o, nxt)


ARCHITECTURE = Architecture(
    name="granitehybrid",
    rope_neox=False,
    scalars=scalars,
    extra_biases=("ssm_dt.bias", "ssm_conv1d.bias"),
    recurrent=recurrent,
    recurrent_kind="Mamba-2",
    layer=layer,
)
