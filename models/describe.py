"""What `infer show` says about a model: architecture, size, context, tensor types, template, license.

GGUF facts come from the header (metadata and tensor infos; no tensor data is read); MLX and
safetensors folders are described from config.json, tokenizer_config.json, the safetensors headers
and the README's front matter.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .gguf_file import read_gguf
from .resolve import LocatedModel, locate_model
from .store import ModelStore

# Bytes per element of safetensors dtypes, for the per-dtype byte counts.
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
             "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class TensorTypeStats:
    type: str  # GGML type (Q4_K, Q6_K, F32...) or safetensors dtype (BF16, U32...)
    count: int
    bytes: int


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    format: str  # "gguf" | "mlx" | "safetensors"
    architecture: str
    parameters: int | None  # sum of tensor element counts (MLX packed weights unpacked)
    context_length: int | None
    quantization: str | None  # GGUF file type (Q4_K_M...) or MLX "4-bit, group size 64"
    tensor_types: tuple[TensorTypeStats, ...]  # most bytes first
    chat_template: bool
    license: str | None
    details: tuple[tuple[str, str], ...]  # further hyperparameters, in display order
    repo: str | None = None
    revision: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tensor_types"] = [asdict(t) for t in self.tensor_types]
        d["details"] = dict(self.details)
        return d


def describe_model(name: str | None, store: ModelStore | None = None) -> ModelInfo:
    found = locate_model(name, store)
    info = _describe_gguf(found) if found.format == "gguf" else _describe_folder(found)
    if found.stored is not None:
        info = replace(info, repo=found.stored.repo, revision=found.stored.revision)
    return info


def _describe_gguf(found: LocatedModel) -> ModelInfo:
    g = read_gguf(found.path)
    meta = g.metadata
    arch = g.architecture

    def arch_key(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    per_type: dict[str, list[int]] = {}
    params = 0
    for t in g.tensors.values():
        params += math.prod(t.shape)
        stats = per_type.setdefault(t.type_name, [0, 0])
        stats[0] += 1
        stats[1] += t.nbytes
    details = [(label, str(arch_key(key))) for label, key in (
        ("embedding length", "embedding_length"), ("layers", "block_count"),
        ("multi-token-prediction layers (of those, not run)", "nextn_predict_layers"),
        ("attention heads", "attention.head_count"), ("kv heads", "attention.head_count_kv"),
        ("feed forward length", "feed_forward_length"), ("sliding window", "attention.sliding_window"),
    ) if arch_key(key) is not None]
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        details.append(("vocabulary", str(len(tokens))))
    ctx = arch_key("context_length")
    return ModelInfo(
        name=found.name, path=str(found.path), format="gguf", architecture=arch,
        parameters=params, context_length=int(ctx) if ctx is not None else None,
        quantization=_gguf_file_type(meta.get("general.file_type")),
        tensor_types=_sorted_stats(per_type),
        chat_template=bool(meta.get("tokenizer.chat_template")),
        license=_text(meta.get("general.license")),
        details=tuple(details),
    )


def _gguf_file_type(ft: Any) -> str | None:
    if ft is None:
        return None
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file type {ft}"


def _describe_folder(found: LocatedModel) -> ModelInfo:
    folder = found.path
    config = _json(folder / "config.json") or {}
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}

    def cfg(key: str) -> Any:
        return config.get(key, text_config.get(key))

    quant = config.get("quantization") or config.get("quantization_config")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    params, per_type = _safetensors_stats(folder, bits)
    archs = config.get("architectures") or []
    architecture = str(config.get("model_type") or (archs[0] if archs else "unknown"))
    if archs:
        architecture += f" ({', '.join(map(str, archs))})"
    details = [(label, str(cfg(key))) for label, key in (
        ("hidden size", "hidden_size"), ("layers", "num_hidden_layers"),
        ("attention heads", "num_attention_heads"), ("kv heads", "num_key_value_heads"),
        ("intermediate size", "intermediate_size"), ("vocabulary", "vocab_size"),
        ("torch dtype", "torch_dtype"),
    ) if cfg(key) is not None]
    ctx = cfg("max_position_embeddings")
    tok_config = _json(folder / "tokenizer_config.json") or {}
    has_template = bool(tok_config.get("chat_template")) or any(
        (folder / f).is_file() for f in ("chat_template.jinja", "chat_template.json"))
    return ModelInfo(
        name=found.name, path=str(folder), format=found.format, architecture=architecture,
        parameters=params or None, context_length=int(ctx) if ctx is not None else None,
        quantization=_describe_quant(quant), tensor_types=_sorted_stats(per_type),
        chat_template=has_template, license=_folder_license(folder, config), details=tuple(details),
    )


def _describe_quant(quant: Any) -> str | None:
    if not isinstance(quant, dict):
        return None
    if "bits" in quant:
        group = f", group size {quant['group_size']}" if "group_size" in quant else ""
        return f"{quant['bits']}-bit{group}"
    method = quant.get("quant_method")
    return str(method) if method else json.dumps(quant, sort_keys=True)


def _safetensors_stats(folder: Path, bits: Any) -> tuple[int, dict[str, list[int]]]:
    """Parameter count and per-dtype (count, bytes) from the safetensors headers alone."""
    headers: dict[str, dict] = {}
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                headers.update(json.loads(fh.read(n)))
        except (OSError, ValueError, struct.error):
            continue
    headers.pop("__metadata__", None)
    params = 0
    per_type: dict[str, list[int]] = {}
    for name, h in headers.items():
        if not isinstance(h, dict) or "shape" not in h:
            continue
        n = math.prod(h["shape"])
        dtype = str(h.get("dtype"))
        # MLX packs 32/bits quantized weights per uint32; its scales/biases are bookkeeping, not parameters.
        base = name.rsplit(".", 1)[0]
        if bits and dtype == "U32" and f"{base}.scales" in headers:
            params += n * 32 // int(bits)
        elif not (bits and name.endswith((".scales", ".biases")) and f"{base}.weight" in headers):
            params += n
        stats = per_type.setdefault(dtype, [0, 0])
        stats[0] += 1
        begin, end = (h.get("data_offsets") or [0, n * _ST_BYTES.get(dtype, 0)])[:2]
        stats[1] += int(end) - int(begin)
    return params, per_type


def _folder_license(folder: Path, config: dict) -> str | None:
    readme = folder / "README.md"
    if readme.is_file():
        try:
            text = readme.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        if text.startswith("---"):
            front = text[3:].split("\n---", 1)[0]
            for line in front.splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "license" and value.strip():
                    return value.strip().strip("'\"")
    if config.get("license"):
        return str(config["license"])
    if (folder / "LICENSE").is_file():
        return "see LICENSE"
    return None


def _sorted_stats(per_type: dict[str, list[int]]) -> tuple[TensorTypeStats, ...]:
    return tuple(sorted((TensorTypeStats(k, c, b) for k, (c, b) in per_type.items()), key=lambda t: -t.bytes))


def _json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
