"""Hugging Face checkpoints (config.json + *.safetensors + tokenizer files) as a SourceModel.

The output is what llama.cpp's convert_hf_to_gguf.py would write for the same folder: the same
GGUF metadata keys, GGUF tensor names (HF names are mapped once, here, with gguf's TensorNameMap)
and the same per-architecture tensor transforms, so a GGUF made from it loads in llama.cpp and in
infer alike. Tensors stay lazy: each SourceTensor reads its bytes from a memory map of the
safetensors file only when the writer asks for them.
"""
from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

from .hf_files import (ST_DTYPES, ConvertError, ConvertWarning, Kvs, StEntry, read_json, read_safetensors_header,
                       st_array)
from .hf_vocab import UNUSED, bpe_vocab, detect_pre_tokenizer, special_kvs, spm_vocab
from .source import SourceModel, SourceTensor

__all__ = ["ConvertError", "ConvertWarning", "SUPPORTED_HF_MODELS", "TensorNamer", "detect_pre_tokenizer",
           "source_from_hf", "write_gguf_unquantized"]

logger = logging.getLogger(__name__)

SUPPORTED_HF_MODELS = ("llama", "qwen2", "qwen3", "gemma3")
# config.json model_type -> GGUF architecture
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3", "gemma3_text": "gemma3"}
GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
             "qwen3": gguf.MODEL_ARCH.QWEN3, "gemma3": gguf.MODEL_ARCH.GEMMA3}


def text_hparams(config: dict[str, Any], path: Path) -> tuple[str, dict[str, Any]]:
    model_type = config.get("model_type")
    if model_type == "gemma3" and isinstance(config.get("text_config"), dict):
        # Multimodal Gemma 3: the language model's hyperparameters are in text_config; the vision
        # tower is not converted (llama.cpp puts it in a separate mmproj file).
        hp = dict(config["text_config"])
        for key in ("tie_word_embeddings",):
            hp.setdefault(key, config.get(key, True))
        return "gemma3", hp
    if model_type not in MODEL_TYPES:
        raise ConvertError(
            f"{path}: unsupported model_type {model_type!r} "
            f"(supported: {', '.join(SUPPORTED_HF_MODELS)}; architectures "
            "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM)"
        )
    return MODEL_TYPES[model_type], dict(config)


def _need(hp: dict[str, Any], key: str, path: Path) -> Any:
    if hp.get(key) is None:
        raise ConvertError(f"{path}: missing hyperparameter {key!r}")
    return hp[key]


def _rope_scaling(hp: dict[str, Any]) -> dict[str, Any] | None:
    # transformers >= 4.56 renamed rope_scaling to rope_parameters (which also carries rope_theta)
    rs = hp.get("rope_scaling") or hp.get("rope_parameters")
    if not isinstance(rs, dict):
        return None
    kind = rs.get("rope_type", rs.get("type"))
    return None if kind in (None, "default") else {**rs, "rope_type": kind}


def _rope_theta(hp: dict[str, Any], default: float | None) -> float | None:
    if hp.get("rope_theta") is not None:
        return float(hp["rope_theta"])
    rp = hp.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return default


