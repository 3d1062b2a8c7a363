"""IBM Granite 4.0 H (Micro; Tiny and Small with experts; llama.cpp's LLM_ARCH_GRANITE_HYBRID):
Mamba-2 layers interleaved with attention layers, each followed by the gated SiLU FFN (or the
experts, below), pre-norm, with dense granite's four multipliers (granite.py: embedding_scale,
residual_scale on both blocks' outputs, attention.scale, logit_scale) (llama.cpp's
src/models/granite-hybrid.cpp, mamba-base.cpp's build_mamba2_layer).

Which layers are recurrent: those whose `attention.head_count_kv` (a value per layer) is 0. A
Mamba-2 layer: `ssm_in` gives z (I = ssm.inner_size), xBC (x, then B and C: ssm.group_count groups
of ssm.state_size each) and dt (ssm.time_step_rank heads); a depthwise causal convolution of width
ssm.conv_kernel over xBC plus `ssm_conv1d.bias` (its last width - 1 inputs the sequence's "conv"
state), SiLU; the selective scan per head with a scalar `ssm_a`, softplus(dt + `ssm_dt.bias`), the
head's group's B and C, over the sequence's "ssm" state (backends/cpu/mamba.py); plus x times
`ssm_d`; times SiLU(z); RMSNorm per group times `ssm_norm`; `ssm_out`. An attention layer is
granite's, without RoPE where rope.scaling.finetuned is false (the Granite 4.0 H models: NoPE).
llama.cpp runs only an inner size of twice n_embd.

The mixture-of-experts variants (Granite 4.0 H Tiny and Small: a file with expert_count > 0) have
experts in every layer's FFN in place of the dense one, as granite-hybrid.cpp's build_layer_ffn:
the router's softmax over all experts, the top expert_used_count, their weights renormalized to
sum 1 and never scaled (build_moe_ffn with norm_w true; expert_weights_scale and
expert_gating_func are not read), each a SiLU-gated FFN of feed_forward_length; plus, where
expert_shared_feed_forward_length > 0, a shared expert (ffn_*_shexp) of that width over every token,
its output added to the experts' as it is (no gate); the sum times residual_scale, then the residual.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT

from ..hf_files import ConvertError, Kvs
from ..limits import MAX_HEAD_DIM
from . import granite
from .decoder import Primitives, dense_layer, ffn_block
from .hf_keys import need
from .spec import Architecture
from .ssm_keys import ssm_sizes


def recurrent(get: Callable[[str, Any], Any], n_layer: int) -> dict[str, Any]:
    """The layers' kinds from the per-layer head_count_kv, the attention layers' one KV head count,
    the Mamba-2 sizes and whether attention rotates by position. ValueError for metadata that does
    not describe a granitehybrid infer runs (ModelConfig.from_metadata makes it a ModelConfigError)."""
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
    sizes = ssm_sizes(get)
    G, H, inner = sizes["ssm_group_count"], sizes["ssm_dt_rank"], sizes["ssm_inner_size"]
    if inner % H or H % G or inner // H > MAX_HEAD_DIM:
        raise ValueError(f"ssm.inner_size {inner} must be a multiple of time_step_rank {H} (heads), and the heads "
                         f"a multiple of group_count {G}")
    n_embd = int(get("embedding_length", 0) or 0)
    if inner != 2 * n_embd:  # llama.cpp asserts it (its only expansion factor)
        raise ValueError(f"ssm.inner_size {inner} must be twice embedding_length {n_embd}")
    layer_recurrent = tuple(v == 0 for v in per_layer)
    return {"layer_recurrent": layer_recurrent if any(layer_recurrent) else (), "n_head_kv": heads.pop(),
            **sizes, "mamba2": True, "rope": bool(get("rope.scaling.finetuned", True))}


# -- the HF converter (llama.cpp's GraniteHybridModel: GraniteMoeModel's keys, Mamba2Model's tensors)

def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """What llama.cpp's converter writes for GraniteMoeHybridForCausalLM: granite's keys (head_dim
    ignored; with experts, expert_count and expert_used_count: each expert intermediate_size wide)
    and the shared MLP's width where it has one, the Mamba-2 sizes from the mamba_* keys,
    head_count_kv per layer (0 for a "mamba" layer of layer_types), RoPE off
    (rope.scaling.finetuned false, context_length 2**20) when any layer is Mamba-2. Refused: what
    the converter would pad or refuse (a vocabulary not a multiple of 8) and, without experts, an
    FFN width other than the shared MLP's (llama.cpp sizes that FFN by intermediate_size)."""
    n_layer = int(need(hp, "num_hidden_layers", path))
    types = hp.get("layer_types")
    if not isinstance(types, list) or len(types) != n_layer or not set(types) <= {"mamba", "attention"}:
        raise ConvertError(f"{path}: layer_types must name each of {n_layer} layers \"mamba\" or \"attention\"")
    ff, shared = need(hp, "intermediate_size", path), hp.get("shared_intermediate_size")
    if not hp.get("num_local_experts") and ff != shared:
        raise ConvertError(f"{path}: intermediate_size {ff} differs from shared_intermediate_size {shared} "
                           "(llama.cpp sizes the shared MLP by the former)")
    if int(need(hp, "vocab_size", path)) % 8:
        raise ConvertError(f"{path}: vocab_size not a multiple of 8 (llama.cpp's converter pads it) is not supported")
    extra = granite.hf_kvs(kv, {k: v for k, v in hp.items() if k != "head_dim"}, path)
    if shared:  # GraniteMoeModel writes it where the config has a (nonzero) one
        kv.u32("{arch}.expert_shared_feed_forward_length", shared)
    d_inner = int(hp.get("mamba_expand") or 2) * int(need(hp, "hidden_size", path))
    kv.u32("{arch}.ssm.conv_kernel", need(hp, "mamba_d_conv", path))
    kv.u32("{arch}.ssm.state_size", need(hp, "mamba_d_state", path))
    kv.u32("{arch}.ssm.group_count", need(hp, "mamba_n_groups", path))
    kv.u32("{arch}.ssm.inner_size", d_inner)
    kv.u32("{arch}.ssm.time_step_rank", need(hp, "mamba_n_heads", path))
    if hp.get("attn_rotary_emb"):
        kv.u32("{arch}.rope.dimension_count", hp["attn_rotary_emb"])
    key = f"{kv.arch}.attention.head_count_kv"
    at = next(i for i, item in enumerate(kv.items) if item[0] == key)
    n_kv = kv.items[at][2]
    kv.items[at] = (key, int(VT.ARRAY), np.array([n_kv if t == "attention" else 0 for t in types], np.int32))
    use_rope = "mamba" not in types
    kv.add("{arch}.rope.scaling.finetuned", VT.BOOL, use_rope)
    if not use_rope:  # the converter's context for a model without positions, in place of the config's
        key = f"{kv.arch}.context_length"
        kv.items = [(k, t, 2**20 if k == key else v) for k, t, v in kv.items]
    return extra


