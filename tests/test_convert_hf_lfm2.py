"""HF checkpoint -> GGUF for lfm2 and lfm2moe (tests/helpers/hf_lfm2.py's tiny folders): the keys
and tensors llama.cpp's converter writes (head_count_kv per layer, shortconv.l_cache, the adjusted
FFN width, the conv kernels squeezed to F32; lfm2moe's experts stacked, its expert bias, the
leading dense layer and sigmoid gating), and logits of the HF math, llama.cpp and infer agreeing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.hf_lfm2 import LFM2_L, LFM2_TYPES, LFM2MOE, lfm2_forward, make_lfm2
from helpers.hf_models import HKV, D, F
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import write_gguf_unquantized

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lfm2") / "Tiny-lfm2"
    weights = make_lfm2(folder, seed=21)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-lfm2.gguf")


@pytest.fixture(scope="module")
def converted_moe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lfm2moe") / "Tiny-lfm2moe"
    weights = make_lfm2(folder, seed=22, moe=True)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-lfm2moe.gguf")


def test_metadata_and_tensors(converted):
    folder, weights, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == "lfm2" and kv["lfm2.block_count"] == len(LFM2_TYPES)
    assert kv["lfm2.attention.head_count_kv"] == [0 if t == "conv" else HKV for t in LFM2_TYPES]
    assert kv["lfm2.shortconv.l_cache"] == LFM2_L and kv["lfm2.feed_forward_length"] == F
    assert kv["lfm2.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    names = {t.name: t for t in r.tensors}
    assert "output.weight" not in names and "token_embd_norm.weight" in names and "output_norm.weight" not in names
    conv = names["blk.0.shortconv.conv.weight"]
    assert gguf.GGMLQuantizationType(conv.tensor_type).name == "F32" and conv.shape.tolist()[::-1] == [D, LFM2_L]
    np.testing.assert_array_equal(np.asarray(conv.data).reshape(D, LFM2_L),
                                  weights["model.layers.0.conv.conv.weight"][:, 0, :])
    assert "blk.1.attn_q_norm.weight" in names and "blk.0.attn_q.weight" not in names
    assert gguf.GGMLQuantizationType(names["blk.0.shortconv.in_proj.weight"].tensor_type).name == "BF16"


def test_moe_metadata_and_tensors(converted_moe):
    folder, weights, out = converted_moe
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == "lfm2moe"
    assert kv["lfm2moe.attention.head_count_kv"] == [0 if t == "conv" else HKV for t in LFM2_TYPES]
    assert kv["lfm2moe.feed_forward_length"] == F and kv["lfm2moe.shortconv.l_cache"] == LFM2_L
    assert kv["lfm2moe.expert_count"] == LFM2MOE["num_experts"]
    assert kv["lfm2moe.expert_used_count"] == LFM2MOE["num_experts_per_tok"]
    assert kv["lfm2moe.expert_feed_forward_length"] == LFM2MOE["moe_intermediate_size"]
    assert kv["lfm2moe.leading_dense_block_count"] == 1 and kv["lfm2moe.expert_gating_func"] == 2  # sigmoid
    assert kv["lfm2moe.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    names = {t.name: t for t in r.tensors}
    assert "blk.0.ffn_gate.weight" in names and "blk.0.ffn_gate_inp.weight" not in names  # the dense layer
    E, Fe = LFM2MOE["num_experts"], LFM2MOE["moe_intermediate_size"]
    up = names["blk.1.ffn_up_exps.weight"]
    assert up.shape.tolist()[::-1] == [E, Fe, D] and "blk.1.ffn_up.weight" not in names
    bias = names["blk.2.exp_probs_b.bias"]
    assert gguf.GGMLQuantizationType(bias.tensor_type).name == "F32"
    np.testing.assert_array_equal(np.asarray(bias.data), weights["model.layers.2.feed_forward.expert_bias"])
    # expert 3's w3 (up) is the fourth slice of the stacked tensor (BF16 bits as stored)
    stored = np.asarray(up.data).view(np.uint16).reshape(E, Fe, D)[3]
    want = weights["model.layers.1.feed_forward.experts.3.w3.weight"]
    np.testing.assert_array_equal((stored.astype(np.uint32) << 16).view(np.float32), want)


@pytest.mark.reference
@pytest.mark.parametrize("which", ["converted", "converted_moe"])
def test_logits_match_hf_math_llama_cpp_and_infer(which, request):
    folder, weights, out = request.getfixturevalue(which)
    assert_converted_agrees(folder, out, lambda i: lfm2_forward(weights, i), which)
