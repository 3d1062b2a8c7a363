"""HF checkpoint -> GGUF for qwen35 (tests/helpers/hf_qwen35.py's tiny folder, more value heads
than key heads): the keys llama.cpp's converter writes (ssm.*, full_attention_interval, partial
RoPE and its sections), the V heads reordered to ggml's tiling, A = -exp(A_log), the (1 + w) norms
shifted but the gated norm's, and logits of the HF math, llama.cpp and infer agreeing."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from helpers.hf_models import D, from_bf16, write_safetensors
from helpers.hf_qwen35 import QWEN35_TYPES, make_qwen35, qwen35_forward
from infer.backends.cpu.runner import CpuRunner
from infer.models.convert_hf import write_gguf_unquantized
from infer.models.hf_files import read_safetensors_header, st_array
from infer.models.loader import load_model

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen35") / "Tiny-qwen35"
    weights = make_qwen35(folder, seed=23)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-qwen35.gguf")


def test_metadata_and_tensors(converted):
    folder, weights, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == "qwen35" and kv["qwen35.block_count"] == len(QWEN35_TYPES)
    assert kv["qwen35.ssm.conv_kernel"] == 4 and kv["qwen35.ssm.state_size"] == 32
    assert kv["qwen35.ssm.group_count"] == 2 and kv["qwen35.ssm.time_step_rank"] == 4
    assert kv["qwen35.ssm.inner_size"] == 128 and kv["qwen35.full_attention_interval"] == 2
    assert kv["qwen35.rope.dimension_count"] == 32 and kv["qwen35.rope.dimension_sections"] == [6, 5, 5, 0]
    names = {t.name: t for t in r.tensors}
    a = np.asarray(names["blk.0.ssm_a"].data)
    np.testing.assert_allclose(a, -np.exp(weights["model.layers.0.linear_attn.A_log"])[[0, 2, 1, 3]], rtol=1e-6)
    z = np.asarray(names["blk.0.attn_gate.weight"].data).view(np.uint16).reshape(4, 32, D)
    hf_z = weights["model.layers.0.linear_attn.in_proj_z.weight"].reshape(4, 32, D)
    # value heads grouped by key head in HF (k0: v0 v1, k1: v2 v3), tiled in GGUF (v0 v2 v1 v3)
    np.testing.assert_array_equal(from_bf16(z), hf_z[[0, 2, 1, 3]])
    np.testing.assert_allclose(np.asarray(names["blk.0.ssm_norm.weight"].data),
                               weights["model.layers.0.linear_attn.norm.weight"])  # not shifted
    np.testing.assert_allclose(np.asarray(names["blk.0.attn_norm.weight"].data),
                               1 + weights["model.layers.0.input_layernorm.weight"], rtol=1e-6)
    conv = names["blk.0.ssm_conv1d.weight"]
    assert gguf.GGMLQuantizationType(conv.tensor_type).name == "F32" and conv.shape.tolist()[::-1] == [256, 4]
    assert "blk.1.attn_q.weight" in names and "blk.1.attn_gate.weight" not in names and "output.weight" not in names


def test_multimodal_checkpoint_converts_its_text_model(converted, tmp_path):
    # Qwen3_5ForConditionalGeneration: text_config, model.language_model.* names, a vision tower and
    # a multi-token-prediction block, both left out: the same GGUF as the text-only checkpoint's
    folder, _, out = converted
    mm = tmp_path / folder.name
    mm.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / f, mm / f)
    cfg = json.loads((folder / "config.json").read_text())
    top = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "tie_word_embeddings": cfg.pop("tie_word_embeddings"), "vision_config": {"depth": 1}}
    (mm / "config.json").write_text(json.dumps({**top, "text_config": {**cfg, "model_type": "qwen3_5_text"}}))
    stored = {}
    for name, e in read_safetensors_header(folder / "model.safetensors").items():
        stored[name.replace("model.", "model.language_model.", 1)] = (st_array(e, name), e.dtype)
    stored["model.visual.patch_embed.proj.weight"] = (np.zeros((4, 4), np.float32), "F32")
    stored["mtp.fc.weight"] = (np.zeros((4, 4), np.float32), "F32")
    write_safetensors(mm / "model.safetensors", stored)
    assert write_gguf_unquantized(mm, tmp_path / "mm.gguf").read_bytes() == out.read_bytes()


@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    folder, weights, out = converted
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = hf.encode("Hello world! The quick brown fox jumps over 12345 lazy dogs.", add_special_tokens=False).ids
    llm = llama_cpp.Llama(model_path=str(out), logits_all=True, n_ctx=64, n_threads=2, verbose=False)
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    want = qwen35_forward(weights, ids)
    # as test_convert_hf: the HF math in float64, llama.cpp's rounded activations within 2% of max |logit|
    tol = 0.02 * np.abs(want).max()
    print(f"qwen35: max|llama.cpp - HF math| {np.abs(ref - want).max():.4g}, bound {tol:.4g}")
    assert np.abs(ref - want).max() <= tol
    np.testing.assert_array_equal(ref.argmax(-1), want.argmax(-1))
    model = load_model(out)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(64), all_logits=True).copy()
    print(f"qwen35: max|infer - llama.cpp| {np.abs(ours - ref).max():.4g}")
    assert np.abs(ours - ref).max() <= 0.02 * np.abs(ref).max()
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))


def test_mlx_export_is_refused(converted):
    # an MLX (HF-layout) checkpoint would need the V heads and A_log transformed back: refused
    from infer.models.mlx_export import hf_config
    from infer.models.quantize_file import QuantizeError

    model = load_model(converted[2])
    with pytest.raises(QuantizeError, match="not undone"):
        hf_config(model.config, model.metadata, True, False, None, "float16", 4, 64)
