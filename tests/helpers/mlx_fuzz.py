"""Hostile MLX / Hugging Face model folders for the fuzz tests (tests/test_fuzz_gguf.py) and the
long run (scripts/fuzz_gguf.py --format mlx / hf-convert); importance-matrix files are
imatrix_fuzz.py's.

Folders: valid tiny MLX folders (tiny GGUF models of several architectures exported with
`infer quantize --format mlx`, 4- and 8-bit, several group sizes) and unquantized HF folders
(hf_models.make_hf_model: F32 / F16 / BF16 safetensors, as most checkpoints on the Hub), copied and
mutated where a loader must not trust them: the safetensors header length and JSON header (dtypes,
shapes, data offsets, entries swapped, removed, renamed or replaced), truncations and bit flips,
config.json's hyperparameters and quantization, tokenizer.json and its companions, and the
safetensors index. Each case is then loaded and run by gguf_fuzz's worker, which answers as for
GGUF files (OK / ERR / RUN / TB, CRASH / HANG from the harness).

This file's own `convert` worker (`python tests/helpers/mlx_fuzz.py convert`) quantizes mutated HF
folders to GGUF instead of running them: the converter reads config.json and the tokenizer files
its own way.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import struct
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` for this file run as a worker

from helpers.gguf_fuzz import EXTREME, serve  # noqa: E402

# (tiny GGUF architecture, bits, group size) exported to MLX folders; then unquantized HF folders.
MLX_SEEDS = (("llama", 4, 64), ("qwen2", 8, 32), ("qwen3", 4, 128), ("gemma3", 8, 64), ("gemma2", 4, 32))
HF_SEEDS = ("llama", "qwen2")

# Values a JSON number field may hold in a hostile file: wrong signs, past every integer type,
# non-integral, non-finite (Python's json reads NaN / Infinity), and not numbers at all.
BAD_NUMBERS: list[Any] = [-1, -2, -(2**31), -(2**63), 0, 1, 2, 3, 2**31, 2**32 + 1, 2**53 + 1, 2**63, 2**64, 10**30,
                          1.5, 2.0, -0.0, 1e308, float("inf"), float("-inf"), float("nan"), "3", "", "x", None, True,
                          False, [1], [], {}, {"a": 1}]
ST_DTYPES = ["F32", "F16", "BF16", "U32", "F64", "I8", "U8", "I16", "U16", "I32", "I64", "U64", "BOOL",
             "F8_E4M3", "F8_E5M2", "Q4_0", "", "f32", "u32", "float32", 4, None, ["F32"], {"F32": 1}]
CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "rope_theta", "rope_scaling", "max_position_embeddings", "tie_word_embeddings",
               "rms_norm_eps", "sliding_window", "sliding_window_pattern", "query_pre_attn_scalar",
               "final_logit_softcapping", "attn_logit_softcapping", "rope_local_base_freq", "bos_token_id",
               "eos_token_id", "model_type", "text_config", "quantization", "rope_parameters", "layer_types",
               "num_experts", "num_experts_per_tok", "partial_rotary_factor", "torch_dtype")
ROPE_SCALINGS: list[Any] = [None, [], "linear", {"rope_type": "default"}, {"rope_type": 5}, {"rope_type": ["x"]},
                            {"rope_type": "dynamic", "factor": 2.0}, {"type": "longrope", "short_factor": [1.0]},
                            {"rope_type": "linear"}, {"type": "yarn"}, {"rope_type": "llama3"}]


def _number(rng: random.Random, old: Any = None) -> Any:
    """A hostile value for a numeric field: near the old value (off by one, doubled, halved, negated) or extreme."""
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.4:
        return rng.choice([old + 1, old - 1, old * 2, old // 2, -old, old * 3 + 1])
    return rng.choice(BAD_NUMBERS)


# ----------------------------------------------------------------------------- seeds


def seeds(folder: Path) -> list[Path]:
    """The valid folders (written once into `folder`): MLX exports of tiny GGUF models, then HF float folders."""
    from helpers.hf_models import make_hf_model
    from helpers.tiny_models import write_tiny_model
    from infer.engine.tokenizer_json import write_tokenizer_files
    from infer.models.mlx_export import MlxExportOptions, export_mlx

    out = []
    for arch, bits, group_size in MLX_SEEDS:
        p = folder / f"seed-{arch}-{bits}bit"
        if not p.exists():  # export_mlx renames the folder into place only once complete
            gguf = folder / f"src-{arch}.gguf"
            if not gguf.exists():
                write_tiny_model(gguf, arch)
            export_mlx(gguf, p, MlxExportOptions(bits=bits, group_size=group_size), write_tokenizer_files)
        out.append(p)
    for arch in HF_SEEDS:
        p = folder / f"seed-hf-{arch}"
        if not p.exists():
            tmp = folder / f".{p.name}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            make_hf_model(tmp, arch, seed=1)
            tmp.rename(p)
        out.append(p)
    return out


# ----------------------------------------------------------------------------- safetensors


def _weights_file(folder: Path, rng: random.Random) -> Path | None:
    files = sorted(folder.glob("model*.safetensors"))
    return rng.choice(files) if files else None


def st_split(b: bytes) -> tuple[dict | None, bytes]:
    """The JSON header (None if it does not parse as an object) and the data after it."""
    n = int.from_bytes(b[:8], "little")
    try:
        header = json.loads(b[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        return None, b[8 + n:]
    return (header if isinstance(header, dict) else None), b[8 + n:]


def st_join(header: dict, data: bytes) -> bytes:
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


def _mutate_entry(header: dict, name: str, rng: random.Random) -> str:
    """One hostile change to tensor `name`'s entry (dtype, shape, offsets, keys) or to its place in the header."""
    info = header[name]
    names = [k for k in header if k != "__metadata__"]
    other = rng.choice(names)
    how = rng.randrange(14)
    if not isinstance(info, dict) or how == 0:
        header[name] = rng.choice([[], "x", 3, None, [info.get("dtype"), info.get("shape")] if isinstance(info, dict)
                                   else 1.5])
        return f"{name}: entry -> {header[name]!r}"
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if how == 1:
        info["dtype"] = rng.choice(ST_DTYPES)
        return f"{name}: dtype -> {info['dtype']!r}"
    if how in (2, 3) and isinstance(shape, list) and shape:
        i = rng.randrange(len(shape))
        shape[i] = _number(rng, shape[i])
        return f"{name}: shape[{i}] -> {shape[i]!r}"
    if how == 4 and isinstance(shape, list):
        kind = rng.randrange(4)
        if kind == 0:  # every dim negated: a matrix keeps its element count (math.prod) and byte span
            info["shape"] = [-d if isinstance(d, int) else d for d in shape]
        elif kind == 1 and shape:
            shape.pop(rng.randrange(len(shape)))
        elif kind == 2:
            shape.insert(rng.randint(0, len(shape)), rng.choice([1, 1, 2, 0, -1, 32]))
        else:
            info["shape"] = rng.choice([[], None, "x", 5, {}, [[1]], [math.prod(shape)] if all(
                isinstance(d, int) for d in shape) else [1]])
        return f"{name}: shape -> {info['shape']!r}"
    if how in (5, 6) and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(v, int) for v in offsets):
        s, e = offsets
        o = header[other].get("data_offsets") if isinstance(header[other], dict) else None
        info["data_offsets"] = rng.choice([
            [e, s], [s - 1, e - 1], [s + 1, e + 1], [s, e + rng.choice([1, 8, 2**20, 2**40, 2**64])], [-8, e - s - 8],
            o if o is not None else [s, e], [float(s), float(e)], [s + 0.5, e + 0.5], [str(s), str(e)], [s], [s, e, e],
            None, "0", [True, e], [s, _number(rng, e)], [_number(rng, s), e]])
        return f"{name}: data_offsets -> {info['data_offsets']!r}"
    if how == 12 and isinstance(shape, list) and len(shape) >= 1 and all(isinstance(d, int) for d in shape):
        # The same element count in another shape: the byte span still fits, so only the loader's
        # shape checks against config.json (and scales against codes) can tell.
        total = math.prod(shape)
        info["shape"] = rng.choice([shape[::-1], [total], [1, total], [2, total // 2] if total % 2 == 0 else [total, 1],
                                    shape + [1], [1] + shape])
        return f"{name}: shape {shape} -> {info['shape']}"
    if how == 13:  # a dtype of the same size: the byte span still fits
        same = {"F16": ["BF16", "I16", "U16"], "BF16": ["F16", "U16"], "F32": ["U32", "I32"], "U32": ["F32", "I32"]}
        if isinstance(info.get("dtype"), str) and info["dtype"] in same:
            info["dtype"] = rng.choice(same[info["dtype"]])
            return f"{name}: dtype -> {info['dtype']}"
    if how == 7 and info:
        key = rng.choice(sorted(info))
        del info[key]
        return f"{name}: {key} removed"
    if how == 8:
        header[name], header[other] = header[other], info
        return f"{name} <-> {other}"
    if how == 9:
        del header[name]
        return f"{name} removed"
    if how == 10:
        new = rng.choice(["model.layers.999.mlp.up_proj.weight", "model.layers.-1.mlp.up_proj.weight", "",
                          "lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.experts.0.up_proj.weight",
                          "model.layers.0.self_attn.q_proj.bias", "model.layers.0.mlp.gate_proj.scales",
                          "model.layers.0.self_attn.o_proj.biases", "vision_tower.x.weight", "x" * 5000,
                          name.replace(".weight", ".scales"), name.replace(".0.", ".1."), name + "\x00"])
        header[new] = header.pop(name)
        return f"{name} renamed {new[:60]!r}"
    header[rng.choice(["__metadata__", name + ".extra", "model.layers.1.mlp.down_proj.weight"])] = rng.choice(
        [[], 5, "x", None, {"format": 5}, {"a": {"b": []}}, dict(info)])
    return f"{name}: entry added"


def _mutate_safetensors(folder: Path, rng: random.Random) -> str:
    f = _weights_file(folder, rng)
    if f is None:
        return "no weights file"
    b = f.read_bytes()
    header, data = st_split(b)
    how = rng.random()
    if how < 0.6 and header and any(k != "__metadata__" for k in header):
        name = rng.choice([k for k in header if k != "__metadata__"])
        what = _mutate_entry(header, name, rng)
        f.write_bytes(st_join(header, data))
        return f"{f.name}: {what}"
    n = int.from_bytes(b[:8], "little")
    out = bytearray(b)
    data_at = min(8 + n, len(out))  # where the header ends, as far as the file goes (an earlier change may cut it)
    if how < 0.7:  # the header length
        v = rng.choice([rng.choice(EXTREME), n + rng.randint(-16, 16), len(b) - 8, len(b), 0, 1])
        out[:8] = (v % 2**64).to_bytes(8, "little")
        what = f"header length {n} -> {v}"
    elif how < 0.8 and data_at > 8:  # the JSON text itself
        j = rng.randrange(8, data_at)
        out[j] ^= 1 << rng.randrange(8)
        what = f"header byte {j} flipped"
    elif how < 0.88 and len(out) > data_at:  # the tensor data (codes, scales, biases, dense weights: NaN, Inf)
        for _ in range(rng.randint(1, 64)):
            j = rng.randrange(data_at, len(out))
            out[j] = rng.randrange(256) if rng.random() < 0.5 else out[j] ^ (1 << rng.randrange(8))
        what = "data bytes changed"
    elif how < 0.97 and out:
        del out[rng.randrange(len(out)):]
        what = f"truncated to {len(out)} bytes"
    else:
        out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
        what = "bytes appended"
    f.write_bytes(bytes(out))
    return f"{f.name}: {what}"


# ----------------------------------------------------------------------------- JSON files


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def _truncate(path: Path, rng: random.Random) -> str:
    if not path.is_file():
        return f"{path.name} absent"
    b = path.read_bytes()
    path.write_bytes(b[:rng.randrange(len(b) + 1)])
    return f"{path.name} truncated"


def _mutate_config(folder: Path, rng: random.Random) -> str:
    path = folder / "config.json"
    cfg = _read(path)
    if not isinstance(cfg, dict) or rng.random() < 0.03:
        return _truncate(path, rng)
    key = rng.choice(CONFIG_KEYS)
    if key == "quantization":
        return _mutate_quantization(cfg, path, rng)
    if rng.random() < 0.15:
        cfg.pop(key, None)
        _write(path, cfg)
        return f"config {key} removed"
    if key in ("rope_scaling", "rope_parameters"):
        v = rng.choice(ROPE_SCALINGS)
        if isinstance(v, dict):
            v = {**v, **{k: _number(rng) for k in rng.sample(
                ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "rope_theta",
                 "beta_fast", "attention_factor"], rng.randint(0, 3))}}
    elif key in ("model_type", "torch_dtype"):
        v = rng.choice(["llama", "qwen2", "qwen3", "gemma3_text", "gemma2", "phi3", "qwen3_moe", "mamba", "", 5, None])
    elif key == "text_config":
        v = rng.choice([None, [], "x", {}, {"num_hidden_layers": _number(rng)}, {k: v for k, v in cfg.items()
                                                                              if k != "text_config"}])
    elif key in ("sliding_window_pattern", "layer_types", "eos_token_id"):
        v = rng.choice([_number(rng), [], [1, 2], ["sliding_attention"] * 3, [None] * 40, "x"])
    else:
        v = _number(rng, cfg.get(key))
    cfg[key] = v
    _write(path, cfg)
    return f"config {key} -> {v!r}"[:200]


