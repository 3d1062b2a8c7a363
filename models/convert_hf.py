"""Hugging Face checkpoints (config.json + *.safetensors + tokenizer files) as a SourceModel.

The output is what llama.cpp's convert_hf_to_gguf.py would write for the same folder: the same
GGUF metadata keys, GGUF tensor names (HF names are mapped once, here, with gguf's TensorNameMap)
and the same per-architecture tensor transforms, so a GGUF made from it loads in llama.cpp and in
infer alike. Tensors stay lazy: each SourceTensor reads its bytes from a memory map of the
safetensors file only when the writer asks for them.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

from .arch import architecture, for_hf_model_type
from .arch.hf_keys import check_hparams, generic_kvs
from .hf_files import (
    ST_DTYPES,
    ConvertError,
    ConvertWarning,
    Kvs,
    StEntry,
    read_json,
    read_safetensors_header,
    st_array,
)
from .hf_vocab import UNUSED, bpe_vocab, detect_pre_tokenizer, special_kvs, spm_vocab
from .source import SourceModel, SourceTensor

__all__ = ["ConvertError", "ConvertWarning", "TensorNamer", "detect_pre_tokenizer",
           "source_from_hf", "write_gguf_unquantized"]

logger = logging.getLogger(__name__)



def text_hparams(config: dict[str, Any], path: Path) -> tuple[str, dict[str, Any]]:
    """The GGUF architecture a config.json converts to, and its text model's hyperparameters."""
    arch = for_hf_model_type(config.get("model_type"), path)
    return arch.name, check_hparams((arch.hf_text_hparams or dict)(config), path)


def hparam_kvs(arch: str, hp: dict[str, Any], name: str, path: Path) -> tuple[Kvs, dict[str, np.ndarray]]:
    """The keys llama.cpp's converter writes for `arch`, and the float32 tensors it makes from the
    config (rope_freqs; LongRoPE's rope_factors_long/short), by GGUF name."""
    kv = Kvs(arch)
    kv.add("general.architecture", VT.STRING, arch)
    kv.add("general.name", VT.STRING, name)
    return kv, (architecture(arch).hf_kvs or generic_kvs)(kv, hp, path)


# ----------------------------------------------------------------------------- tensors

def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (what torch does when it stores a bf16 result)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def to_f32(data: np.ndarray, type_id: int) -> np.ndarray:
    if type_id == GT.BF16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF Llama stores Q/K rows so that RoPE rotates (x[i], x[i + d/2]) pairs; llama.cpp's llama
    rotates adjacent (x[2i], x[2i+1]) pairs, so each head's two halves are interleaved back."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConvertError(f"cannot split {rows} Q/K rows into {n_head} heads for the RoPE permutation")
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_rope_rows: llama.cpp's Q/K row order back to HF Llama's."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConvertError(f"cannot split {rows} Q/K rows into {n_head} heads for the RoPE permutation")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Matrices llama.cpp's converter always writes as float32 (its prepare_tensors: FFN_GATE_INP,
# FFN_GATE_INP_SHEXP): the experts' routers and the shared expert's gate.
_F32_ROUTERS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")

_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


class TensorNamer:
    """HF checkpoint tensor names -> GGUF names for one architecture (gguf's TensorNameMap, the table
    llama.cpp's converter uses). `gguf_name` gives None for tensors that are not converted (vision
    tower, rotary caches) and raises ConvertError for names the architecture does not have."""

    def __init__(self, arch: str, n_layer: int):
        self.arch = arch
        self._text_name = architecture(arch).hf_text_name
        # by the GGUF name (granitehybrid's enum member is GRANITE_HYBRID)
        member = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), None)
        if member is None:
            raise ConvertError(f"the installed gguf package has no tensor names for architecture {arch!r}")
        self._map = gguf.get_tensor_name_map(member, n_layer)

    def text_name(self, name: str) -> str | None:
        """The text model's HF name of a checkpoint tensor (multimodal prefixes removed), or None."""
        if self._text_name is not None:
            name = self._text_name(name)
        return None if name is None or _IGNORED.search(name) else name

    def gguf_name(self, name: str, where: Path) -> str | None:
        text = self.text_name(name)
        if text is None:
            return None
        # .scale: a matrix's scale vector under its name (gemma4's router and experts)
        out = self._map.get_name(text, try_suffixes=(".weight", ".bias", ".scale"))
        if out is None:
            raise ConvertError(f"{where}: cannot map tensor {name!r} to a GGUF name for {self.arch}")
        return out