def hf_text_name(name: str) -> str | None:
    """dt_bias named as the converter renames it (dt_proj.bias, gguf's ssm_dt)."""
    return name.replace(".mamba.dt_bias", ".mamba.dt_proj.bias")


def hf_tensor_parts(name: str, hp: dict[str, Any]) -> list[tuple[str, range]] | None:
    """The converter's splits and renames (GraniteMoeModel.modify_tensors): the experts'
    input_linear (experts, 2 intermediate_size, hidden) into gate_exps, then up_exps; the shared
    MLP's input_linear into gate, then up: the shared expert's (ffn_*_shexp) beside experts, else
    the dense FFN's, whose down projection its output_linear (whole) then is. Names as the HF
    layouts that gguf's table maps to those tensors."""
    experts = bool(hp.get("num_local_experts"))
    for suffix, ff, kind in ((".block_sparse_moe.input_linear.weight", "intermediate_size", "mlp.experts."),
                             (".shared_mlp.input_linear.weight", "shared_intermediate_size",
                              "mlp.shared_expert." if experts else "mlp.")):
        if name.endswith(suffix):
            n, base = int(hp[ff]), name[:-len(suffix)] + "."
            return [(base + kind + "gate_proj.weight", range(n)), (base + kind + "up_proj.weight", range(n, 2 * n))]
    if name.endswith(".shared_mlp.output_linear.weight") and not experts:
        base = name[:-len("shared_mlp.output_linear.weight")]
        return [(base + "mlp.down_proj.weight", range(int(hp["hidden_size"])))]
    return None


def _mamba_shape(name: str, hp: dict[str, Any]) -> tuple[int, ...] | None:
    if name.endswith((".mamba.A_log", ".mamba.D")):
        return (int(hp["mamba_n_heads"]), 1)  # unsqueezed, as Mamba-1's A
    if name.endswith(".mamba.norm.weight"):
        g = int(hp["mamba_n_groups"])
        return (g, int(hp.get("mamba_expand") or 2) * int(hp["hidden_size"]) // g)
    return None


def hf_tensor_steps(name: str, hp: dict[str, Any]) -> list[Callable[[np.ndarray], np.ndarray]]:
    """A = -exp(A_log); A, D and the grouped norm reshaped (hf_tensor_shape). Applied to the tensor
    as converted so far (1-D ones float32 already)."""
    shape = _mamba_shape(name, hp)
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    if name.endswith(".mamba.A_log"):
        steps.append(lambda w: -np.exp(w.astype(np.float32)))
    if shape is not None:
        steps.append(lambda w: np.ascontiguousarray(w.reshape(shape)))
    return steps


def hf_tensor_shape(name: str, shape: tuple[int, ...], hp: dict[str, Any]) -> tuple[int, ...]:
    new = _mamba_shape(name, hp)
    if new is None:
        return shape
    if int(np.prod(shape)) != int(np.prod(new)):
        raise ConvertError(f"{name} has shape {shape}, expected {int(np.prod(new))} values")
    return new


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
    experts="optional",
    shared_expert="plain",
    hf_model_types=("granitemoehybrid",),
    hf_class="GraniteMoeHybridForCausalLM",
    hf_permute_qk=True,
    hf_kvs=hf_kvs,
    hf_text_name=hf_text_name,
    hf_conv_kernels=("mamba.conv1d.weight",),
    hf_tensor_steps=hf_tensor_steps,
    hf_tensor_shape=hf_tensor_shape,
    hf_tensor_parts=hf_tensor_parts,
    scalars=granite.scalars,
    extra_biases=("ssm_dt.bias", "ssm_conv1d.bias"),
    recurrent=recurrent,
    recurrent_kind="Mamba-2",
    layer=layer,
)
