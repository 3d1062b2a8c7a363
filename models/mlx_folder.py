"""Loading an MLX-format model folder (mlx-community style) into infer's model representation.

Such a folder is a Hugging Face checkpoint whose linear and embedding weights mlx-lm may have
affine-quantized: for each quantized module, `<module>.weight` holds uint32-packed codes and
`<module>.scales` / `<module>.biases` the per-group scale and bias; config.json's `quantization`
gives the bits and group size, with per-module overrides ({bits, group_size}, or false for a module
left dense) keyed by the module's path. Unquantized folders (plain F16/BF16/F32 safetensors) load
the same way.

The HF names and conventions are mapped once, here, to infer's GGUF ones, with the same tables and
transforms as the HF -> GGUF converter (convert_hf.py): GGUF tensor names, GGUF-style metadata,
llama's Q/K rows in llama.cpp's RoPE order (whole packed rows move with their scales and biases, so
permuting a quantized matrix is exact), Gemma's norms as (1 + w) in float32. Tensor data stay memory-mapped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from infer.quant.affine import BITS, GROUP_SIZES, AffineTensor
from infer.quant.tensor import QTensor

from .arch import architecture
from .config import ModelConfig, ModelConfigError
from .convert_hf import TensorNamer, hparam_kvs, permute_rope_rows, permuted_heads, text_hparams, to_f32
from .hf_files import ST_DTYPES, ConvertError, StEntry, read_json, read_safetensors_header, st_view
from .weights import Model, ModelLoadError, collect_weights

__all__ = ["load_mlx_folder", "QuantSpec", "quantization_of"]

def load_mlx_folder(folder: str | Path) -> Model:
    folder = Path(folder)
    try:
        return _load(folder)
    except (ConvertError, ModelConfigError) as e:
        msg = str(e)
        raise ModelLoadError(msg if msg.startswith(str(folder)) else f"{folder}: {msg}") from None


def _load(folder: Path) -> Model:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: no config.json (an MLX model folder has config.json, "
                             "model*.safetensors and tokenizer.json)")
    config = read_json(config_path, "model config")
    arch, hp = text_hparams(config, config_path)
    spec = architecture(arch)
    if spec.hf_tensor_steps is not None:
        # qwen35's V-head reorder and -exp(A_log) (the exporter refuses these architectures likewise):
        # read as stored, the tensors would not be what the layer computes with
        raise ModelLoadError(f"{folder}: a {arch} checkpoint's tensors need llama.cpp's converter's transforms, "
                             f"which a Hugging Face / MLX folder is not run with; convert it first "
                             f"(infer quantize {folder} out.gguf)")
    kv, extra = hparam_kvs(arch, hp, folder.resolve().name, config_path)
    # The values a GGUF would hold: float32 keys rounded to float32, so configs compare equal.
    metadata: dict[str, Any] = {key: float(np.float32(value)) if vtype == VT.FLOAT32 else value
                                for key, vtype, value in kv.items}
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(f"{folder}: no tokenizer.json (infer reads MLX folders' tokenizers from it)")
    entries = _weight_entries(folder)
    quant = quantization_of(config, config_path)
    tensors = _gguf_tensors(entries, arch, hp, quant, folder)
    tensors.update(extra)  # made from the config (rope_freqs, LongRoPE's factors)
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise ModelLoadError(f"{folder}: missing tensor 'model.embed_tokens.weight'")
    cfg = ModelConfig.from_metadata(metadata, n_vocab=embd.shape[0])
    weights = collect_weights(tensors, folder, cfg)
    return Model(folder, cfg, metadata, weights, format="mlx")


# ----------------------------------------------------------------------------- files


def _weight_entries(folder: Path) -> dict[str, StEntry]:
    """Every tensor of the checkpoint: the files the index names, else every model*.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no weight_map")
        for name, f in weight_map.items():
            # A file of this folder, by name: not a path that reaches out of it (/proc/self/mem, ../other).
            if not isinstance(f, str) or f in ("", ".", "..") or "/" in f or "\\" in f or "\0" in f:
                raise ModelLoadError(f"{index}: weight_map gives tensor {name!r} the file {f!r}, "
                                     "which is not a file name in the folder")
        files = sorted({folder / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: weights file {missing[0]} named by {index.name} is missing")
    else:
        files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no model.safetensors (or model-*-of-*.safetensors) weights file")
    entries: dict[str, StEntry] = {}
    for f in files:
        entries.update(read_safetensors_header(f))
    return entries


# ----------------------------------------------------------------------------- quantization


class QuantSpec:
    """config.json's quantization: default bits / group size and per-module overrides."""

    def __init__(self, bits: int | None, group_size: int | None, overrides: dict[str, dict[str, Any] | bool]):
        self.bits, self.group_size, self.overrides = bits, group_size, overrides

    def for_module(self, module: str) -> tuple[int, int] | None:
        o = self.overrides.get(module)
        if isinstance(o, dict):
            return int(o.get("bits", self.bits)), int(o.get("group_size", self.group_size))
        if self.bits is None or self.group_size is None:
            return None
        return self.bits, self.group_size


def quantization_of(config: dict[str, Any], path: Path) -> QuantSpec:
    q = config.get("quantization")
    if q is None:
        q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization")
    if q is None:
        return QuantSpec(None, None, {})
    if not isinstance(q, dict):
        raise ModelLoadError(f"{path}: 'quantization' must be an object")
    mode = q.get("mode", "affine")
    if mode != "affine" or "quant_method" in q:
        raise ModelLoadError(f"{path}: quantization {q.get('quant_method', mode)!r} is not supported (MLX affine only)")
    bits, group_size = q.get("bits"), q.get("group_size")
    if bits is None or group_size is None:
        raise ModelLoadError(f"{path}: 'quantization' needs integer 'bits' and 'group_size'")
    overrides = {k: v for k, v in q.items() if isinstance(v, (dict, bool))}
    for spec in [(bits, group_size)] + [(v.get("bits", bits), v.get("group_size", group_size))
                                        for v in overrides.values() if isinstance(v, dict)]:
        # Membership first, int() after: 4.5 or Infinity must not round or overflow into a valid value.
        if spec[0] not in BITS or spec[1] not in GROUP_SIZES:
            raise ModelLoadError(f"{path}: quantization with {spec[0]!r} bits and group size {spec[1]!r} is not "
                                 f"supported (bits {BITS}, group sizes {GROUP_SIZES})")
    return QuantSpec(int(bits), int(group_size), overrides)


# ----------------------------------------------------------------------------- tensors


def _gguf_tensors(entries: dict[str, StEntry], arch: str, hp: dict[str, Any], quant: QuantSpec,
                  folder: Path) -> dict[str, Any]:
    """GGUF name -> QTensor / AffineTensor (matrices) or float32 array (vectors)."""
    namer = TensorNamer(arch, int(hp["num_hidden_layers"]))
    spec = architecture(arch)
    n_head = int(hp["num_attention_heads"])
    n_head_kv = int(hp.get("num_key_value_heads") or n_head)
    out: dict[str, Any] = {}
    for name, e in entries.items():
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in entries:
            continue  # read with their weight
        gguf_name = namer.gguf_name(name, e.path)
        if gguf_name is None:
            continue
        module = name.rsplit(".", 1)[0]
        if module + ".scales" in entries and name.endswith(".weight"):
            t: Any = _affine(entries, module, quant, e.path)
        else:
            t = _dense(e, name, spec.hf_norm_shift)
        # HF Llama orders each Q/K head's rows for rotate-half RoPE; infer (as llama.cpp) rotates pairs.
        heads = permuted_heads(spec, namer.text_name(name) or name, n_head, n_head_kv)
        if heads:
            t = _permuted(t, heads)
        if gguf_name in out:
            raise ModelLoadError(f"{e.path}: two tensors map to {gguf_name} ({name!r} is the second)")
        out[gguf_name] = t
    return out


def _affine(entries: dict[str, StEntry], module: str, quant: QuantSpec, where: Path) -> AffineTensor:
    spec = quant.for_module(module)
    if spec is None:
        raise ModelLoadError(f"{where}: {module} is quantized (has scales) but config.json has no 'quantization'")
    bits, group_size = spec
    w, s = entries[module + ".weight"], entries[module + ".scales"]
    b = entries.get(module + ".biases")
    if b is None:
        raise ModelLoadError(f"{where}: {module} has scales but no biases (only MLX's affine mode is supported)")
    if w.dtype != "U32" or len(w.shape) != 2:
        raise ModelLoadError(f"{where}: {module}.weight is {w.dtype} {list(w.shape)}, expected a uint32 matrix")
    rows, words = w.shape
    cols = words * 32 // bits
    want = (rows, cols // group_size)
    if words * 32 % bits or cols % group_size or s.shape != want or b.shape != want:
        raise ModelLoadError(f"{where}: {module}: weight {list(w.shape)}, scales {list(s.shape)} and biases "
                             f"{list(b.shape)} do not fit {bits}-bit groups of {group_size}")
    return AffineTensor(st_view(w), _vector_f32(s, module + ".scales"), _vector_f32(b, module + ".biases"),
                        bits, group_size)


def _vector_f32(e: StEntry, name: str) -> np.ndarray:
    if e.dtype not in ST_DTYPES:
        raise ModelLoadError(f"{e.path}: tensor {name!r} has dtype {e.dtype} (expected F32, F16 or BF16)")
    # bfloat16 widens exactly by a 16-bit shift; float16 -> float32 is exact too.
    return np.ascontiguousarray(to_f32(st_view(e), int(ST_DTYPES[e.dtype][1])), dtype=np.float32)


def _dense(e: StEntry, name: str, norm_shift: bool) -> QTensor | np.ndarray:
    if e.dtype not in ST_DTYPES:
        raise ModelLoadError(f"{e.path}: tensor {name!r} has dtype {e.dtype} (expected F32, F16 or BF16, or "
                             "U32 with scales and biases)")
    if len(e.shape) == 1:
        x = _vector_f32(e, name)
        if norm_shift and name.endswith("norm.weight"):
            # Gemma stores RMSNorm weights as (w - 1); the runtime uses the plain x * w norm. The sum
            # is kept in float32, as transformers computes (1 + w) and llama.cpp's GGUFs hold it.
            x = x + np.float32(1.0)
        return x
    if len(e.shape) != 2:
        raise ModelLoadError(f"{e.path}: tensor {name!r} has shape {list(e.shape)}, expected a matrix or vector")
    return QTensor.from_bytes(int(ST_DTYPES[e.dtype][1]), e.shape, np.ascontiguousarray(st_view(e)).view(np.uint8))


def _permuted(t: Any, n_head: int) -> Any:
    if isinstance(t, AffineTensor):
        return AffineTensor(np.ascontiguousarray(permute_rope_rows(t.packed, n_head)),
                            np.ascontiguousarray(permute_rope_rows(t.scales, n_head)),
                            np.ascontiguousarray(permute_rope_rows(t.biases, n_head)), t.bits, t.group_size)
    if isinstance(t, QTensor):
        rows = permute_rope_rows(t.raw, n_head)
        return QTensor(t.type_id, t.shape, np.ascontiguousarray(rows))
    return np.ascontiguousarray(permute_rope_rows(t, n_head))

