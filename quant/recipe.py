"""Which GGML type each tensor gets for a file type such as Q4_K_M: llama.cpp's mixing rules.

Pure functions over tensor names and shapes, so a plan can be shown (or tested) without touching
weights. The rules follow llama.cpp's `llama-quant.cpp` as of 2025 (`llama_tensor_get_type` there);
the output must pick the same type for every tensor, or the file's bytes differ from llama-quantize's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InferError
from .types import BF16, F16, F32, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, qtype


class RecipeError(InferError, ValueError):
    """A file type or tensor type option that cannot be honoured."""


@dataclass(frozen=True)
class FileType:
    name: str
    file_type: int  # the value of general.file_type (llama_ftype)
    default_type: int  # GGML type of tensors no rule singles out


FILE_TYPES: dict[str, FileType] = {
    f.name: f
    for f in (
        FileType("Q4_K_M", 15, Q4_K), FileType("Q4_K_S", 14, Q4_K),
        FileType("Q5_K_M", 17, Q5_K), FileType("Q5_K_S", 16, Q5_K),
        FileType("Q6_K", 18, Q6_K), FileType("Q8_0", 7, Q8_0),
        FileType("Q4_0", 2, Q4_0), FileType("Q5_0", 8, Q5_0),
        FileType("F16", 1, F16), FileType("BF16", 32, BF16),
        FileType("MXFP4_MOE", 38, MXFP4),  # experts MXFP4, everything else Q8_0 (_choose)
    )
}

# Types a user may name for --output-tensor-type / --token-embedding-type: those quantizers.py writes.
TENSOR_TYPE_NAMES = {qtype(t).name: t for t in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)}


def file_type(name: str) -> FileType:
    try:
        return FILE_TYPES[name.upper()]
    except KeyError:
        raise RecipeError(f"unsupported quantization type {name!r} (supported: {', '.join(FILE_TYPES)})") from None


def tensor_type(name: str) -> int:
    try:
        return TENSOR_TYPE_NAMES[name.upper()]
    except KeyError:
        raise RecipeError(f"unsupported tensor type {name!r} (supported: {', '.join(TENSOR_TYPE_NAMES)})") from None


@dataclass(frozen=True)
class ModelParams:
    """The hyperparameters llama.cpp's rules look at."""
    arch: str
    n_layer: int
    n_expert: int = 0
    n_head: int = 0
    n_head_kv: int = 0


@dataclass(frozen=True)
class RecipeOptions:
    ftype: FileType
    output_tensor_type: int | None = None
    token_embedding_type: int | None = None
    pure: bool = False
    has_imatrix: bool = False


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    src_type: int
    dst_type: int
    fallback: bool = False  # the row length forced a different type than the rules chose

    @property
    def converts(self) -> bool:
        return self.src_type != self.dst_type


_LAYER = re.compile(r"^blk\.(\d+)\.")


