"""HF checkpoint -> GGUF for granitehybrid (tests/helpers/hf_granitehybrid.py's tiny folders: Granite
4.0 H without experts, and with them as Granite 4.0 H Tiny): the keys llama.cpp's converter writes
(granite's multipliers, the ssm.* sizes from the mamba_* keys, head_count_kv per layer, RoPE off;
the expert counts and widths), the shared MLP's input split into gate and up (the dense FFN's, or
the shared expert's beside experts), the experts' input split into gate_exps and up_exps, A =
-exp(A_log) and A, D, the grouped norm reshaped; and logits of the HF math, llama.cpp and infer
agreeing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.hf_granitehybrid import (
    GH_EXPERTS,
    GH_FF_EXP,
    GH_FF_SHARED,
    GH_TYPES,
    GH_USED,
    MAMBA,
    granitehybrid_forward,
    make_granitehybrid,
)
from helpers.hf_models import HKV, D, F, from_bf16
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import write_gguf_unquantized

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granitehybrid") / "Tiny-granitehybrid"
    weights = make_granitehybrid(folder, seed=29)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-granitehybrid.gguf")


@pytest.fixture(scope="module")
def converted_moe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granitehybrid-moe") / "Tiny-granitehybrid-moe"
    weights = make_granitehybrid(folder, seed=31, experts=True)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-granitehybrid-moe.gguf")


def _bf16_data(t) -> np.ndarray:
    return from_bf16(np.asarray(t.data).view(np.uint16))


def test_metadata_and_tensors(converted):
    folder, weights, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    g = "granitehybrid."
    assert kv["general.architecture"] == "granitehybrid" and kv[g + "block_count"] == len(GH_TYPES)
    assert kv[g + "attention.head_count_kv"] == [HKV if t == "attention" else 0 for t in GH_TYPES]
    assert kv[g + "ssm.conv_kernel"] == 4 and kv[g + "ssm.state_size"] == 16 and kv[g + "ssm.group_count"] == 2
    assert kv[g + "ssm.inner_size"] == 2 * D and kv[g + "ssm.time_step_rank"] == 8
    assert kv[g + "rope.scaling.finetuned"] is False and kv[g + "context_length"] == 2**20
    assert kv[g + "feed_forward_length"] == F and kv[g + "expert_shared_feed_forward_length"] == F
    assert kv[g + "embedding_scale"] == 3.0 and kv[g + "logit_scale"] == 4.0
    names = {t.name: t for t in r.tensors}
    a = names["blk.0.ssm_a"]
    assert a.shape.tolist() == [1, 8]  # ggml's order: (1, heads)
    np.testing.assert_allclose(np.asarray(a.data).reshape(8), -np.exp(weights["model.layers.0.mamba.A_log"]),
                               rtol=1e-6)
    assert names["blk.0.ssm_d"].shape.tolist() == [1, 8] and names["blk.0.ssm_norm.weight"].shape.tolist() == [D, 2]
    both = weights["model.layers.0.shared_mlp.input_linear.weight"]
    for part, rows in (("ffn_gate", both[:F]), ("ffn_up", both[F:])):
        np.testing.assert_array_equal(from_bf16(np.asarray(names[f"blk.0.{part}.weight"].data).view(np.uint16)), rows)
    conv = names["blk.0.ssm_conv1d.weight"]
    C = 2 * D + 2 * MAMBA["mamba_n_groups"] * MAMBA["mamba_d_state"]
    assert gguf.GGMLQuantizationType(conv.tensor_type).name == "F32" and conv.shape.tolist()[::-1] == [C, 4]
    assert "blk.0.ssm_dt.bias" in names and "blk.0.ffn_down.weight" in names and "output.weight" not in names




@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    folder, weights, out = converted
    assert_converted_agrees(folder, out, lambda i: granitehybrid_forward(weights, i), "granitehybrid")


def test_experts_metadata_and_tensors(converted_moe):
    # as llama.cpp's GraniteMoeModel: experts intermediate_size wide (feed_forward_length; no
    # expert_feed_forward_length), input_linear's halves per expert as gate_exps and up_exps,
    # output_linear as down_exps, the router as ffn_gate_inp (float32), the shared MLP as ffn_*_shexp
    folder, weights, out = converted_moe
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    g = "granitehybrid."
    assert kv[g + "expert_count"] == GH_EXPERTS and kv[g + "expert_used_count"] == GH_USED
    assert kv[g + "feed_forward_length"] == GH_FF_EXP and kv[g + "expert_shared_feed_forward_length"] == GH_FF_SHARED
    assert g + "expert_feed_forward_length" not in kv
    names = {t.name: t for t in r.tensors}
    for i in range(len(GH_TYPES)):
        p, hf = f"blk.{i}.", f"model.layers.{i}."
        both = weights[hf + "block_sparse_moe.input_linear.weight"]
        for part, want in (("gate", both[:, :GH_FF_EXP]), ("up", both[:, GH_FF_EXP:])):
            t = names[p + f"ffn_{part}_exps.weight"]
            assert t.shape.tolist()[::-1] == [GH_EXPERTS, GH_FF_EXP, D]
            np.testing.assert_array_equal(_bf16_data(t).reshape(want.shape), want)
        np.testing.assert_array_equal(_bf16_data(names[p + "ffn_down_exps.weight"]).reshape(GH_EXPERTS, D, GH_FF_EXP),
                                      weights[hf + "block_sparse_moe.output_linear.weight"])
        router = names[p + "ffn_gate_inp.weight"]  # float32, as llama.cpp's converter writes every router
        assert router.tensor_type == gguf.GGMLQuantizationType.F32
        np.testing.assert_array_equal(np.asarray(router.data).reshape(GH_EXPERTS, D),
                                      weights[hf + "block_sparse_moe.router.layer.weight"])
        shared = weights[hf + "shared_mlp.input_linear.weight"]
        for part, want in (("gate", shared[:GH_FF_SHARED]), ("up", shared[GH_FF_SHARED:])):
            np.testing.assert_array_equal(_bf16_data(names[p + f"ffn_{part}_shexp.weight"]).reshape(want.shape), want)
        np.testing.assert_array_equal(_bf16_data(names[p + "ffn_down_shexp.weight"]).reshape(D, GH_FF_SHARED),
                                      weights[hf + "shared_mlp.output_linear.weight"])
        assert not {p + f"ffn_{n}.weight" for n in ("gate", "up", "down")} & names.keys()


@pytest.mark.reference
def test_experts_logits_match_hf_math_llama_cpp_and_infer(converted_moe):
    folder, weights, out = converted_moe
    assert_converted_agrees(folder, out, lambda i: granitehybrid_forward(weights, i), "granitehybrid with experts")
