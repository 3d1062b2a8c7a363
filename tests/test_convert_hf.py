"""HF checkpoint -> GGUF: tiny random llama / qwen2 / qwen3 / granite / olmo2 / gemma3 folders (tests/helpers/hf_models.py), converted,
then checked against llama.cpp (loading, tokenization, logits), against a numpy forward pass of the
HF model itself (so the tensor transforms are right, not merely self-consistent), and against infer."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from helpers.hf_models import (
    CHAT_TEMPLATE,
    GEMMA2_CAPS,
    GEMMA_LAYERS,
    GEMMA_WINDOW,
    HD,
    HKV,
    PHI3_MSCALE,
    PHI3_SHORT,
    SAMPLES,
    D,
    F,
    H,
    from_bf16,
    gemma3_forward,
    hf_forward,
    make_gemma3,
    make_hf_model,
    train_bpe,
    write_safetensors,
)
from infer.backends.cpu.runner import CpuRunner
from infer.engine.tokenizer import Tokenizer as InferTokenizer
from infer.models.convert_hf import (
    ConvertError,
    detect_pre_tokenizer,
    source_from_hf,
    write_gguf_unquantized,
)
from infer.models.loader import load_model

llama_cpp = pytest.importorskip("llama_cpp")


BPE_ARCHS = ["llama", "qwen2", "qwen3", "granite", "olmo2", "qwen3moe", "mixtral", "phi3"]
GGUF_ARCH = {"mixtral": "llama"}  # HF model types llama.cpp converts to another architecture
LLAMA3_VOCAB = ("llama", "mixtral")  # the folders with the Llama 3-style tokenizer (tests/helpers/hf_models.py)


@pytest.fixture(scope="module", params=BPE_ARCHS)
def converted(request, tmp_path_factory):
    arch = request.param
    # (the phi3 folder is Phi-4-like, and named so: llama.cpp marks tokens of a model named phi3 that
    # only Phi-3's SentencePiece vocabulary has)
    folder = tmp_path_factory.mktemp(arch) / ("Tiny-phi-4" if arch == "phi3" else f"Tiny-{arch}")
    weights = make_hf_model(folder, arch, seed=BPE_ARCHS.index(arch))
    out = write_gguf_unquantized(folder, folder.parent / f"tiny-{arch}.gguf")
    return arch, folder, weights, out


def test_metadata_and_tensors(converted):
    arch, folder, _, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    ga = GGUF_ARCH.get(arch, arch)
    assert kv["general.architecture"] == ga
    assert kv[f"{ga}.block_count"] == 2 and kv[f"{ga}.embedding_length"] == D
    assert kv[f"{ga}.attention.head_count_kv"] == HKV and kv[f"{ga}.feed_forward_length"] == F
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == ("llama-bpe" if arch in LLAMA3_VOCAB else "qwen2")
    assert kv["tokenizer.chat_template"] == CHAT_TEMPLATE
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = "<|eot_id|>" if arch in LLAMA3_VOCAB else "<|im_end|>"
    assert kv["tokenizer.ggml.eos_token_id"] == hf.token_to_id(eos)
    assert kv["tokenizer.ggml.add_bos_token"] is (arch in LLAMA3_VOCAB)
    names = {t.name: t for t in r.tensors}
    assert ("output.weight" in names) is (arch in ("llama", "olmo2", "mixtral", "phi3"))  # tied embeddings write no output matrix
    assert not any("rotary" in n for n in names)
    if arch == "phi3":  # fused Q/K/V: attn_qkv, as llama.cpp's converter maps qkv_proj; LongRoPE's tensors and magnitude
        names["blk.0.attn_q.weight"] = names["blk.0.attn_qkv.weight"]
        np.testing.assert_array_equal(names["rope_factors_short.weight"].data, PHI3_SHORT.astype(np.float32))
        np.testing.assert_array_equal(names["rope_factors_long.weight"].data, (PHI3_SHORT * 3).astype(np.float32))
        assert kv["phi3.rope.scaling.attn_factor"] == pytest.approx(PHI3_MSCALE)
        assert kv["phi3.rope.scaling.original_context_length"] == 256
    if arch in ("qwen3moe", "mixtral"):  # no dense FFN: the experts stacked into 3-D tensors, as llama.cpp's converter
        assert names["blk.0.ffn_up_exps.weight"].shape.tolist()[::-1] == [8, 256 if arch == "qwen3moe" else F, D]
        names["blk.0.ffn_up.weight"] = names["blk.0.ffn_up_exps.weight"]
    types = {gguf.GGMLQuantizationType(names["blk.0.attn_q.weight"].tensor_type).name,
             gguf.GGMLQuantizationType(names["blk.0.ffn_up.weight"].tensor_type).name}
    assert types == {"llama": {"BF16", "F32"}, "qwen2": {"F16"}, "qwen3": {"BF16"}, "granite": {"BF16"},
                     "olmo2": {"BF16", "F32"}, "qwen3moe": {"BF16"}, "mixtral": {"F16"}, "phi3": {"BF16"}}[arch]
    norm = "blk.0.post_ffw_norm.weight" if arch == "olmo2" else "blk.0.ffn_norm.weight"
    assert gguf.GGMLQuantizationType(names[norm].tensor_type).name == "F32"
    if arch == "granite":  # its multipliers, as llama.cpp's converter names them
        assert kv["granite.logit_scale"] == pytest.approx(4.0) and kv["granite.residual_scale"] == pytest.approx(0.5)
        assert kv["granite.embedding_scale"] == pytest.approx(3.0) and kv["granite.attention.scale"] == pytest.approx(0.09)
    if arch == "qwen2":
        tokens = kv["tokenizer.ggml.tokens"]
        assert len(tokens) == hf.get_vocab_size() + 6 and tokens[-1] == f"[PAD{len(tokens) - 1}]"


@pytest.mark.reference
def test_llama_cpp_tokenizes_like_hf(converted):
    arch, folder, _, out = converted
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    ours = InferTokenizer(load_model(out).metadata)
    for text in SAMPLES:
        want = hf.encode(text, add_special_tokens=False).ids
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == want, text
        assert ours.encode(text, add_special=False) == want, text
    bos = hf.token_to_id("<|begin_of_text|>")
    assert (llm.tokenize(b"Hi", add_bos=True)[0] == bos) is (arch in LLAMA3_VOCAB)
    im_end = "<|eot_id|>" if arch in LLAMA3_VOCAB else "<|im_end|>"
    assert llm.tokenize(im_end.encode(), add_bos=False, special=True) == [hf.token_to_id(im_end)]
    llm.close()


@pytest.mark.reference
def test_logits_match_hf_math_llama_cpp_and_infer(converted):
    arch, folder, weights, out = converted
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = hf.encode("Hello world! The quick brown fox jumps over 12345 lazy dogs.", add_special_tokens=False).ids
    llm = llama_cpp.Llama(model_path=str(out), logits_all=True, n_ctx=64, n_threads=2, verbose=False)
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    want = hf_forward(weights, arch, ids)
    n_tok = len(ref[0])
    assert want.shape == (len(ids), n_tok)
    # The reference runs the checkpoint in float64; llama.cpp rounds activations (F16 K/V cache,
    # F16 / BF16 matmul inputs), so 2% of the largest logit, as the other logit tests use.
    tol = 0.02 * np.abs(want).max()
    assert np.abs(ref - want).max() <= tol, f"{arch}: llama.cpp vs HF math {np.abs(ref - want).max():.4g}"
    np.testing.assert_array_equal(ref.argmax(-1), want.argmax(-1))

    model = load_model(out)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(64), all_logits=True).copy()
    assert np.abs(ours - ref).max() <= 0.02 * np.abs(ref).max()
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))


def test_lazy_tensors_and_shapes(converted):
    arch, folder, weights, _ = converted
    src = source_from_hf(folder)
    assert src.arch == GGUF_ARCH.get(arch, arch)
    by_name = {t.name: t for t in src.tensors}
    fused = arch == "phi3"  # Q, K, V in one matrix, kept as it is
    q = by_name["blk.0.attn_qkv.weight" if fused else "blk.0.attn_q.weight"]
    assert q.shape == ((H + 2 * HKV) * HD if fused else H * HD, D)
    data = q.load()
    got = from_bf16(data) if q.type_id == gguf.GGMLQuantizationType.BF16 else data.astype(np.float32)
    hfq = weights["model.layers.0.self_attn." + ("qkv_proj" if fused else "q_proj") + ".weight"]
    if arch in ("llama", "granite", "mixtral"):  # rows of each head interleaved: row 2j came from j, row 2j+1 from j + HD/2
        np.testing.assert_array_equal(got[1], hfq[HD // 2])
        np.testing.assert_array_equal(got[2], hfq[1])
    else:
        np.testing.assert_array_equal(got, hfq)


def test_pre_tokenizer_fallback_is_reported(tmp_path):
    tj = json.loads(train_bpe("qwen").to_str())
    assert detect_pre_tokenizer(tj) == "qwen2"
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    assert detect_pre_tokenizer(tj) is None


# the Split regex of Llama 4's and GPT-4o's tokenizer.json (o200k), as llama-vocab.cpp quotes it
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_o200k_pre_tokenizer_is_gpt4o():
    """Llama 4's (and GPT-4o's) regex is recognised as llama.cpp's "gpt-4o" (which reads "llama4"
    alike), and that pre-tokenizer splits text as the original regex does, but for combining marks:
    llama.cpp's rewrite of the regex leaves out \\p{M} (a letter + U+0301 + letter splits after the
    letter there, not in the original), and infer follows llama.cpp."""
    from tokenizers import Regex, pre_tokenizers

    from infer.engine.pretokenizers import PRE_TOKENIZERS, onig_regex

    tj = json.loads(train_bpe("qwen").to_str())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = O200K
    assert detect_pre_tokenizer(tj) == "gpt-4o"

    def pieces(regexes, text):
        steps = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
        return [p for p, _ in steps.pre_tokenize_str(text)]

    ours = [onig_regex(r) for r in PRE_TOKENIZERS["gpt-4o"].regexes]
    for text in ["Hello WORLD's HTTPServer they'LL 12345 don't\r\n\n  x/y//\n", "ÀÉÎ élan Ǆungla",
                 "  \tmixedCase camelCaseWord ALLCAPS'S 3.14159 ！？", "한국어 日本語テキスト ｶﾀｶﾅ"]:
        assert pieces(ours, text) == pieces([O200K], text), text
    assert pieces(ours, " a\u0301b") == [" a", "\u0301b"] and pieces([O200K], " a\u0301b") == [" a\u0301b"]


# ----------------------------------------------------------------------------- bad input

@pytest.fixture()
def small_folder(tmp_path):
    make_hf_model(tmp_path / "m", "qwen2", seed=5)
    return tmp_path / "m"


def test_missing_config(tmp_path):
    with pytest.raises(ConvertError, match="config.json"):
        source_from_hf(tmp_path)


def test_unsupported_model_type(small_folder):
    cfg = json.loads((small_folder / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (small_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=r"'mamba'.*llama, mixtral, qwen2, qwen3, gemma3.*qwen3_moe"):
        source_from_hf(small_folder)


def test_missing_tokenizer(small_folder):
    (small_folder / "tokenizer.json").unlink()
    with pytest.raises(ConvertError, match="tokenizer.json"):
        source_from_hf(small_folder)


def test_missing_weights(small_folder):
    (small_folder / "model.safetensors").unlink()
    with pytest.raises(ConvertError, match="model.safetensors"):
        source_from_hf(small_folder)


def test_truncated_weights(small_folder):
    path = small_folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ConvertError, match="past the end"):
        source_from_hf(small_folder)


def test_unsupported_dtype(small_folder):
    write_safetensors(small_folder / "model.safetensors",
                      {"model.embed_tokens.weight": (np.zeros((4, 4), np.int32), "I32")})
    with pytest.raises(ConvertError, match="dtype I32"):
        source_from_hf(small_folder)


@pytest.mark.reference
@pytest.mark.parametrize("arch", ["gemma3", "gemma2"])
def test_gemma_sentencepiece_and_logits(tmp_path, arch):
    import sentencepiece as spm
    folder = tmp_path / f"tiny-{arch}"
    weights = make_gemma3(folder, gemma2=arch == "gemma2")
    out = write_gguf_unquantized(folder, tmp_path / f"tiny-{arch}.gguf")
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["tokenizer.ggml.model"] == "llama" and kv["tokenizer.ggml.add_space_prefix"] is False
    assert kv[f"{arch}.attention.sliding_window"] == GEMMA_WINDOW
    if arch == "gemma3":
        assert kv["gemma3.rope.freq_base"] == 1e6
    else:
        assert kv["gemma2.attn_logit_softcapping"] == pytest.approx(GEMMA2_CAPS["attn_logit_softcapping"])
    assert kv["tokenizer.ggml.bos_token_id"] == 2 and kv["tokenizer.ggml.add_bos_token"] is True
    assert kv["tokenizer.chat_template"].startswith("{{ bos_token }}")
    assert "output.weight" not in {t.name for t in r.tensors}

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    llm = llama_cpp.Llama(model_path=str(out), logits_all=True, n_ctx=64, n_threads=2, verbose=False)
    for text in SAMPLES:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == sp.encode(text), text
    assert llm.tokenize(b"<end_of_turn>", add_bos=False, special=True) == [sp.piece_to_id("<end_of_turn>")]
    ids = [2] + sp.encode("Hello world! The quick brown fox jumps over 12345 lazy dogs.")
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    want = gemma3_forward(weights, ids, gemma2=arch == "gemma2")
    assert len(ids) > GEMMA_WINDOW
    assert np.abs(ref - want).max() <= 0.02 * np.abs(want).max(), np.abs(ref - want).max()
    model = load_model(out)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ours = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(64), all_logits=True).copy()
    assert np.abs(ours - want).max() <= 0.02 * np.abs(want).max()


def test_gemma3_multimodal_takes_the_text_model(tmp_path):
    make_gemma3(tmp_path / "mm", multimodal=True)
    src = source_from_hf(tmp_path / "mm")
    names = {t.name for t in src.tensors}
    assert src.arch == "gemma3"
    assert "token_embd.weight" in names and f"blk.{GEMMA_LAYERS - 1}.post_ffw_norm.weight" in names
    assert not any("vision" in n or "mm" in n for n in names)
    norm = next(t for t in src.tensors if t.name == "output_norm.weight")
    assert norm.type_id == gguf.GGMLQuantizationType.F32 and abs(norm.load().mean() - 1.0) < 0.05  # +1 applied
    kv = {k: v for k, _, v in src.kvs}
    assert kv["gemma3.block_count"] == GEMMA_LAYERS and kv["gemma3.attention.key_length"] == HD


def test_llama3_rope_scaling_becomes_rope_freqs(small_folder, tmp_path):
    folder = tmp_path / "l3"
    make_hf_model(folder, "llama", seed=9)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(cfg))
    src = source_from_hf(folder)
    rf = next(t for t in src.tensors if t.name == "rope_freqs.weight").load()
    assert rf.shape == (HD // 2,) and rf[0] == 1.0 and rf[-1] == 8.0  # fast dims kept, slow ones stretched
    assert np.all(np.diff(rf) >= 0)
    assert not any(k.startswith("llama.rope.scaling") for k, _, _ in src.kvs)
    out = write_gguf_unquantized(folder, tmp_path / "l3.gguf")
    assert load_model(out).weights.rope_freqs is not None


@pytest.mark.e2e
@pytest.mark.reference
def test_infer_quantize_converts_an_hf_folder(small_folder, tmp_path):
    """The CLI path: an HF folder in, a Q8_0 GGUF out that llama.cpp loads and infer runs."""
    import json
    import subprocess
    import sys

    out = tmp_path / "tiny-q8_0.gguf"
    r = subprocess.run([sys.executable, "-m", "infer.cli", "quantize", str(small_folder), str(out), "--type", "Q8_0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, verbose=False)
    assert llm.tokenize(b"hello world", add_bos=False)
    llm.close()
    run = subprocess.run([sys.executable, "-m", "infer.cli", "run", str(out), "hello", "--raw", "-n", "3",
                          "--temperature", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["completion_tokens"] >= 1
    bad = subprocess.run([sys.executable, "-m", "infer.cli", "quantize", str(tmp_path / "nope"), str(tmp_path / "x.gguf")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_phi3_folders_not_converted_say_why(tmp_path):
    # Phi-3's SentencePiece vocabulary is not converted yet, and LongRoPE factors must fit the heads:
    # one clear error each
    folder = tmp_path / "Tiny-phi-4"
    make_hf_model(folder, "phi3", seed=1)
    tcfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tcfg, "tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ConvertError, match="SentencePiece tokenizer"):
        source_from_hf(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "longrope", "long_factor": [1.0] * HD, "short_factor": [1.0] * HD}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="LongRoPE needs 32 long and short factors, got 64 and 64"):
        source_from_hf(folder)