def _collect_tensors(folder: Path, arch: str, hp: dict[str, Any], n_vocab_tokens: int,
                     extra: dict[str, np.ndarray]) -> tuple[list[SourceTensor], int]:
    """The GGUF tensors (lazy) and the embedding row count."""
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ConvertError(f"{folder}: no model.safetensors (or model-*-of-*.safetensors) weights file")
    entries: dict[str, StEntry] = {}
    for f in files:
        for name, e in read_safetensors_header(f).items():
            entries[name] = e
    n_layer = int(hp["num_hidden_layers"])
    namer = TensorNamer(arch, n_layer)
    n_head = int(hp["num_attention_heads"])
    n_head_kv = int(hp.get("num_key_value_heads") or n_head)
    spec = architecture(arch)
    tied = bool(hp.get("tie_word_embeddings", spec.hf_tied_default))

    out: list[SourceTensor] = []
    n_embd_rows = None
    experts: dict[tuple[str, str], dict[int, tuple[str, StEntry]]] = {}
    for hf_name, e in entries.items():
        name = namer.text_name(hf_name)
        if name is None:
            continue
        m = _EXPERT.match(name)
        if m:  # one expert's matrix: stacked with the others below
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = (hf_name, e)
            continue
        m = _FUSED_EXPERTS.match(name)
        if m:  # every expert's matrices in one tensor already
            out += _fused_experts(namer, m[1], m[2], e, hf_name, spec.hf_experts_transposed)
            continue
        if name == "lm_head.weight" and tied:
            continue  # tied embeddings: llama.cpp reuses token_embd.weight as the output matrix
        parts = spec.hf_tensor_parts(name, hp) if spec.hf_tensor_parts is not None else None
        if parts:
            out += [_row_part(namer, part, rows, e, hf_name, spec, hp) for part, rows in parts]
            continue
        gguf_name = namer.gguf_name(hf_name, e.path)
        if e.dtype not in ST_DTYPES:
            st_array(e, hf_name)  # raises the dtype error
        type_id = int(ST_DTYPES[e.dtype][1])
        shape = e.shape
        steps: list[Callable[[np.ndarray], np.ndarray]] = []
        heads = permuted_heads(spec, name, n_head, n_head_kv)
        if heads:
            steps.append(lambda w, h=heads: permute_rope_rows(w, h))
        if gguf_name == "token_embd.weight":
            n_embd_rows = shape[0]
            if spec.hf_trim_embeddings and shape[0] > n_vocab_tokens:
                # Gemma 3 embeddings have rows past the tokenizer's vocabulary (the image tokens'
                # padding); llama.cpp keeps only the rows that have a token.
                n = n_vocab_tokens
                steps.append(lambda w, n=n: w[:n])
                shape = (n, *shape[1:])
                n_embd_rows = n
        out_type = type_id
        if spec.hf_conv_kernels and name.endswith(spec.hf_conv_kernels):
            if len(shape) != 3 or shape[1] != 1:
                raise ConvertError(f"{e.path}: {hf_name} has shape {tuple(shape)}, expected (channels, 1, width)")
            shape = (shape[0], shape[2])
            out_type = int(GT.F32)
            steps.append(lambda w, t=type_id, s=shape: np.ascontiguousarray(to_f32(w, t).reshape(s), np.float32))
        elif len(shape) == 1:
            # llama.cpp writes every 1-D tensor (norms, biases) as F32. Gemma stores its RMSNorm
            # weights as (w - 1): adding 1 here lets the runtime use the plain x * w norm; the sum is
            # rounded to the checkpoint's dtype first, as the converter's torch arithmetic does.
            shift = spec.hf_norm_shift and name.endswith("norm.weight") and not name.endswith(spec.hf_norm_shift_except)
            out_type = int(GT.F32)
            steps.append(lambda w, t=type_id, s=shift: norm_f32(w, t, s))
        elif gguf_name.endswith(_F32_ROUTERS):
            out_type = int(GT.F32)
            steps.append(lambda w, t=type_id: np.ascontiguousarray(to_f32(w, t), np.float32))
        if spec.hf_tensor_steps is not None:
            steps += spec.hf_tensor_steps(name, hp)
        if spec.hf_tensor_shape is not None:
            shape = spec.hf_tensor_shape(name, tuple(shape), hp)
        out.append(SourceTensor(gguf_name, tuple(shape), out_type, _loader(e, hf_name, steps)))
    out += [_stacked_experts(namer, prefix, w, parts, folder) for (prefix, w), parts in experts.items()]
    if n_embd_rows is None:
        raise ConvertError(f"{folder}: the weights have no embedding tensor (model.embed_tokens.weight)")
    for name, a in extra.items():  # tensors the converter makes (rope_freqs, LongRoPE's factors)
        out.append(SourceTensor(name, a.shape, int(GT.F32), lambda a=a: a))
    return out, n_embd_rows


