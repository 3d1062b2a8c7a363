"""`infer quantize IN OUT --format mlx`: any input infer quantize reads, written as an MLX model folder.

The folder is what mlx-lm's convert writes: config.json (the HF config plus `quantization`
{group_size, bits, mode}), model.safetensors with HF tensor names (every linear and embedding
matrix whose rows split into groups affine-quantized: `<module>.weight` uint32 codes,
`<module>.scales` and `<module>.biases`; norms and other vectors dense), its index, and the
tokenizer files. Tensors come from a SourceModel (GGUF semantics: llama.cpp's Q/K row order,
Gemma norms as 1 + w), so they are put back into HF's conventions here. Quantized inputs are
dequantized first.

Memory stays bounded: tensors are converted a row chunk at a time and written at their offsets in a
preallocated safetensors file. Everything is written into a temporary folder beside OUT and renamed
into place only once complete, so an interrupted run leaves no half-written model.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from infer.quant.affine import BITS, GROUP_SIZES, quantize_affine
from infer.quant.types import BF16, F16, F32, qtype

from .arch import Architecture
from .arch.hf_keys import llama3_rope_factors
from .config import ModelConfig, ModelConfigError
from .convert_hf import bf16_round, permuted_heads, unpermute_rope_rows
from .gguf_write import TensorInfo
from .quantize_file import CHUNK_ELEMENTS, QuantizeError, open_source, rows_to_f32, rows_view
from .source import SourceModel, SourceTensor

# What writes tokenizer.json, tokenizer_config.json and generation_config.json for a GGUF
# vocabulary (engine.tokenizer_json.write_tokenizer_files; passed in: models does not import engine).
TokenizerWriter = Callable[[dict[str, Any], Path], None]

# Tokenizer files of an HF input folder, copied as they are (they are the model's own).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja", "chat_template.json", "tokenizer.model")
_ST_DTYPE = {"float16": ("F16", 2), "bfloat16": ("BF16", 2)}


@dataclass(frozen=True)
class MlxExportOptions:
    bits: int = 4
    group_size: int = 64
    dtype: str | None = None  # of scales, biases and dense tensors: float16 / bfloat16; None: chosen per model
    force: bool = False


@dataclass(frozen=True)
class MlxExportSummary:
    out_path: Path
    bits: int
    group_size: int
    dtype: str
    n_tensors: int
    n_quantized: int
    bytes_before: int
    bytes_after: int
    seconds: float


def _hf_tensor_name(gguf_name: str, arch: Architecture) -> str | None:
    """GGUF tensor name -> the HF checkpoint's (None: not a checkpoint tensor, e.g. rope_freqs)."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if gguf_name in top:
        return top[gguf_name]
    if not gguf_name.startswith("blk."):
        return None
    _, layer, base, suffix = gguf_name.split(".", 3)
    table = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        # Gemma's four norms per layer; llama's two (ffn_norm is its post-attention norm).
        "ffn_norm": "pre_feedforward_layernorm" if arch.post_norms else "post_attention_layernorm",
        "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    }
    if base not in table:
        return None
    return f"model.layers.{layer}.{table[base]}.{suffix}"


# ----------------------------------------------------------------------------- config.json