def _mutate_quantization(cfg: dict, path: Path, rng: random.Random) -> str:
    q = cfg.get("quantization")
    if not isinstance(q, dict) or rng.random() < 0.15:
        q = cfg["quantization"] = rng.choice([None, [], "x", 4, {}, {"bits": 4, "group_size": 64, "mode": "mxfp4"},
                                              {"bits": 4, "group_size": 64}, {"quant_method": "gptq"}])
        cfg.pop("quantization_config", None)
        _write(path, cfg)
        return f"quantization -> {q!r}"
    kind = rng.randrange(3)
    if kind == 0:
        key = rng.choice(["bits", "group_size", "mode"])
        q[key] = rng.choice([2, 3, 4, 5, 6, 8, 16, 32, 64, 128, 256, *BAD_NUMBERS, "affine"])
        what = f"quantization {key} -> {q[key]!r}"
    elif kind == 1:  # a per-module override, as mixed-precision recipes write them
        module = rng.choice(["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.embed_tokens",
                             "model.layers.1.mlp.up_proj", "lm_head"])
        q[module] = rng.choice([False, True, {}, {"bits": rng.choice([2, 4, 8, 3, 0, "x", None])},
                                {"group_size": rng.choice([32, 64, 128, 0, 48, -64, None])},
                                {"bits": 8, "group_size": 32}, [], None, 4])
        what = f"quantization {module} -> {q[module]!r}"
    else:
        if q:
            q.pop(rng.choice(sorted(q)))
        what = "quantization key removed"
    cfg["quantization_config"] = q
    _write(path, cfg)
    return what