def _row_part(namer: TensorNamer, part: str, rows: Sequence[int], e: StEntry, hf_name: str, spec: Any,
              hp: dict[str, Any]) -> SourceTensor:
    """The given rows of a checkpoint matrix (of each expert's, in a 3-D tensor of experts), in that
    order, converted as if the checkpoint named them `part` (with the architecture's steps and shape
    for that name: deepseek2's per-head attn_k_b, transposed)."""
    if e.dtype not in ST_DTYPES:
        st_array(e, hf_name)  # raises the dtype error
    idx = np.asarray(rows, dtype=np.int64)
    if len(e.shape) not in (2, 3) or not idx.size or idx.min() < 0 or idx.max() >= e.shape[-2]:
        raise ConvertError(f"{e.path}: {hf_name} has shape {tuple(e.shape)}: no rows "
                           f"{idx.min(initial=0)}..{idx.max(initial=0)} to convert as {part}")
    shape: tuple[int, ...] = (*e.shape[:-2], idx.size, e.shape[-1])
    steps: list[Callable[[np.ndarray], np.ndarray]] = [lambda w: np.ascontiguousarray(w[..., idx, :])]
    if spec.hf_tensor_steps is not None:
        steps += spec.hf_tensor_steps(part, hp)
    if spec.hf_tensor_shape is not None:
        shape = spec.hf_tensor_shape(part, shape, hp)
    return SourceTensor(namer.gguf_name(part, e.path), shape, int(ST_DTYPES[e.dtype][1]), _loader(e, hf_name, steps))


# All of a layer's experts in one tensor (transformers 5's layout):
# gate_up_proj (experts, 2 * ff, embd), each expert's gate rows then its up rows, and down_proj
# (experts, embd, ff); llama.cpp's Qwen2MoeModel splits the first in two and renames them. Llama 4
# stores them transposed (feed_forward.experts: (experts, embd, 2 * ff) and (experts, ff, embd)),
# which its Llama4Model transposes back before the same split.
_FUSED_EXPERTS = re.compile(
    r"^((?:model\.)?layers\.\d+\.(?:mlp|feed_forward)\.experts)\.(gate_up_proj|down_proj)(?:\.weight)?$")


