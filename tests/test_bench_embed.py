"""scripts/bench_embed.py's inputs: its texts, and the random-weight BERT GGUFs it writes (read back
with gguf's reader; BERT-base's real shapes, loaded and run by llama.cpp)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bench_embed():
    sys.path.insert(0, str(SCRIPTS))  # its sibling modules (bench_serve, bench_shapes)
    try:
        spec = importlib.util.spec_from_file_location("bench_embed", SCRIPTS / "bench_embed.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(SCRIPTS))
        sys.modules.pop("bench_embed", None)


def read_back(path: Path) -> tuple[dict, dict]:
    """(the file's tensors: name -> (numpy shape, type name), its scalar and string keys)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    tensors = {t.name: (tuple(int(d) for d in reversed(t.shape)), t.tensor_type.name) for t in r.tensors}
    keys = {}
    for k, f in r.fields.items():
        if len(f.data) == 1 and f.types and f.types[0] != gguf.GGUFValueType.ARRAY:
            v = f.parts[f.data[0]]
            keys[k] = bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()
        else:
            keys[k] = len(f.data)
    return tensors, keys


def check_file(mod, shape, path: Path) -> dict:
    tensors, keys = read_back(path)
    want = mod.bert_tensors(shape)
    assert len(tensors) == len(want) == 5 + 16 * shape.n_layer
    for name, shp, matrix in want:
        assert tensors[name] == (shp, "F16" if matrix else "F32"), name
    assert tensors["token_embd.weight"][0] == (shape.n_vocab, shape.n_embd)
    assert tensors["blk.0.ffn_up.weight"][0] == (shape.n_ff, shape.n_embd)
    assert tensors["position_embd.weight"][0] == (shape.n_ctx_train, shape.n_embd)
    assert keys["general.architecture"] == "bert"
    assert (keys["bert.embedding_length"], keys["bert.feed_forward_length"], keys["bert.block_count"],
            keys["bert.attention.head_count"], keys["bert.context_length"]) == (
        shape.n_embd, shape.n_ff, shape.n_layer, shape.n_head, shape.n_ctx_train)
    assert keys["bert.attention.causal"] is False
    assert keys["bert.pooling_type"] == 1  # mean
    assert keys["tokenizer.ggml.model"] == "bert"
    assert keys["tokenizer.ggml.tokens"] == shape.n_vocab
    assert keys["tokenizer.ggml.token_type_count"] == shape.n_token_types
    return keys


def test_texts_are_deterministic_sentences_of_5_to_30_words(bench_embed):
    texts = bench_embed.make_texts(1000)
    assert texts == bench_embed.make_texts(1000)
    assert len(set(texts)) == 1000
    counts = [len(t.split()) - 1 for t in texts]  # the leading number makes each text unique
    assert min(counts) == 5 and max(counts) == 30


def test_a_small_bert_with_a_generated_vocabulary(bench_embed, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_embed, "bge_vocab_file", lambda: None)  # no sdist: the generated WordPiece vocabulary
    shape = bench_embed.BertShape(n_embd=64, n_ff=128, n_layer=2, n_head=4, n_ctx_train=128, n_vocab=2000)
    path = tmp_path / "bert.gguf"
    bench_embed.write_bert_f16(shape, path)
    keys = check_file(bench_embed, shape, path)
    tokens, types = bench_embed.bert_vocab(shape.n_vocab)
    assert len(tokens) == len(set(tokens)) == len(types) == shape.n_vocab
    assert [tokens[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (keys["tokenizer.ggml.unknown_token_id"], keys["tokenizer.ggml.cls_token_id"],
            keys["tokenizer.ggml.seperator_token_id"]) == (100, 101, 102)
    assert all("\u2581" + w in tokens for w in bench_embed.WORDS)  # the benchmark's words are whole tokens


@pytest.mark.slow
def test_bert_base_as_llama_cpp_loads_it(bench_embed, tmp_path, monkeypatch, llama_vocab_dir):
    """BERT-base's real shapes with llama.cpp's bge vocabulary: the file gguf reads back, and llama.cpp
    embeds a text with it (768 finite values)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    monkeypatch.setattr(bench_embed, "bge_vocab_file", lambda: llama_vocab_dir / "ggml-vocab-bert-bge.gguf")
    path = tmp_path / "bert-base.gguf"
    bench_embed.write_bert_f16(bench_embed.BERT_BASE, path)
    keys = check_file(bench_embed, bench_embed.BERT_BASE, path)
    assert keys["tokenizer.ggml.pre"] == "bert-bge"
    llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=512,
                          n_threads=2, verbose=False)
    v = np.asarray(llm.embed("The river walks quietly under the old bridge."), np.float32)
    assert v.shape == (768,) and np.isfinite(v).all() and np.abs(v).max() > 0
