"""HF checkpoint -> GGUF for qwen35 (tests/helpers/hf_qwen35.py's tiny folder, more value heads
than key heads): the keys llama.cpp's converter writes (ssm.*, full_attention_interval, partial
RoPE and its sections), the V heads reordered to ggml's tiling, A = -exp(A_log), the (1 + w) norms
shifted but the gated norm's, and logits of the HF math, llama.cpp and infer agreeing. The same for
qwen35moe and qwen3next (the folder's MoE variants): the experts stacked (from one tensor per
expert or transformers 5's fused ones), the shared expert and its gate, Qwen3-Next's in_proj_qkvz
regrouped into attn_qkv and attn_gate, its V heads left grouped, and the MTP block left out."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest

from helpers.hf_models import D, from_bf16, write_safetensors
from helpers.hf_qwen35 import MOE_FF, N_EXPERT, N_USED, QWEN35_TYPES, SHARED_FF, make_qwen35, qwen35_forward
from helpers.logits import assert_converted_agrees
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
    assert_converted_agrees(folder, out, lambda i: qwen35_forward(weights, i), "qwen35")


def test_mlx_export_is_refused(converted):
    # an MLX (HF-layout) checkpoint would need the V heads and A_log transformed back: refused
    from infer.models.mlx_export import hf_config
    from infer.models.quantize_file import QuantizeError

    model = load_model(converted[2])
    with pytest.raises(QuantizeError, match="not undone"):
        hf_config(model.config, model.metadata, True, False, None, "float16", 4, 64)


# -- Qwen3.5 MoE and Qwen3-Next (llama.cpp's Qwen3_5MoeTextModel and Qwen3NextModel)

@pytest.fixture(scope="module", params=["qwen35moe", "qwen3next"])
def converted_moe(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / f"Tiny-{request.param}"
    weights = make_qwen35(folder, seed=29, variant=request.param)
    return request.param, folder, weights, write_gguf_unquantized(folder, folder.parent / f"tiny-{request.param}.gguf")


def _stored(folder, name):
    return next(st_array(e, n) for n, e in read_safetensors_header(folder / "model.safetensors").items() if n == name)


def test_moe_metadata_and_tensors(converted_moe):
    arch, folder, weights, out = converted_moe
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == arch and kv[f"{arch}.block_count"] == len(QWEN35_TYPES)
    assert kv[f"{arch}.expert_count"] == N_EXPERT and kv[f"{arch}.expert_used_count"] == N_USED
    assert kv[f"{arch}.expert_feed_forward_length"] == MOE_FF
    assert kv[f"{arch}.expert_shared_feed_forward_length"] == SHARED_FF
    assert kv[f"{arch}.ssm.group_count"] == 2 and kv[f"{arch}.ssm.time_step_rank"] == 4
    assert kv[f"{arch}.full_attention_interval"] == 2 and kv[f"{arch}.rope.dimension_count"] == 32
    # Qwen3.5 MoE's config has no dense width; Qwen3-Next's RoPE has no sections
    assert (f"{arch}.feed_forward_length" in kv) == (arch == "qwen3next")
    assert (f"{arch}.rope.dimension_sections" in kv) == (arch == "qwen35moe")
    assert f"{arch}.nextn_predict_layers" not in kv
    names = {t.name: t for t in r.tensors}
    bf = lambda t, shape: from_bf16(np.asarray(names[t].data).view(np.uint16)).reshape(shape)
    for il in range(len(QWEN35_TYPES)):  # per-expert (layer 0) and fused (qwen35moe's others) alike
        p, hp = f"blk.{il}.", f"model.layers.{il}.mlp."
        for w, shape in (("gate", (MOE_FF, D)), ("up", (MOE_FF, D)), ("down", (D, MOE_FF))):
            want = np.stack([weights[f"{hp}experts.{e}.{w}_proj.weight"] for e in range(N_EXPERT)])
            np.testing.assert_array_equal(bf(p + f"ffn_{w}_exps.weight", (N_EXPERT, *shape)), want)
            shared = weights[f"{hp}shared_expert.{w}_proj.weight"]
            np.testing.assert_array_equal(bf(p + f"ffn_{w}_shexp.weight", shared.shape), shared)
        # the router and the shared expert's gate in float32, as llama.cpp's converter writes them
        for t, hf in (("ffn_gate_inp", "gate"), ("ffn_gate_inp_shexp", "shared_expert_gate")):
            assert gguf.GGMLQuantizationType(names[p + t + ".weight"].tensor_type).name == "F32"
            np.testing.assert_array_equal(np.asarray(names[p + t + ".weight"].data).reshape(-1, D), weights[hp + hf + ".weight"])
        assert names[p + "ffn_gate_inp_shexp.weight"].shape.tolist() == [D, 1]
    a = np.asarray(names["blk.0.ssm_a"].data)
    z = bf("blk.0.attn_gate.weight", (4, 32, D))
    hf_z = weights["model.layers.0.linear_attn.in_proj_z.weight"].reshape(4, 32, D)
    a_log = weights["model.layers.0.linear_attn.A_log"]
    if arch == "qwen3next":  # no V-head reorder; in_proj_qkvz regrouped, in_proj_ba as stored
        np.testing.assert_allclose(a, -np.exp(a_log), rtol=1e-6)
        np.testing.assert_array_equal(z, hf_z)
        np.testing.assert_array_equal(bf("blk.0.attn_qkv.weight", (256, D)),
                                      weights["model.layers.0.linear_attn.in_proj_qkv.weight"])
        np.testing.assert_array_equal(np.asarray(names["blk.0.ssm_ba.weight"].data).view(np.uint16).reshape(8, D),
                                      _stored(folder, "model.layers.0.linear_attn.in_proj_ba.weight"))
        assert "blk.0.ssm_beta.weight" not in names and "blk.0.ssm_in.weight" not in names
    else:  # Qwen3.5's V heads tiled
        np.testing.assert_allclose(a, -np.exp(a_log)[[0, 2, 1, 3]], rtol=1e-6)
        np.testing.assert_array_equal(z, hf_z[[0, 2, 1, 3]])
    np.testing.assert_allclose(np.asarray(names["blk.1.attn_q_norm.weight"].data),
                               1 + weights["model.layers.1.self_attn.q_norm.weight"], rtol=1e-6)


def test_moe_mtp_block_is_left_out(converted_moe, tmp_path):
    # the checkpoint's multi-token-prediction block (mtp.*) is dropped, as llama.cpp's --no-mtp does
    arch, folder, _, out = converted_moe
    mm = tmp_path / folder.name
    mm.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(folder / f, mm / f)
    stored = {n: (st_array(e, n), e.dtype) for n, e in read_safetensors_header(folder / "model.safetensors").items()}
    stored["mtp.fc.weight"] = (np.zeros((D, 2 * D), np.float32), "F32")
    stored["mtp.layers.0.mlp.experts.0.up_proj.weight"] = (np.zeros((MOE_FF, D), np.float32), "F32")
    write_safetensors(mm / "model.safetensors", stored)
    assert write_gguf_unquantized(mm, tmp_path / "mtp.gguf").read_bytes() == out.read_bytes()


@pytest.mark.reference
def test_moe_logits_match_hf_math_llama_cpp_and_infer(converted_moe):
    arch, folder, weights, out = converted_moe
    assert_converted_agrees(folder, out, lambda i: qwen35_forward(weights, i), arch)


@pytest.mark.parametrize("variant", ["qwen35", "qwen35moe", "qwen3next"])
def test_folder_is_not_run_unconverted(tmp_path, variant):
    # the folder itself (the MLX loader's path) would skip the converter's transforms: refused, naming the fix
    from infer.models.loader import ModelLoadError
    from infer.models.mlx_folder import load_mlx_folder

    make_qwen35(tmp_path / variant, seed=5, variant=variant)
    with pytest.raises(ModelLoadError, match=f"a {variant} checkpoint's tensors need llama.cpp's converter's "
                                             "transforms.*infer quantize"):
        load_mlx_folder(tmp_path / variant)