def llama3_rope_factors(rs: dict[str, Any], base: float, n_rot: int) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's RoPE scaling (Meta's published rule): low frequencies
    are stretched by `factor`, high ones kept, the band between interpolated. llama.cpp takes them
    as the rope_freqs tensor."""
    factor = float(rs.get("factor", 8.0))
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    out = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, out)
    out = np.where(wavelen > old_ctx / low, factor, out)
    return out.astype(np.float32)


def hparam_kvs(arch: str, hp: dict[str, Any], name: str, path: Path) -> tuple[Kvs, np.ndarray | None]:
    """The keys llama.cpp's converter writes for `arch`, and Llama 3.1's rope_freqs if any."""
    kv = Kvs(arch)
    kv.add("general.architecture", VT.STRING, arch)
    kv.add("general.name", VT.STRING, name)
    n_embd = int(_need(hp, "hidden_size", path))
    n_head = int(_need(hp, "num_attention_heads", path))
    n_head_kv = int(hp.get("num_key_value_heads") or n_head)
    head_dim = hp.get("head_dim")
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ConvertError(f"{path}: head counts {n_head}/{n_head_kv} are not a valid grouped-query layout")
    rope_factors = None
    if arch == "gemma3":
        # Gemma 3 configs leave some fields at their transformers defaults, which llama.cpp also assumes.
        head_dim = int(hp.get("head_dim", 256))
        kv.u32("{arch}.context_length", hp.get("max_position_embeddings", 131072))
        kv.u32("{arch}.embedding_length", n_embd)
        kv.u32("{arch}.block_count", _need(hp, "num_hidden_layers", path))
        kv.u32("{arch}.feed_forward_length", _need(hp, "intermediate_size", path))
        kv.u32("{arch}.attention.head_count", n_head)
        kv.f32("{arch}.attention.layer_norm_rms_epsilon", hp.get("rms_norm_eps", 1e-6))
        kv.u32("{arch}.attention.key_length", head_dim)
        kv.u32("{arch}.attention.value_length", head_dim)
        kv.f32("{arch}.rope.freq_base", _rope_theta(hp, 1_000_000.0))
        if hp.get("rope_local_base_freq") is not None:
            kv.f32("{arch}.rope.freq_base_swa", hp["rope_local_base_freq"])
        kv.u32("{arch}.attention.sliding_window", _need(hp, "sliding_window", path))
        kv.u32("{arch}.attention.head_count_kv", n_head_kv)
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if hp.get(key) is not None:
                kv.f32("{arch}." + key, hp[key])
        rs = _rope_scaling(hp)
        if rs is not None:
            if rs["rope_type"] != "linear":
                raise ConvertError(f"{path}: gemma3 RoPE scaling {rs['rope_type']!r} is not supported (linear only)")
            kv.add("{arch}.rope.scaling.type", VT.STRING, "linear")
            kv.f32("{arch}.rope.scaling.factor", rs["factor"])
        return kv, None

    n_ctx = next((hp[k] for k in ("max_position_embeddings", "n_ctx", "n_positions", "max_length")
                  if hp.get(k) is not None), None)
    if n_ctx is not None:
        kv.u32("{arch}.context_length", n_ctx)
    kv.u32("{arch}.embedding_length", n_embd)
    kv.u32("{arch}.block_count", _need(hp, "num_hidden_layers", path))
    kv.u32("{arch}.feed_forward_length", _need(hp, "intermediate_size", path))
    kv.u32("{arch}.attention.head_count", n_head)
    kv.u32("{arch}.attention.head_count_kv", n_head_kv)
    theta = _rope_theta(hp, None)
    if theta is not None:
        kv.f32("{arch}.rope.freq_base", theta)
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", _need(hp, "rms_norm_eps", path))
    if head_dim is not None:
        kv.u32("{arch}.attention.key_length", head_dim)
        kv.u32("{arch}.attention.value_length", head_dim)
    if arch == "llama":
        kv.u32("{arch}.vocab_size", _need(hp, "vocab_size", path))
        n_rot = int(head_dim) if head_dim is not None else n_embd // n_head
        kv.u32("{arch}.rope.dimension_count", n_rot)
    else:
        n_rot = int(head_dim) if head_dim is not None else n_embd // n_head
    rs = _rope_scaling(hp)
    if rs is not None:
        kind = rs["rope_type"]
        if kind == "llama3" and arch == "llama":
            rope_factors = llama3_rope_factors(rs, theta if theta is not None else 10000.0, n_rot)
        elif kind in ("linear", "yarn"):
            kv.add("{arch}.rope.scaling.type", VT.STRING, kind)
            kv.f32("{arch}.rope.scaling.factor", rs["factor"])
            if kind == "yarn" and rs.get("original_max_position_embeddings") is not None:
                kv.u32("{arch}.rope.scaling.original_context_length", rs["original_max_position_embeddings"])
        else:
            raise ConvertError(f"{path}: {arch} RoPE scaling {kind!r} is not supported (linear, yarn, llama3)")
    return kv, rope_factors


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


_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def _hf_name(name: str, arch: str) -> str | None:
    """Normalise a checkpoint tensor name to the text model's; None for tensors not converted."""
    if arch == "gemma3":
        if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                            "model.multi_modal_projector.")):
            return None  # the vision part goes to llama.cpp's separate mmproj file
        # Gemma3ForConditionalGeneration names: language_model.model.* (older) or model.language_model.*
        name = name.replace("language_model.model.", "model.").replace("model.language_model.", "model.")
        name = name.replace("language_model.lm_head.", "lm_head.")
    if _IGNORED.search(name):
        return None
    return name


class TensorNamer:
    """HF checkpoint tensor names -> GGUF names for one architecture (gguf's TensorNameMap, the table
    llama.cpp's converter uses). `gguf_name` gives None for tensors that are not converted (vision
    tower, rotary caches) and raises ConvertError for names the architecture does not have."""

    def __init__(self, arch: str, n_layer: int):
        self.arch = arch
        self._map = gguf.get_tensor_name_map(GGUF_ARCH[arch], n_layer)

    def text_name(self, name: str) -> str | None:
        """The text model's HF name of a checkpoint tensor (multimodal prefixes removed), or None."""
        return _hf_name(name, self.arch)

    def gguf_name(self, name: str, where: Path) -> str | None:
        text = _hf_name(name, self.arch)
        if text is None:
            return None
        out = self._map.get_name(text, try_suffixes=(".weight", ".bias"))
        if out is None:
            raise ConvertError(f"{where}: cannot map tensor {name!r} to a GGUF name for {self.arch}")
        return out


