"""HF checkpoint -> GGUF for llama4 (tests/helpers/hf_llama4.py's tiny Llama4ForConditionalGeneration):
the keys and tensors llama.cpp's Llama4Model writes (the dense FFN's width from intermediate_size_mlp,
the experts' from intermediate_size, the interleave step; the fused, transposed experts split into
gate and up; Q/K rows as stored; no vision tensor), and logits of the HF math, llama.cpp and infer
agreeing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.hf_llama4 import LLAMA4, llama4_forward, make_llama4
from helpers.hf_models import HD, HKV, D, F
from helpers.logits import assert_converted_agrees
from infer.models.convert_hf import write_gguf_unquantized


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama4") / "Tiny-llama4"
    weights = make_llama4(folder, seed=23)
    return folder, weights, write_gguf_unquantized(folder, folder.parent / "tiny-llama4.gguf")


def test_metadata_and_tensors(converted):
    folder, weights, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == "llama4" and kv["llama4.block_count"] == LLAMA4["num_hidden_layers"]
    assert kv["llama4.feed_forward_length"] == F and kv["llama4.expert_feed_forward_length"] == 256
    assert kv["llama4.interleave_moe_layer_step"] == 2 and kv["llama4.expert_count"] == 4
    assert kv["llama4.expert_used_count"] == 1 and kv["llama4.attention.head_count_kv"] == HKV
    assert kv["llama4.rope.dimension_count"] == HD and "llama4.attention.sliding_window" not in kv
    names = {t.name: t for t in r.tensors}
    assert not any(n.startswith(("v.", "mm.")) for n in names)  # the vision part is llama.cpp's mmproj
    assert "output.weight" in names and "blk.0.ffn_gate.weight" in names and "blk.0.ffn_gate_inp.weight" not in names
    lm = "language_model.model.layers."
    q = np.asarray(names["blk.2.attn_q.weight"].data).reshape(-1, D)
    np.testing.assert_array_equal(q, weights[lm + "2.self_attn.q_proj.weight"])  # not permuted
    gu = weights[lm + "1.feed_forward.experts.gate_up_proj"]  # (E, D, 2 ff)
    for name, half in (("gate", gu[:, :, :256]), ("up", gu[:, :, 256:])):
        t = names[f"blk.1.ffn_{name}_exps.weight"]
        assert t.shape.tolist()[::-1] == [4, 256, D]
        np.testing.assert_array_equal(np.asarray(t.data).reshape(4, 256, D), half.swapaxes(1, 2))
    down = names["blk.3.ffn_down_exps.weight"]
    np.testing.assert_array_equal(np.asarray(down.data).reshape(4, D, 256),
                                  weights[lm + "3.feed_forward.experts.down_proj"].swapaxes(1, 2))
    assert names["blk.3.ffn_gate_shexp.weight"].shape.tolist()[::-1] == [256, D]


@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    folder, weights, out = converted
    assert_converted_agrees(folder, out, lambda i: llama4_forward(weights, i), "llama4")


def test_mlx_export_is_refused(converted):
    # an MLX (HF-layout) checkpoint would need the experts fused and transposed back and Llama 4's
    # own config keys: refused
    from infer.models.loader import load_model
    from infer.models.mlx_export import hf_config
    from infer.models.quantize_file import QuantizeError

    model = load_model(converted[2])
    with pytest.raises(QuantizeError, match="not undone"):
        hf_config(model.config, model.metadata, False, False, None, "float16", 4, 64)