def _prompt_tokens(tok: dict) -> list[str]:
    """The tokens the worker's prompt encodes to: a changed id there reaches the embedding lookup."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(json.dumps(tok)).encode("Hello world").tokens
    except Exception:  # an earlier mutation broke the file: any token will do
        return []


def _mutate_tokenizer(folder: Path, rng: random.Random) -> str:
    how = rng.random()
    path = folder / "tokenizer.json"
    if how < 0.2:
        return _truncate(path, rng)
    if how < 0.35:
        return _mutate_tokenizer_config(folder, rng)
    tok = _read(path)
    if not isinstance(tok, dict):
        return _truncate(path, rng)
    model = tok.get("model") if isinstance(tok.get("model"), dict) else {}
    vocab = model.get("vocab")
    kind = rng.randrange(7)
    if kind == 0 and isinstance(vocab, dict) and vocab:  # a token id past the embedding, negative, or not a number
        used = _prompt_tokens(tok) if rng.random() < 0.5 else []
        t = rng.choice(used or sorted(vocab))
        vocab[t] = _number(rng, vocab[t])
        what = f"vocab {t!r} -> {vocab[t]!r}"
    elif kind == 0 and isinstance(vocab, list) and vocab:  # Unigram: [piece, score]
        i = rng.randrange(len(vocab))
        vocab[i] = rng.choice([["x", _number(rng)], [None, 0.0], "x", []])
        what = f"vocab[{i}] -> {vocab[i]!r}"
    elif kind == 1 and tok.get("added_tokens"):
        a = rng.choice(tok["added_tokens"])
        key = rng.choice(["id", "content", "special"])
        a[key] = _number(rng, a.get(key))
        what = f"added token {key} -> {a[key]!r}"
    elif kind == 2:
        key = rng.choice(["pre_tokenizer", "normalizer", "decoder", "post_processor"])
        tok[key] = rng.choice([None, {}, {"type": "Nope"}, [], "x", {"type": "Sequence", "pretokenizers": None},
                               {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [rng.choice(
                                    [10**6, -1, 2**32, 0])], "tokens": ["<s>"]}}}])
        what = f"{key} -> {tok[key]!r}"[:120]
    elif kind == 3 and model:
        key = rng.choice(["type", "merges", "unk_token", "byte_fallback", "vocab"])
        model[key] = rng.choice([None, "Nope", [], ["a b c"], [["a"]], 5, {}, "<nope>"])
        what = f"model {key} -> {model[key]!r}"
    else:
        return _truncate(path, rng)
    _write(path, tok)
    return what


def _mutate_tokenizer_config(folder: Path, rng: random.Random) -> str:
    name = rng.choice(["tokenizer_config.json", "generation_config.json", "chat_template.jinja"])
    path = folder / name
    if name == "chat_template.jinja":
        path.write_text(rng.choice(["{% for %}", "{{ messages[99999]['content'] }}", "{{ raise_exception('no') }}",
                                    "{% for m in messages %}{{ m.content * 1000000000 }}{% endfor %}", ""]))
        return f"{name} written"
    data = _read(path)
    data = data if isinstance(data, dict) else {}
    key = rng.choice(["bos_token", "eos_token", "add_bos_token", "add_eos_token", "chat_template", "eos_token_id",
                      "bos_token_id", "added_tokens_decoder"])
    data[key] = rng.choice([*BAD_NUMBERS, "<nope>", {"content": 5}, "{% if %}", [{"name": "default", "template": 5}]])
    _write(path, data)
    return f"{name} {key} -> {data[key]!r}"[:120]


def _mutate_index(folder: Path, rng: random.Random) -> str:
    path = folder / "model.safetensors.index.json"
    index = _read(path)
    if not isinstance(index, dict):
        index = {"metadata": {}, "weight_map": {}}
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        wm = index["weight_map"] = {"model.embed_tokens.weight": "model.safetensors"}
    kind = rng.randrange(5)
    if kind == 0:
        index["weight_map"] = rng.choice([None, [], "model.safetensors", 5, {}])
        what = f"weight_map -> {index['weight_map']!r}"
    elif kind == 1:
        t = rng.choice(sorted(wm))
        wm[t] = rng.choice(["missing.safetensors", "", ".", "..", "../seed-hf-llama/model.safetensors", "/etc/hostname",
                            "/dev/zero", "/proc/self/mem", "a\x00b", 5, None, ["x"], {"a": 1}, "config.json",
                            "tokenizer.json", "model.safetensors.index.json", "x" * 5000])
        what = f"weight_map[{t!r}] -> {wm[t]!r}"[:120]
    elif kind == 2:
        wm[rng.choice(["model.layers.0.mlp.up_proj.weight", "nope", ""])] = "model-00002-of-00002.safetensors"
        what = "weight_map names a second file"
    elif kind == 3:
        index.pop(rng.choice(["weight_map", "metadata"]), None)
        what = "index key removed"
    else:
        _write(path, index)
        return _truncate(path, rng)
    _write(path, index)
    return what


# ----------------------------------------------------------------------------- folders


MUTATORS: list[tuple[float, Callable[[Path, random.Random], str]]] = [
    (0.5, _mutate_safetensors), (0.3, _mutate_config), (0.12, _mutate_tokenizer), (0.08, _mutate_index)]


def mutate(src: Path, dest: Path, rng: random.Random) -> str:
    """Copy folder `src` to `dest` and change one to three things in it; returns what was done."""
    shutil.copytree(src, dest)
    done = []
    for _ in range(rng.randint(1, 3)):
        fn = rng.choices([m for _, m in MUTATORS], [w for w, _ in MUTATORS])[0]
        done.append(fn(dest, rng))
    return "; ".join(done)


def convert_worker() -> None:
    """Quantize each HF folder named on stdin to a GGUF (`infer quantize FOLDER OUT`): the
    converter's own reading of config.json and the tokenizer files, beside the loader's."""
    import tempfile

    from infer.models.quantize_file import QuantizeOptions, quantize_model

    with tempfile.TemporaryDirectory(prefix="convert-fuzz-") as d:
        out = Path(d) / "out.gguf"
        serve(lambda path: quantize_model(path, out, QuantizeOptions(type="Q8_0", force=True)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"]:
        convert_worker()
    else:
        sys.exit("usage: python tests/helpers/mlx_fuzz.py convert  (MLX folders: gguf_fuzz.py's worker)")