def _rope_scaling(cfg: ModelConfig, rope_freqs: np.ndarray | None) -> dict[str, Any] | None:
    if rope_freqs is not None:
        # Llama 3.1's factors come from four numbers; Meta's released models all use low 1, high 4
        # and an 8192 original context, so recover the factor and check the whole curve matches.
        rs = {"rope_type": "llama3", "factor": float(np.max(rope_freqs)), "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        if not np.allclose(llama3_rope_factors(rs, cfg.rope_base, cfg.n_rot), rope_freqs, rtol=1e-5):
            raise QuantizeError("rope_freqs is not Llama 3.1's RoPE scaling curve: cannot describe it in config.json")
        return rs
    if cfg.rope_ext_factor:  # YaRN, as transformers and mlx-lm read it
        return {"rope_type": "yarn", "type": "yarn", "factor": 1.0 / cfg.rope_scale,
                "original_max_position_embeddings": cfg.n_ctx_orig}
    if cfg.rope_scale != 1.0:
        return {"rope_type": "linear", "type": "linear", "factor": 1.0 / cfg.rope_scale}
    return None


def hf_config(cfg: ModelConfig, meta: dict[str, Any], tied: bool, has_qkv_bias: bool,
              rope_freqs: np.ndarray | None, dtype: str, bits: int, group_size: int) -> dict[str, Any]:
    """An HF config.json for the model (read back by convert_hf.hparam_kvs to the same ModelConfig)."""
    arch = cfg.architecture
    if not arch.hf_class:
        raise QuantizeError(f"{cfg.arch}: no MLX (Hugging Face) layout is known for this architecture")
    # qwen35: V heads reordered, A_log as -exp(A_log); llama4: experts fused and transposed, its own keys
    if arch.hf_tensor_steps is not None or arch.hf_experts_transposed:
        raise QuantizeError(f"{cfg.arch}: the converter's tensor transforms are not undone for an MLX "
                            "(Hugging Face) checkpoint yet")
    out: dict[str, Any] = {
        "model_type": arch.export_type, "architectures": [arch.hf_class],
        "hidden_size": cfg.n_embd, "intermediate_size": cfg.n_ff, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_base, "max_position_embeddings": cfg.n_ctx_train,
        "vocab_size": cfg.n_vocab, "tie_word_embeddings": tied, "torch_dtype": dtype,
    }
    if cfg.head_dim != cfg.head_dim_v:
        raise QuantizeError(f"{cfg.arch}: different K and V head sizes cannot be described in config.json")
    if cfg.n_rot != cfg.head_dim:
        raise QuantizeError(f"{cfg.arch}: RoPE over {cfg.n_rot} of {cfg.head_dim} head dims cannot be described "
                            "in config.json")
    rs = _rope_scaling(cfg, rope_freqs)
    if rs is not None:
        out["rope_scaling"] = rs
    if arch.hf_config is not None:
        out.update(arch.hf_config(cfg, has_qkv_bias))
    for key in ("bos", "eos"):
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        if tid is not None:
            out[f"{key}_token_id"] = int(tid)
    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    out["quantization"] = quant
    out["quantization_config"] = dict(quant)  # mlx-lm writes both (the HF loaders read the second)
    return out


# ----------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class _Plan:
    src: SourceTensor
    hf_name: str  # of the weight ("….weight") or the vector
    quantized: bool
    unpermute: int  # llama Q/K: the head count to restore HF's row order with; 0: none
    unshift: bool  # Gemma norm: stored as w - 1

    def entries(self, dtype: str, bits: int, group_size: int) -> list[tuple[str, str, tuple[int, ...]]]:
        st, _ = _ST_DTYPE[dtype]
        shape = self.src.shape
        if not self.quantized:
            return [(self.hf_name, st, shape)]
        rows, cols = shape
        base = self.hf_name[: -len(".weight")]
        groups = (rows, cols // group_size)
        return [(self.hf_name, "U32", (rows, cols * bits // 32)), (base + ".scales", st, groups),
                (base + ".biases", st, groups)]


def _plan(model: SourceModel, cfg: ModelConfig, group_size: int) -> list[_Plan]:
    out = []
    for t in model.tensors:
        name = _hf_tensor_name(t.name, cfg.architecture)
        if name is None:
            if t.name == "rope_freqs.weight":
                continue  # described by config.json's rope_scaling
            raise QuantizeError(f"tensor {t.name} has no place in an MLX {cfg.arch} checkpoint")
        unpermute = permuted_heads(cfg.architecture, name, cfg.n_head, cfg.n_head_kv)
        # As mlx-lm: every linear / embedding matrix whose rows split into groups is quantized.
        quantized = len(t.shape) == 2 and t.shape[1] % group_size == 0
        unshift = cfg.architecture.hf_norm_shift and len(t.shape) == 1 and t.name.endswith("norm.weight")
        out.append(_Plan(t, name, quantized, unpermute, unshift))
    return out


def _float_bytes(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return bf16_round(x).tobytes()
    return np.asarray(x, dtype=np.float32).astype(np.float16).tobytes()


def _write_tensor(f, p: _Plan, offsets: dict[str, int], dtype: str, bits: int, group_size: int) -> None:
    t = p.src
    rows = rows_view(t)
    if p.unpermute or len(t.shape) == 1:
        # Q/K permutations mix rows across a head, vectors are small: convert these whole.
        chunks = [(0, rows)]
    else:
        step = max(1, CHUNK_ELEMENTS // max(1, t.shape[-1]))
        chunks = [(r, rows[r:r + step]) for r in range(0, rows.shape[0], step)]
    for r0, chunk in chunks:
        x = rows_to_f32(t, chunk)
        if not np.isfinite(x).all():
            raise QuantizeError(f"tensor {t.name} has NaN or infinite weights")
        if len(t.shape) == 1:
            x = x.reshape(-1)
            if p.unshift:
                x = x - np.float32(1.0)
        if p.unpermute:
            x = unpermute_rope_rows(x, p.unpermute)
        if not p.quantized:
            f.seek(offsets[p.hf_name] + r0 * x.shape[-1] * 2)  # dense rows: 2 bytes a value
            f.write(_float_bytes(x, dtype))
            continue
        q = quantize_affine(x, bits, group_size, scale_dtype=dtype)
        base = p.hf_name[: -len(".weight")]
        f.seek(offsets[p.hf_name] + r0 * q.packed.shape[1] * 4)
        f.write(np.ascontiguousarray(q.packed, dtype="<u4").tobytes())
        for suffix, v in ((".scales", q.scales), (".biases", q.biases)):
            f.seek(offsets[base + suffix] + r0 * v.shape[1] * 2)
            f.write(_float_bytes(v, dtype))


def _write_safetensors(path: Path, plans: list[_Plan], dtype: str, bits: int, group_size: int,
                       progress: Callable[[int, int, str], None] | None) -> tuple[int, dict[str, str]]:
    """model.safetensors: header first (every size is known in advance), then each tensor's bytes
    at its offset. Returns the data size and the weight map of the index file."""
    entries = sorted((e for p in plans for e in p.entries(dtype, bits, group_size)), key=lambda e: e[0])
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offsets, pos = {}, 0
    for name, st, shape in entries:
        n = math.prod(shape) * (4 if st == "U32" else 2)
        header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [pos, pos + n]}
        offsets[name] = pos
        pos += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    base = 8 + len(head)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(base + pos)
        for i, p in enumerate(plans):
            if progress:
                progress(i, len(plans), p.hf_name)
            _write_tensor(f, p, {k: base + v for k, v in offsets.items()}, dtype, bits, group_size)
    return pos, {name: path.name for name, _, _ in entries}


# ----------------------------------------------------------------------------- entry point


def _check_out(src: Path, out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise QuantizeError(f"{out}: already exists (use --force to overwrite)")
    if out.exists() and not out.is_dir():
        raise QuantizeError(f"{out}: is a file (an MLX model is a folder)")
    if not out.parent.exists():
        raise QuantizeError(f"{out.parent}: no such directory")
    if src.exists() and out.exists() and src.resolve() == out.resolve():
        raise QuantizeError(f"{out}: input and output are the same")


def export_mlx(src: str | Path, out: str | Path, options: MlxExportOptions, write_tokenizer: TokenizerWriter,
               progress: Callable[[int, int, str], None] | None = None,
               warn: Callable[[str], None] | None = None) -> MlxExportSummary:
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    if options.bits not in BITS:
        raise QuantizeError(f"--bits must be one of {', '.join(map(str, BITS))}, not {options.bits}")
    if options.group_size not in GROUP_SIZES:
        raise QuantizeError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, not {options.group_size}")
    if options.dtype not in (None, *_ST_DTYPE):
        raise QuantizeError(f"dtype must be float16 or bfloat16, not {options.dtype!r}")
    _check_out(src, out, options.force)
    model = open_source(src)
    meta = {k: v for k, _, v in model.kvs}
    by_name = {t.name: t for t in model.tensors}
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise QuantizeError(f"{src}: missing tensor 'token_embd.weight'")
    try:
        cfg = ModelConfig.from_metadata(meta, n_vocab=embd.shape[0])
    except ModelConfigError as e:
        raise QuantizeError(f"{src}: {e}") from None
    # Gemma is trained in bfloat16 and overflows float16; otherwise keep the checkpoint's type.
    dtype = options.dtype or ("bfloat16" if cfg.architecture.hf_bfloat16 or any(t.type_id == BF16 for t in model.tensors)
                              else "float16")
    rope = by_name.get("rope_freqs.weight")
    rope_freqs = rows_to_f32(rope, rows_view(rope)).reshape(-1) if rope is not None else None
    config = hf_config(cfg, meta, "output.weight" not in by_name, "blk.0.attn_q.bias" in by_name, rope_freqs,
                       dtype, options.bits, options.group_size)
    plans = _plan(model, cfg, options.group_size)
    requant = sorted({qtype(p.src.type_id).name for p in plans if p.src.type_id not in (F32, F16, BF16)})
    if requant and warn:
        warn(f"{src} is already quantized ({', '.join(requant)}): its weights are dequantized and quantized "
             "again, so quality is at best the input's")

    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        size, weight_map = _write_safetensors(tmp / "model.safetensors", plans, dtype, options.bits,
                                              options.group_size, progress)
        index = {"metadata": {"total_size": size}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
        if src.is_dir() and (src / "tokenizer.json").is_file():
            for name in _TOKENIZER_FILES:
                if (src / name).is_file():
                    shutil.copyfile(src / name, tmp / name)
        else:
            write_tokenizer(meta, tmp)
        if out.exists():  # --force: the old folder goes only once the new one is complete
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    before = sum(TensorInfo(t.name, t.shape, t.type_id).nbytes for t in model.tensors)
    return MlxExportSummary(out, options.bits, options.group_size, dtype, len(plans),
                            sum(p.quantized for p in plans), before, size, time.perf_counter() - t0)