def _layer(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def tensor_order(names: list[str]) -> list[str]:
    """llama.cpp's tensor order (its weights map's ordering), which is also the output file's:
    by layer (-1 for tensors outside blocks), then by the name's bytes, so blk.10 follows blk.9."""
    return sorted(names, key=lambda n: (_layer(n), n.encode()))


# Substrings marking 2-D weights that llama.cpp never quantizes: they are tiny, or lookup tables
# that lose too much (conv kernels, routers, position tables, RWKV mixing vectors, vision patches).
_NEVER_QUANTIZED = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a tensor is converted at all (the rest are copied in their input type)."""
    if len(shape) < 2 or all(d == 1 for d in shape[:-1]):
        return False  # GGML counts dimensions without trailing 1s (ne order): (1, K) is a vector
    if not name.endswith("weight"):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(s in name for s in _NEVER_QUANTIZED)


# Categories, by substring as in llama.cpp (so ffn_down_exps and ffn_down_shexp count as ffn_down).
_OUTPUT, _TOKEN_EMBD, _ATTN_V, _ATTN_K, _ATTN_OUT, _FFN_DOWN, _FFN_GATE, _FFN_UP, _OTHER = range(9)


def _category(name: str) -> int:
    if name == "output.weight":
        return _OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return _TOKEN_EMBD
    if "attn_qkv.weight" in name or "attn_kv_b.weight" in name or "attn_v.weight" in name:
        return _ATTN_V  # the value projection, alone or fused: the most quantization-sensitive
    if "attn_k.weight" in name:
        return _ATTN_K
    if "attn_q.weight" in name:
        return _OTHER
    if "attn_output.weight" in name:
        return _ATTN_OUT
    if "ffn_up" in name:
        return _FFN_UP
    if "ffn_gate" in name:
        return _FFN_GATE
    if "ffn_down" in name:
        return _FFN_DOWN
    return _OTHER


def _more_bits(i: int, n: int) -> bool:
    # The first and last eighth of the layers, and every third one between, get the bigger type.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_FALLBACK = {Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0, Q2_K: Q4_0, Q3_K: Q4_0}


def _fallback(dst: int, ne0: int) -> tuple[int, bool]:
    """A type whose block fits the row length: K-quants need ne0 % 256 == 0, legacy ones % 32.
    A 32-element type has no smaller block to fall back to: F16 (llama.cpp's tensor_type_fallback)."""
    if ne0 % qtype(dst).block_size == 0:
        return dst, False
    if qtype(dst).block_size <= 32:
        return F16, True
    if dst not in _FALLBACK:
        raise RecipeError(f"no fallback type for {qtype(dst).name} with rows of {ne0}")
    alt = _FALLBACK[dst]
    return (alt if ne0 % qtype(alt).block_size == 0 else F16), True


class _State:
    def __init__(self, names: list[str], model: ModelParams):
        self.n_attention_wv = sum(1 for n in names if _category(n) == _ATTN_V)
        self.tied = "output.weight" not in names
        self.i_attention_wv = self.i_ffn_down = 0
        self.model = model


def _choose(st: _State, opts: RecipeOptions, name: str, shape: tuple[int, ...], cat: int) -> int:
    """The mixing rules proper, for a quantized default type; mutates the layer counters."""
    m, f = st.model, opts.ftype.name
    falcon = m.arch == "falcon"
    t = opts.ftype.default_type
    ne0 = shape[-1]
    if cat == _OUTPUT or (st.tied and cat == _TOKEN_EMBD):
        if opts.output_tensor_type is not None:
            return opts.output_tensor_type
        if falcon or ne0 % qtype(t).block_size or f == "MXFP4_MOE":
            return Q8_0
        return t if t == Q8_0 else Q6_K
    if f == "MXFP4_MOE":
        # Experts (3-D tensors of more than one matrix: GGML's ne[2] > 1) in MXFP4, every other
        # tensor, the untied token embeddings included, in Q8_0.  bailingmoe3's MLA projections
        # are 3-D too: there only the FFN's count as experts.
        experts = len(shape) >= 3 and shape[-3] > 1
        if m.arch == "bailingmoe3":
            experts = experts and cat in (_FFN_UP, _FFN_GATE, _FFN_DOWN)
        return MXFP4 if experts else Q8_0
    if cat == _TOKEN_EMBD:
        return opts.token_embedding_type if opts.token_embedding_type is not None else t
    if cat == _ATTN_V:
        if f in ("Q4_K_M", "Q5_K_M") and _more_bits(st.i_attention_wv, st.n_attention_wv):
            t = Q6_K
        elif f == "Q4_K_S" and st.i_attention_wv < 4:
            t = Q5_K
        if m.arch == "llama" and m.n_layer == 80 and m.n_head != m.n_head_kv and t in (Q3_K, Q4_K):
            t = Q5_K  # 70B: eight heads share each V row, so the tensor is small and worth more bits
        if m.n_expert == 8:
            t = Q8_0
        st.i_attention_wv += 1
        return t
    if cat == _ATTN_K:
        return Q8_0 if m.n_expert == 8 else t
    if cat == _FFN_DOWN:
        i, n = st.i_ffn_down, m.n_layer
        if m.n_expert > 1:
            # Expert tensors do not come in layer order in every model: take the layer from the name.
            i = _layer(name)
            if not 0 <= i < n:
                raise RecipeError(f"cannot tell the layer of {name} (model has {n} layers)")
        if f == "Q4_K_M":
            if falcon:
                t = Q6_K if i < n // 16 else Q5_K if _more_bits(i, n) else Q4_K
            elif _more_bits(i, n):
                t = Q6_K
        elif f == "Q5_K_M" and _more_bits(i, n):
            t = Q6_K
        elif f == "Q4_K_S" and not falcon and i < n // 8:
            t = Q5_K
        elif f in ("Q4_0", "Q5_0") and opts.has_imatrix and i < n // 8:
            t = Q4_1 if f == "Q4_0" else Q5_1  # with an imatrix the first ffn_down layers misbehave
        st.i_ffn_down += 1
        return t
    if cat == _ATTN_OUT and not falcon and m.n_expert == 8 and f in ("Q4_K_S", "Q4_K_M"):
        return Q5_K
    return t


def plan(tensors: list[tuple[str, tuple[int, ...], int]], model: ModelParams, opts: RecipeOptions) -> list[TensorPlan]:
    """Each tensor's target type, in output-file order. `tensors`: (name, numpy shape, stored type)."""
    by_name = {name: (tuple(shape), src) for name, shape, src in tensors}
    names = tensor_order(list(by_name))
    st = _State(names, model)
    default = opts.ftype.default_type
    quantized_default = default not in (F32, F16, BF16)
    out = []
    for name in names:
        shape, src = by_name[name]
        ne0 = shape[-1]
        cat = _category(name)
        fallback = False
        if not allows_quantization(name, shape):
            dst = src
        elif opts.token_embedding_type is not None and cat == _TOKEN_EMBD:
            dst = opts.token_embedding_type  # an explicit choice: no fallback, as in llama.cpp
        elif opts.output_tensor_type is not None and cat == _OUTPUT:
            dst = opts.output_tensor_type
        elif not quantized_default:
            dst = default
        else:
            dst = default if opts.pure else _choose(st, opts, name, shape, cat)
            dst, fallback = _fallback(dst, ne0)
        if ne0 % qtype(dst).block_size:
            raise RecipeError(f"{name}: rows of {ne0} do not fit {qtype(dst).name}'s blocks of {qtype(dst).block_size}")
        out.append(TensorPlan(name, shape, src, dst, fallback))
    return out
