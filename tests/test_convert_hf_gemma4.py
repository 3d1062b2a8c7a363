"""HF checkpoint -> GGUF for gemma4 (tests/helpers/hf_gemma4.py's folders, made from the tiny gemma4
GGUFs of tests/helpers/tiny_models.py: dense as the 31B, with E2B's shared-KV layers and double-wide
FFNs in Gemma4ForConditionalGeneration's layout, with E2B's per-layer embeddings, with 26B-A4B's
experts in Gemma4ForConditionalGeneration's layout): the converter gives back every gemma4.* key and
every tensor of the GGUF the folder was made from (the per-layer sliding-window flags, KV heads and
FFN widths, the two head sizes and rotated dims, rope_freqs of the proportional RoPE,
layer_output_scale, the per-layer embedding tensors, no norm offset, the expert keys, the router and
its input scale, the fused experts and their output scales, the experts' branch norms), and the
tokenizer keys llama.cpp's Gemma4 converter writes; llama.cpp and infer agree on the converted file."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.hf_gemma4 import gemma4_folder
from helpers.logits import assert_matches_llama_cpp, cpu_logits
from helpers.tiny_models import GEMMA4_PER_LAYER, TINY_SEEDS, write_tiny_gemma4
from infer.models.convert_hf import ConvertError, write_gguf_unquantized

VARIANTS = {"dense": ({}, False), "shared-multimodal": ({"shared": True}, True),
            "ple": ({"per_layer": GEMMA4_PER_LAYER}, False), "moe-multimodal": ({"moe": True}, True)}


@pytest.fixture(scope="module", params=list(VARIANTS))
def converted(request, tmp_path_factory):
    kw, multimodal = VARIANTS[request.param]
    d = tmp_path_factory.mktemp("gemma4")
    src = write_tiny_gemma4(d / "tiny.gguf", TINY_SEEDS["gemma4"], float_type=GT.F32, **kw)
    gemma4_folder(src, d / "Tiny-gemma4", multimodal)
    return src, write_gguf_unquantized(d / "Tiny-gemma4", d / "converted.gguf"), request.param


def _kvs(path) -> dict:
    return {f.name: f.contents() for f in gguf.GGUFReader(path).fields.values()}


def test_keys_and_tensors_as_the_gguf_they_came_from(converted):
    src, out, _ = converted
    want, got = _kvs(src), _kvs(out)
    arch_keys = {k for k in want if k.startswith("gemma4.")} | {k for k in got if k.startswith("gemma4.")}
    assert {k: got.get(k) for k in arch_keys} == {k: want.get(k) for k in arch_keys}
    assert got["tokenizer.ggml.tokens"] == want["tokenizer.ggml.tokens"]
    types = got["tokenizer.ggml.token_type"]
    assert types[:3] == [3, 3, 3] and set(types[3:259]) == {6} and set(types[259:]) == {1}  # control, byte, normal
    assert got["tokenizer.ggml.model"] == "gemma4" and got["tokenizer.ggml.add_space_prefix"] is False
    assert got["tokenizer.ggml.add_bos_token"] is True and set(got["tokenizer.ggml.scores"]) == {-1000.0}
    a = {t.name: t for t in gguf.GGUFReader(src).tensors}
    b = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert set(a) == set(b)
    for name, t in a.items():
        assert b[name].tensor_type == t.tensor_type == GT.F32, name
        np.testing.assert_array_equal(np.asarray(b[name].data), np.asarray(t.data), err_msg=name)


def test_visible_markers_and_refusals(tmp_path):
    import json

    src = write_tiny_gemma4(tmp_path / "tiny.gguf", TINY_SEEDS["gemma4"], float_type=GT.F32)
    folder = tmp_path / "Tiny-gemma4"
    gemma4_folder(src, folder)
    tj = json.loads((folder / "tokenizer.json").read_text())
    n = len(tj["model"]["vocab"])
    tj["added_tokens"] += [{"id": n, "content": "<|tool_call>", "special": True},
                           {"id": n + 1, "content": "<|turn>", "special": True}]
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ConvertError, match="tokenizer has 322 tokens but the embedding has 320 rows"):
        write_gguf_unquantized(folder, tmp_path / "bad.gguf")  # two tokens past the embedding
    from infer.models.convert_hf import source_from_hf
    from infer.models.hf_files import Kvs
    from infer.models.hf_vocab import gemma4_vocab

    kv = Kvs("gemma4")
    assert gemma4_vocab(folder, kv) == n + 2
    types = dict((k, v) for k, _, v in kv.items)["tokenizer.ggml.token_type"]
    assert types[n:].tolist() == [4, 3]  # the call marker rendered (USER_DEFINED), <|turn> a control token
    config = json.loads((folder / "config.json").read_text())
    for change, message in (({"enable_moe_block": True}, "enable_moe_block is set but num_experts is not"),
                            ({"num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8},
                             "top_k_experts 5 is more than num_experts 4"),
                            ({"layer_types": ["sliding_attention"]}, "layer_types"),
                            ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "proportional")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ConvertError, match=message):
            source_from_hf(folder)


@pytest.mark.reference
def test_llama_cpp_and_infer_agree_on_the_converted_file(converted):
    from infer.models.loader import load_model

    src, out, what = converted
    assert_matches_llama_cpp(cpu_logits(load_model(out)), out, f"converted gemma4 {what}")
    np.testing.assert_array_equal(cpu_logits(load_model(out)), cpu_logits(load_model(src)))
