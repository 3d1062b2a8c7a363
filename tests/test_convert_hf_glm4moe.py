"""HF checkpoint -> GGUF for glm4moe (tests/helpers/hf_glm4moe.py's tiny GLM-4.5 and GLM-4.5-Air
folders), as llama.cpp's converter (Glm4MoeModel) writes it: the routed and shared experts' keys,
the leading dense count, sigmoid gating, the weights' scale and norm, RoPE over half of each head,
the MTP layer converted as the last block (nextn_predict_layers), each layer's experts stacked,
the selection bias as exp_probs_b.bias, bos / eot / unk / eom named by GLM's tokens; and logits of
the HF math, llama.cpp and infer agreeing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.hf_glm4moe import GLM4MOE, glm4moe_forward, make_glm4moe
from helpers.hf_models import HD, D
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import write_gguf_unquantized
from infer.models.loader import load_model


@pytest.fixture(scope="module", params=["glm45", "air"])
def converted(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / f"Tiny-{request.param}"
    # (seed 31 puts two of GLM-4.5's HF-math logits 0.0006 apart, closer than llama.cpp's rounding)
    weights, cfg = make_glm4moe(folder, seed=32, air=request.param == "air")
    return folder, weights, cfg, write_gguf_unquantized(folder, folder.parent / f"tiny-{request.param}.gguf")


def test_metadata_and_tensors(converted):
    folder, weights, cfg, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    nextn = cfg["num_nextn_predict_layers"]
    assert kv["general.architecture"] == "glm4moe"
    assert kv["glm4moe.block_count"] == GLM4MOE["num_hidden_layers"] + nextn  # the MTP layer counted
    assert kv.get("glm4moe.nextn_predict_layers") == nextn
    for key, want in (("expert_count", "n_routed_experts"), ("expert_used_count", "num_experts_per_tok"),
                      ("expert_feed_forward_length", "moe_intermediate_size"),
                      ("expert_shared_count", "n_shared_experts"), ("leading_dense_block_count", "first_k_dense_replace"),
                      ("expert_group_count", "n_group"), ("expert_group_used_count", "topk_group")):
        assert kv[f"glm4moe.{key}"] == cfg[want], key
    assert kv["glm4moe.expert_gating_func"] == 2 and kv["glm4moe.expert_weights_norm"] is True  # sigmoid
    assert kv["glm4moe.expert_weights_scale"] == pytest.approx(2.5)
    assert kv["glm4moe.rope.dimension_count"] == HD // 2 and kv["glm4moe.attention.key_length"] == HD
    tok = kv["tokenizer.ggml.tokens"]
    for key, text in (("bos", "[gMASK]"), ("eot", "<|user|>"), ("eom", "<|observation|>"), ("eos", "<|endoftext|>")):
        assert tok[kv[f"tokenizer.ggml.{key}_token_id"]] == text, key
    names = {t.name: t for t in r.tensors}
    assert "blk.0.ffn_gate.weight" in names and "blk.0.ffn_gate_inp.weight" not in names  # the dense layer
    assert "blk.1.post_attention_norm.weight" in names and "blk.1.attn_q.bias" in names
    assert ("blk.1.attn_q_norm.weight" in names) is cfg["use_qk_norm"]
    assert ("blk.3.nextn.eh_proj.weight" in names) is bool(nextn) and ("blk.3.ffn_up_exps.weight" in names) is bool(nextn)
    E, Fe = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    up = names["blk.1.ffn_up_exps.weight"]
    assert up.shape.tolist()[::-1] == [E, Fe, D]
    assert names["blk.2.ffn_up_shexp.weight"].shape.tolist()[::-1] == [Fe * cfg["n_shared_experts"], D]
    bias = names["blk.2.exp_probs_b.bias"]
    assert gguf.GGMLQuantizationType(bias.tensor_type).name == "F32"
    np.testing.assert_array_equal(np.asarray(bias.data), weights["model.layers.2.mlp.gate.e_score_correction_bias"])
    assert gguf.GGMLQuantizationType(names["blk.1.ffn_gate_inp.weight"].tensor_type).name == "F32"
    # expert 3's up_proj is the fourth slice of the stacked tensor (BF16 bits as stored)
    stored = np.asarray(up.data).view(np.uint16).reshape(E, Fe, D)[3]
    np.testing.assert_array_equal((stored.astype(np.uint32) << 16).view(np.float32),
                                  weights["model.layers.1.mlp.experts.3.up_proj.weight"])
    config = load_model(out).config  # the MTP layer left out of what runs
    assert config.n_layer == GLM4MOE["num_hidden_layers"] and config.n_ff_shexp == Fe * cfg["n_shared_experts"]


@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    folder, weights, cfg, out = converted
    assert_converted_agrees(folder, out, lambda i: glm4moe_forward(weights, cfg, i), folder.name)