def _collect_tensors(folder: Path, arch: str, hp: dict[str, Any], n_vocab_tokens: int,
                     rope_factors: np.ndarray | None) -> tuple[list[SourceTensor], int]:
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
    tied = bool(hp.get("tie_word_embeddings", arch == "gemma3"))

    out: list[SourceTensor] = []
    n_embd_rows = None
    for hf_name, e in entries.items():
        name = namer.text_name(hf_name)
        if name is None:
            continue
        if name == "lm_head.weight" and tied:
            continue  # tied embeddings: llama.cpp reuses token_embd.weight as the output matrix
        gguf_name = namer.gguf_name(hf_name, e.path)
        if e.dtype not in ST_DTYPES:
            st_array(e, hf_name)  # raises the dtype error
        type_id = int(ST_DTYPES[e.dtype][1])
        shape = e.shape
        steps: list[Callable[[np.ndarray], np.ndarray]] = []
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            steps.append(lambda w: permute_rope_rows(w, n_head))
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            steps.append(lambda w: permute_rope_rows(w, n_head_kv))
        if gguf_name == "token_embd.weight":
            n_embd_rows = shape[0]
            if arch == "gemma3" and shape[0] > n_vocab_tokens:
                # Gemma 3 embeddings have rows past the tokenizer's vocabulary (the image tokens'
                # padding); llama.cpp keeps only the rows that have a token.
                n = n_vocab_tokens
                steps.append(lambda w, n=n: w[:n])
                shape = (n, *shape[1:])
                n_embd_rows = n
        out_type = type_id
        if len(shape) == 1:
            # llama.cpp writes every 1-D tensor (norms, biases) as F32. Gemma stores its RMSNorm
            # weights as (w - 1): adding 1 here lets the runtime use the plain x * w norm; the sum is
            # rounded to the checkpoint's dtype first, as the converter's torch arithmetic does.
            shift = arch == "gemma3" and name.endswith("norm.weight")
            out_type = int(GT.F32)
            steps.append(lambda w, t=type_id, s=shift: norm_f32(w, t, s))
        out.append(SourceTensor(gguf_name, tuple(shape), out_type, _loader(e, hf_name, steps)))
    if n_embd_rows is None:
        raise ConvertError(f"{folder}: the weights have no embedding tensor (model.embed_tokens.weight)")
    if rope_factors is not None:
        rf = rope_factors
        out.append(SourceTensor("rope_freqs.weight", rf.shape, int(GT.F32), lambda rf=rf: rf))
    return out, n_embd_rows


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
    """A Hugging Face llama / qwen2 / qwen3 / gemma3 checkpoint folder as GGUF metadata + lazy tensors."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConvertError(f"{folder}: not a directory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConvertError(f"{config_path}: no such file (a Hugging Face model folder needs config.json)")
    arch, hp = text_hparams(read_json(config_path, "model config"), config_path)
    kv, rope_factors = hparam_kvs(arch, hp, folder.resolve().name, config_path)

    # Tokenizer first (it fixes the vocabulary size), but the tensors decide the row count.
    has_spm, has_json = (folder / "tokenizer.model").is_file(), (folder / "tokenizer.json").is_file()
    use_spm = has_spm and arch in ("llama", "gemma3")  # llama.cpp prefers SentencePiece for these
    if not use_spm and not has_json:
        wanted = "tokenizer.model or tokenizer.json" if arch in ("llama", "gemma3") else "tokenizer.json"
        raise ConvertError(f"{folder}: no tokenizer ({wanted} is missing)")
    tok_kv = Kvs(arch)
    if use_spm:
        tokens, scores, types, add_prefix = spm_vocab(folder)
        tensors, n_rows = _collect_tensors(folder, arch, hp, len(tokens), rope_factors)
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
        tok_kv.add("tokenizer.ggml.add_space_prefix", VT.BOOL, add_prefix and arch != "gemma3")
    else:
        tensors, n_rows = _collect_tensors(folder, arch, hp, 1 << 62, rope_factors)
        n_tokens = bpe_vocab(folder, tok_kv, n_rows)
    if n_tokens != n_rows:
        raise ConvertError(
            f"{folder}: the tokenizer has {n_tokens} tokens but the embedding has {n_rows} rows"
        )
    special_kvs(folder, tok_kv, n_tokens)
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
                sub = {np.dtype(np.float32): VT.FLOAT32, np.dtype(np.int32): VT.INT32}[value.dtype]
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
