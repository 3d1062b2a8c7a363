"""HF checkpoint -> GGUF for deepseek2 (tests/helpers/hf_deepseek2.py's tiny folders, with and
without Q compression (V2-Lite's 27 layers)): the keys and tensors llama.cpp's converter writes for MLA (one KV head,
the cache's sizes latent | RoPE part and latent, MLA's own; kv_b_proj split into attn_k_b, each
head's matrix transposed, and attn_v_b; the experts stacked, the shared expert, the leading dense
layer), and logits of the HF math, llama.cpp and infer agreeing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.hf_deepseek2 import DS_LAYERS, DS_MOE, DS_Q_RANK, DS_SIZES, deepseek2_forward, make_deepseek2
from helpers.hf_models import H
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import write_gguf_unquantized

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module", params=[False, True], ids=["lite", "q_lora"])
def converted(request, tmp_path_factory):
    q_lora = request.param
    folder = tmp_path_factory.mktemp("deepseek2") / "Tiny-deepseek2"
    weights = make_deepseek2(folder, seed=31 + q_lora, q_lora=q_lora)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-deepseek2.gguf"), q_lora


def test_metadata_and_tensors(converted):
    folder, weights, out, q_lora = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    R, nope, rope, v = (DS_SIZES[k] for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    a = "deepseek2."
    assert kv["general.architecture"] == "deepseek2" and kv[a + "attention.head_count_kv"] == 1
    assert (kv[a + "attention.key_length"], kv[a + "attention.value_length"]) == (R + rope, R)
    assert (kv[a + "attention.key_length_mla"], kv[a + "attention.value_length_mla"]) == (nope + rope, v)
    assert kv[a + "attention.kv_lora_rank"] == R and kv[a + "rope.dimension_count"] == rope
    assert kv.get(a + "attention.q_lora_rank") == (DS_Q_RANK if q_lora else None)
    assert kv[a + "leading_dense_block_count"] == 1 and kv[a + "expert_count"] == DS_MOE["n_routed_experts"]
    assert kv[a + "expert_shared_count"] == 1 and kv[a + "expert_weights_scale"] == pytest.approx(1.0)
    assert a + "expert_weights_norm" not in kv and a + "expert_gating_func" not in kv  # softmax: llama.cpp's default
    assert kv[a + "attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    names = {t.name: t for t in r.tensors}
    k_b, v_b = names["blk.0.attn_k_b.weight"], names["blk.0.attn_v_b.weight"]
    assert k_b.shape.tolist()[::-1] == [H, R, nope] and v_b.shape.tolist()[::-1] == [H, v, R]
    kv_b = weights["model.layers.0.self_attn.kv_b_proj.weight"].reshape(H, nope + v, R)
    bits = lambda t, shape: (np.asarray(t.data).view(np.uint16).reshape(shape).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(bits(k_b, (H, R, nope)), kv_b[:, :nope].transpose(0, 2, 1))
    np.testing.assert_array_equal(bits(v_b, (H, v, R)), kv_b[:, nope:])
    assert "blk.0.attn_kv_b.weight" not in names and ("blk.0.attn_q_a.weight" in names) == q_lora
    assert "blk.1.ffn_up_shexp.weight" in names and "blk.0.ffn_up.weight" in names
    assert names["blk.1.ffn_up_exps.weight"].shape.tolist()[::-1] == [DS_MOE["n_routed_experts"],
                                                                       DS_MOE["moe_intermediate_size"],
                                                                       weights["model.norm.weight"].shape[0]]
    assert len([n for n in names if n.endswith("attn_k_b.weight")]) == DS_LAYERS[q_lora]


@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    folder, weights, out, q_lora = converted
    assert_converted_agrees(folder, out, lambda ids: deepseek2_forward(weights, ids),
                            "deepseek2" + ("" if q_lora else "-lite"))