def _fused_experts(namer: TensorNamer, prefix: str, kind: str, e: StEntry, hf_name: str,
                   transposed: bool = False) -> list[SourceTensor]:
    if e.dtype not in ST_DTYPES:
        st_array(e, hf_name)  # raises the dtype error
    shape, type_id = tuple(e.shape), int(ST_DTYPES[e.dtype][1])
    if transposed and len(shape) == 3:
        shape = (shape[0], shape[2], shape[1])
    turn: list[Callable[[np.ndarray], np.ndarray]] = [lambda a: a.swapaxes(1, 2)] if transposed else []
    if len(shape) != 3 or kind == "gate_up_proj" and shape[1] % 2:
        raise ConvertError(f"{e.path}: {hf_name} has shape {shape}, expected (experts, rows, columns)"
                           + (" with an even row count (gate, then up)" if kind == "gate_up_proj" else ""))
    if kind == "down_proj":
        return [SourceTensor(namer.gguf_name(f"{prefix}.down_proj.weight", e.path), shape, type_id,
                             _loader(e, hf_name, [*turn, np.ascontiguousarray]))]
    ff = shape[1] // 2
    return [SourceTensor(namer.gguf_name(f"{prefix}.{w}.weight", e.path), (shape[0], ff, shape[2]), type_id,
                         _loader(e, hf_name, [*turn, lambda a, lo=lo: np.ascontiguousarray(a[:, lo:lo + ff])]))
            for w, lo in (("gate_proj", 0), ("up_proj", ff))]


# One expert's matrix in a mixture-of-experts checkpoint (qwen3moe: mlp.experts.E.gate_proj; Mixtral:
# block_sparse_moe.experts.E.w1; lfm2moe: feed_forward.experts.E.w1, without model. as its
# hf_text_name gives it): llama.cpp's converter stacks each layer's into one 3-D tensor.
_EXPERT = re.compile(r"^((?:model\.)?layers\.\d+\.(?:mlp|block_sparse_moe|feed_forward)\.experts)\.(\d+)\.(\w+)\.weight$")


def _stacked_experts(namer: TensorNamer, prefix: str, w: str, parts: dict[int, tuple[str, StEntry]],
                     folder: Path) -> SourceTensor:
    """The (n_expert, rows, cols) tensor of one layer's experts' `w` matrices, stacked in expert order."""
    if sorted(parts) != list(range(len(parts))):
        raise ConvertError(f"{folder}: {prefix}: experts {sorted(parts)} are not 0..{len(parts) - 1}")
    entries = [parts[i][1] for i in range(len(parts))]
    if len({(e.dtype, tuple(e.shape)) for e in entries}) != 1 or entries[0].dtype not in ST_DTYPES:
        raise ConvertError(f"{folder}: {prefix}.*.{w}: the experts' matrices differ in dtype or shape")
    name = namer.gguf_name(f"{prefix}.{w}.weight", entries[0].path)
    names = [parts[i][0] for i in range(len(parts))]

    def load() -> np.ndarray:
        return np.stack([st_array(e, n) for e, n in zip(entries, names)])

    return SourceTensor(name, (len(parts), *entries[0].shape), int(ST_DTYPES[entries[0].dtype][1]), load)


def permuted_heads(spec, hf_name: str, n_head: int, n_head_kv: int) -> int:
    """The head count to interleave a HF Q/K tensor's rows by (permute_rope_rows), or 0 if it keeps them."""
    if not spec.hf_permute_qk:
        return 0
    if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return n_head
    if hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return n_head_kv
    return 0


def norm_f32(w: np.ndarray, type_id: int, shift: bool) -> np.ndarray:
    x = to_f32(w, type_id)
    if shift:
        x = x + np.float32(1.0)
        if type_id == GT.BF16:
            x = to_f32(bf16_round(x), GT.BF16)
        elif type_id == GT.F16:
            x = x.astype(np.float16).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def _loader(e: StEntry, name: str, steps: list[Callable[[np.ndarray], np.ndarray]]) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        data = st_array(e, name)
        for step in steps:
            data = step(data)
        return data
    return load


# ----------------------------------------------------------------------------- entry point

