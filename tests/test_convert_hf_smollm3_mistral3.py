"""HF checkpoint -> GGUF for SmolLM3 and Mistral 3, as llama.cpp's converter treats them: tiny
llama-layout folders (tests/helpers/hf_models.py) relabelled as SmolLM3ForCausalLM (4 layers, the
last without RoPE), Mistral3ForConditionalGeneration (the text model under language_model.*, beside
a vision tower that is not converted) and Ministral3ForCausalLM (YaRN with its betas, mscale_all_dim
and llama_4_scaling_beta), converted and checked against llama.cpp and the HF models' own math."""
from __future__ import annotations

import json
import struct
from functools import partial
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers.hf_models import hf_forward, make_hf_model
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import ConvertError, write_gguf_unquantized
from infer.models.loader import load_model

SMOL_NOPE = (False, False, False, True)  # SmolLM3's no_rope_layers [1, 1, 1, 0]: llama.cpp's every 4th layer
MINISTRAL_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "beta_fast": 16.0,
                  "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
                  "rope_theta": 10000.0}


def relabel(folder: Path, update, rename=None, extra: dict[str, np.ndarray] | None = None) -> None:
    """config.json updated by update(cfg); the safetensors' tensors renamed by rename(name) (their
    bytes as they are) and extra F32 tensors appended."""
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(update(cfg)))
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    meta = header.pop("__metadata__", None)
    out = {(rename(k) if rename else k): v for k, v in header.items()}
    for name, x in (extra or {}).items():
        b = x.astype(np.float32).tobytes()
        out[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    if meta is not None:
        out["__metadata__"] = meta
    head = json.dumps(out).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def kvs(path: Path) -> dict:
    return {f.name: f.contents() for f in gguf.GGUFReader(path).fields.values()}


@pytest.mark.reference
def test_smollm3_converts_with_its_layer_without_rope(tmp_path):
    folder = tmp_path / "Tiny-SmolLM3"
    weights = make_hf_model(folder, "llama", seed=21, n_layer=4)
    relabel(folder, lambda c: {**c, "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
                               "no_rope_layer_interval": 4, "no_rope_layers": [int(not n) for n in SMOL_NOPE]})
    out = write_gguf_unquantized(folder, tmp_path / "smollm3.gguf")
    kv = kvs(out)
    assert kv["general.architecture"] == "smollm3" and kv["smollm3.block_count"] == 4
    assert not any("no_rope" in k for k in kv)  # llama.cpp's converter writes none: the step is fixed
    assert load_model(out).config.layer_nope == SMOL_NOPE
    assert_converted_agrees(folder, out, partial(hf_forward, weights, "llama", nope=SMOL_NOPE), "smollm3")


def test_smollm3_other_rope_layers_are_refused(tmp_path):
    folder = tmp_path / "Tiny-SmolLM3"
    make_hf_model(folder, "llama", seed=21, n_layer=4)
    relabel(folder, lambda c: {**c, "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
                               "no_rope_layers": [1, 0, 1, 0]})
    with pytest.raises(ConvertError, match="no_rope_layers must be llama.cpp's pattern"):
        write_gguf_unquantized(folder, tmp_path / "smollm3.gguf")


@pytest.mark.reference
def test_mistral3_takes_the_text_model(tmp_path):
    """Mistral Small 3.x's layout: text_config, language_model.* tensors, a vision tower left out."""
    folder = tmp_path / "Tiny-Mistral3"
    weights = make_hf_model(folder, "llama", seed=22)
    text = lambda c: {k: v for k, v in c.items() if k not in ("architectures", "model_type")}  # noqa: E731
    relabel(folder, lambda c: {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
                               "text_config": {**text(c), "model_type": "mistral"}, "vision_config": {"hidden_size": 8},
                               "bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"]},
            rename=lambda n: "language_model." + n,
            extra={"vision_tower.patch_conv.weight": np.ones(4), "multi_modal_projector.linear_1.weight": np.ones(4)})
    out = write_gguf_unquantized(folder, tmp_path / "mistral3.gguf")
    kv = kvs(out)
    assert kv["general.architecture"] == "mistral3" and kv["mistral3.block_count"] == 2
    assert "mistral3.attention.temperature_scale" not in kv and "mistral3.rope.scaling.type" not in kv
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert "output.weight" in names and not any("vision" in n or "mm" in n for n in names)
    assert_converted_agrees(folder, out, partial(hf_forward, weights, "llama"), "mistral3")


@pytest.mark.reference
def test_ministral3_yarn_and_attention_temperature(tmp_path):
    folder = tmp_path / "Tiny-Ministral3"
    weights = make_hf_model(folder, "llama", seed=23)
    relabel(folder, lambda c: {**{k: v for k, v in c.items() if k != "rope_theta"}, "model_type": "ministral3",
                               "architectures": ["Ministral3ForCausalLM"], "rope_parameters": MINISTRAL_YARN})
    out = write_gguf_unquantized(folder, tmp_path / "ministral3.gguf")
    kv = kvs(out)
    assert kv["mistral3.rope.scaling.type"] == "yarn" and kv["mistral3.rope.scaling.original_context_length"] == 4
    assert kv["mistral3.rope.scaling.yarn_beta_fast"] == 16.0 and kv["mistral3.rope.scaling.yarn_beta_slow"] == 2.0
    assert kv["mistral3.rope.scaling.yarn_log_multiplier"] == 1.0
    assert kv["mistral3.attention.temperature_scale"] == pytest.approx(0.1)
    cfg = load_model(out).config
    assert cfg.attn_temp_scale == pytest.approx(0.1) and cfg.attn_temp_floor_scale == 4 and cfg.rope_attn_factor < 1
    assert_converted_agrees(folder, out, partial(hf_forward, weights, "llama", yarn=MINISTRAL_YARN), "ministral3")


def test_ministral3_without_its_scaling_keys_is_refused(tmp_path):
    folder = tmp_path / "Tiny-Ministral3"
    make_hf_model(folder, "llama", seed=23)
    yarn = {k: v for k, v in MINISTRAL_YARN.items() if k != "llama_4_scaling_beta"}
    relabel(folder, lambda c: {**c, "model_type": "ministral3", "architectures": ["Ministral3ForCausalLM"],
                               "rope_parameters": yarn})
    with pytest.raises(ConvertError, match="llama_4_scaling_beta"):
        write_gguf_unquantized(folder, tmp_path / "ministral3.gguf")