def source_from_hf(folder: str | Path) -> SourceModel:
    """A Hugging Face checkpoint folder of a registered architecture (models/arch) as GGUF metadata + lazy tensors."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConvertError(f"{folder}: not a directory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConvertError(f"{config_path}: no such file (a Hugging Face model folder needs config.json)")
    arch, hp = text_hparams(read_json(config_path, "model config"), config_path)
    kv, extra = hparam_kvs(arch, hp, folder.resolve().name, config_path)

    # Tokenizer first (it fixes the vocabulary size), but the tensors decide the row count.
    has_spm, has_json = (folder / "tokenizer.model").is_file(), (folder / "tokenizer.json").is_file()
    spec = architecture(arch)
    use_spm = has_spm and spec.hf_spm  # llama.cpp prefers SentencePiece for these
    if not use_spm and not has_json:
        wanted = "tokenizer.model or tokenizer.json" if spec.hf_spm else "tokenizer.json"
        raise ConvertError(f"{folder}: no tokenizer ({wanted} is missing)")
    tok_kv = Kvs(arch)
    if use_spm:
        tokens, scores, types, add_prefix = spm_vocab(folder)
        tensors, n_rows = _collect_tensors(folder, arch, hp, len(tokens), extra)
        for i in range(len(tokens), n_rows):  # pad the vocabulary to the embedding rows, as llama.cpp does
            tokens.append(f"[PAD{i}]")
            scores.append(-1000.0)
            types.append(UNUSED)
        n_tokens = len(tokens)
        tok_kv.add("tokenizer.ggml.model", VT.STRING, "llama")
        tok_kv.add("tokenizer.ggml.pre", VT.STRING, "default")
        tok_kv.add("tokenizer.ggml.tokens", VT.ARRAY, tokens)
        # Numeric arrays as numpy arrays: their dtype is the GGUF element type (the pipeline's convention).
        tok_kv.add("tokenizer.ggml.scores", VT.ARRAY, np.asarray(scores, dtype=np.float32))
        tok_kv.add("tokenizer.ggml.token_type", VT.ARRAY, np.asarray(types, dtype=np.int32))
        # Gemma's SentencePiece model has add_dummy_prefix off; llama.cpp also forces it off for gemma.
        tok_kv.add("tokenizer.ggml.add_space_prefix", VT.BOOL, add_prefix and spec.hf_space_prefix)
    elif spec.hf_vocab is not None:  # the architecture's own reading of tokenizer.json (gemma4)
        n_tokens = spec.hf_vocab(folder, tok_kv)
        tensors, n_rows = _collect_tensors(folder, arch, hp, n_tokens, extra)
    else:
        tensors, n_rows = _collect_tensors(folder, arch, hp, 1 << 62, extra)
        n_tokens = bpe_vocab(folder, tok_kv, n_rows)
    if n_tokens != n_rows:
        raise ConvertError(
            f"{folder}: the tokenizer has {n_tokens} tokens but the embedding has {n_rows} rows"
        )
    special_kvs(folder, tok_kv, n_tokens, spec.hf_special_tokens)
    return SourceModel(arch=arch, kvs=kv.items + tok_kv.items, tensors=tensors)


def write_gguf_unquantized(folder: str | Path, out_path: str | Path) -> Path:
    """Convert `folder` to a GGUF with the checkpoint's own float types (tests, debugging)."""
    src = source_from_hf(folder)
    out_path = Path(out_path)
    w = gguf.GGUFWriter(str(out_path), src.arch)
    for key, vtype, value in src.kvs:
        if key == "general.architecture":
            continue  # GGUFWriter writes it from the arch it was given
        sub = None
        if vtype == VT.ARRAY:
            if isinstance(value, np.ndarray):
                sub = {np.dtype(np.float32): VT.FLOAT32, np.dtype(np.int32): VT.INT32, np.dtype(np.bool_): VT.BOOL}[value.dtype]
                value = value.tolist()
            else:
                sub = VT.STRING
        w.add_key_value(key, value, VT(vtype), sub_type=sub)
    for t in src.tensors:
        data = np.ascontiguousarray(t.load())
        if t.type_id == GT.BF16:
            w.add_tensor(t.name, data.view(np.uint16), raw_dtype=GT.BF16)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
