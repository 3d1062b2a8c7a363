"""HF checkpoint -> GGUF: tiny random llama / qwen2 / qwen3 / gemma3 folders written here, converted,
then checked against llama.cpp (loading, tokenization, logits), against a numpy forward pass of the
HF model itself (so the tensor transforms are right, not merely self-consistent), and against infer."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from infer.backends.cpu.transformer import CpuTransformer
from infer.engine.tokenizer import Tokenizer as InferTokenizer
from infer.models.convert_hf import (
    ConvertError,
    detect_pre_tokenizer,
    source_from_hf,
    write_gguf_unquantized,
)
from infer.models.loader import load_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

llama_cpp = pytest.importorskip("llama_cpp")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you doing today? I'm fine, thanks.",
    "Numbers like 12345 and 3.14159 appear in text sometimes.",
    "def add(a, b):\n    return a + b\n",
    "Sphinx of black quartz, judge my vow. Pack my box with five dozen liquor jugs.",
] * 4
SAMPLES = ["Hello world! The fox jumps.", "numbers 12345 and 007", "  leading spaces\nand\n\nnewlines",
           "I'm you're they'll", "déjà vu ✓ 🙂"]
_CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
SPLITS = {
    "llama": _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen": _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
SPECIALS = {
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
    "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
D, H, HKV, HD, F = 256, 4, 2, 64, 512


def train_bpe(style: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[style]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=SPECIALS[style],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if style == "llama":
        # Llama 3's tokenizer keeps a word that is already in the vocabulary whole, and so does
        # llama.cpp for 'llama-bpe'; make the trained tokenizer behave the same.
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
    return tok


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format by hand (header length, JSON header, raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name, (arr, dtype) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def bf16(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def make_hf_model(folder: Path, arch: str, seed: int) -> dict[str, np.ndarray]:
    """A tiny random checkpoint; returns the float32 weights as the HF model computes with them."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    style = "llama" if arch == "llama" else "qwen"
    tok = train_bpe(style)
    tok.save(str(folder / "tokenizer.json"))
    n_tok = tok.get_vocab_size()
    vocab = n_tok + (6 if arch == "qwen2" else 0)  # qwen pads its embedding past the tokenizer
    tied = arch != "llama"
    n_layer = 2
    cfg = {"model_type": arch, "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                                  "qwen3": "Qwen3ForCausalLM"}[arch]],
           "hidden_size": D, "intermediate_size": F, "num_hidden_layers": n_layer, "num_attention_heads": H,
           "num_key_value_heads": HKV, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0 if arch == "llama" else 1000000.0, "vocab_size": vocab,
           "tie_word_embeddings": tied, "torch_dtype": "float32"}
    if arch == "qwen3":
        cfg["head_dim"] = HD
    ids = {t: tok.token_to_id(t) for t in SPECIALS[style]}
    bos = ids["<|begin_of_text|>"] if style == "llama" else None
    eos = ids["<|eot_id|>"] if style == "llama" else ids["<|im_end|>"]
    cfg.update(bos_token_id=bos, eos_token_id=eos)
    (folder / "config.json").write_text(json.dumps(cfg))
    tcfg = {"add_bos_token": style == "llama", "add_eos_token": False, "chat_template": CHAT_TEMPLATE,
            "bos_token": "<|begin_of_text|>" if style == "llama" else None,
            "eos_token": SPECIALS[style][2], "pad_token": SPECIALS[style][1 if style == "llama" else 0],
            "added_tokens_decoder": {str(ids[t]): {"content": t, "special": True} for t in SPECIALS[style]}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))

    weights: dict[str, np.ndarray] = {}
    stored: dict[str, tuple[np.ndarray, str]] = {}

    def add(name: str, x: np.ndarray, dtype: str) -> None:
        if dtype == "BF16":
            u = bf16(x)
            stored[name], weights[name] = (u, "BF16"), from_bf16(u)
        elif dtype == "F16":
            h = x.astype(np.float16)
            stored[name], weights[name] = (h, "F16"), h.astype(np.float32)
        else:
            stored[name], weights[name] = (x.astype(np.float32), "F32"), x.astype(np.float32)

    # Matrix dtypes: llama F32 with BF16 attention, qwen2 F16, qwen3 BF16.
    mat = {"llama": "F32", "qwen2": "F16", "qwen3": "BF16"}[arch]
    attn = "BF16" if arch == "llama" else mat
    normal = lambda *s: rng.normal(0, 0.02, size=s)
    norm = lambda n: 1.0 + rng.normal(0, 0.1, size=n)
    add("model.embed_tokens.weight", normal(vocab, D), mat)
    add("model.norm.weight", norm(D), "F32")
    if not tied:
        add("lm_head.weight", normal(vocab, D), mat)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", norm(D), "F32")
        add(p + "post_attention_layernorm.weight", norm(D), "BF16" if arch == "qwen3" else "F32")
        add(p + "self_attn.q_proj.weight", normal(H * HD, D), attn)
        add(p + "self_attn.k_proj.weight", normal(HKV * HD, D), attn)
        add(p + "self_attn.v_proj.weight", normal(HKV * HD, D), attn)
        add(p + "self_attn.o_proj.weight", normal(D, H * HD), mat)
        if arch == "qwen2":
            for n, rows in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
                add(p + f"self_attn.{n}_proj.bias", rng.normal(0, 0.1, size=rows), "F32")
        if arch == "qwen3":
            add(p + "self_attn.q_norm.weight", norm(HD), "F32")
            add(p + "self_attn.k_norm.weight", norm(HD), "F32")
        add(p + "mlp.gate_proj.weight", normal(F, D), mat)
        add(p + "mlp.up_proj.weight", normal(F, D), mat)
        add(p + "mlp.down_proj.weight", normal(D, F), mat)
    stored["model.layers.0.self_attn.rotary_emb.inv_freq"] = (np.zeros(HD // 2, np.float32), "F32")  # skipped
    write_safetensors(folder / "model.safetensors", stored)
    return weights


def hf_forward(w: dict[str, np.ndarray], arch: str, ids: list[int]) -> np.ndarray:
    """The Hugging Face modelling code's math (rotate_half RoPE, GQA, SwiGLU) in float64 numpy."""
    eps, theta = 1e-5, 10000.0 if arch == "llama" else 1000000.0
    T = len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    inv = 1.0 / theta ** (np.arange(0, HD, 2) / HD)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # x: (T, heads, HD)
        half = np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1)
        return x * cos[:, None] + half * sin[:, None]

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i in range(2):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(p + f"self_attn.{n}_proj.bias", 0)
                   for n in "qkv")
        q, k, v = q.reshape(T, H, HD), k.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
        if arch == "qwen3":
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(HD)
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * HD)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def converted(request, tmp_path_factory):
    arch = request.param
    folder = tmp_path_factory.mktemp(arch) / f"Tiny-{arch}"
    weights = make_hf_model(folder, arch, seed=["llama", "qwen2", "qwen3"].index(arch))
    out = write_gguf_unquantized(folder, folder.parent / f"tiny-{arch}.gguf")
    return arch, folder, weights, out


def test_metadata_and_tensors(converted):
    arch, folder, _, out = converted
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == arch
    assert kv[f"{arch}.block_count"] == 2 and kv[f"{arch}.embedding_length"] == D
    assert kv[f"{arch}.attention.head_count_kv"] == HKV and kv[f"{arch}.feed_forward_length"] == F
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == ("llama-bpe" if arch == "llama" else "qwen2")
    assert kv["tokenizer.chat_template"] == CHAT_TEMPLATE
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = "<|eot_id|>" if arch == "llama" else "<|im_end|>"
    assert kv["tokenizer.ggml.eos_token_id"] == hf.token_to_id(eos)
    assert kv["tokenizer.ggml.add_bos_token"] is (arch == "llama")
    names = {t.name: t for t in r.tensors}
    assert ("output.weight" in names) is (arch == "llama")  # tied embeddings write no output matrix
    assert not any("rotary" in n for n in names)
    types = {gguf.GGMLQuantizationType(names["blk.0.attn_q.weight"].tensor_type).name,
             gguf.GGMLQuantizationType(names["blk.0.ffn_up.weight"].tensor_type).name}
    assert types == {"llama": {"BF16", "F32"}, "qwen2": {"F16"}, "qwen3": {"BF16"}}[arch]
    assert gguf.GGMLQuantizationType(names["blk.0.ffn_norm.weight"].tensor_type).name == "F32"
    if arch == "qwen2":
        tokens = kv["tokenizer.ggml.tokens"]
        assert len(tokens) == hf.get_vocab_size() + 6 and tokens[-1] == f"[PAD{len(tokens) - 1}]"


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
    assert (llm.tokenize(b"Hi", add_bos=True)[0] == bos) is (arch == "llama")
    im_end = "<|eot_id|>" if arch == "llama" else "<|im_end|>"
    assert llm.tokenize(im_end.encode(), add_bos=False, special=True) == [hf.token_to_id(im_end)]
    llm.close()


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
    runner = CpuTransformer(model.config, model.weights, n_threads=2)
    ours = runner.forward(np.array(ids, np.int32), 0, runner.new_kv_cache(64), all_logits=True).copy()
    assert np.abs(ours - ref).max() <= 0.02 * np.abs(ref).max()
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))


def test_lazy_tensors_and_shapes(converted):
    arch, folder, weights, _ = converted
    src = source_from_hf(folder)
    assert src.arch == arch
    by_name = {t.name: t for t in src.tensors}
    q = by_name["blk.0.attn_q.weight"]
    assert q.shape == (H * HD, D)
    data = q.load()
    got = from_bf16(data) if q.type_id == gguf.GGMLQuantizationType.BF16 else data.astype(np.float32)
    hfq = weights["model.layers.0.self_attn.q_proj.weight"]
    if arch == "llama":  # rows of each head interleaved back: row 2j came from j, row 2j+1 from j + HD/2
        np.testing.assert_array_equal(got[1], hfq[HD // 2])
        np.testing.assert_array_equal(got[2], hfq[1])
    else:
        np.testing.assert_array_equal(got, hfq)


def test_pre_tokenizer_fallback_is_reported(tmp_path):
    tj = json.loads(train_bpe("qwen").to_str())
    assert detect_pre_tokenizer(tj) == "qwen2"
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    assert detect_pre_tokenizer(tj) is None


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
    with pytest.raises(ConvertError, match=r"'mamba'.*llama, qwen2, qwen3, gemma3"):
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


# ----------------------------------------------------------------------------- gemma3 (SentencePiece)

GEMMA_LAYERS, GEMMA_WINDOW = 6, 8  # layer 5 global, the rest sliding; the window is shorter than the prompt


def make_gemma3(folder: Path, multimodal: bool = False) -> dict[str, np.ndarray]:
    spm = pytest.importorskip("sentencepiece")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "tokenizer"), model_type="bpe",
        vocab_size=400, byte_fallback=True, character_coverage=1.0,
        # Gemma's settings: no dummy prefix, no normalization, whitespace kept as written.
        add_dummy_prefix=False, normalization_rule_name="identity", remove_extra_whitespaces=False,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    rng = np.random.default_rng(7)
    vocab = 400
    text = {"hidden_size": D, "intermediate_size": F, "num_hidden_layers": GEMMA_LAYERS,
            "num_attention_heads": H, "num_key_value_heads": HKV, "head_dim": HD, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": GEMMA_WINDOW,
            "query_pre_attn_scalar": HD, "max_position_embeddings": 512, "vocab_size": vocab,
            "final_logit_softcapping": None, "attn_logit_softcapping": None}
    if multimodal:
        cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
               "text_config": {**text, "model_type": "gemma3_text"}, "vision_config": {"hidden_size": 8}}
        prefix = "language_model.model."
    else:
        cfg = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **text}
        prefix = "model."
    cfg.update(bos_token_id=2, eos_token_id=1, pad_token_id=0)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False}))
    (folder / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                                                "{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}")
    weights, stored = {}, {}

    def add(name, x, dtype="BF16"):
        u = bf16(x) if dtype == "BF16" else x.astype(np.float32)
        stored[prefix + name] = (u, dtype)
        weights[name] = from_bf16(u) if dtype == "BF16" else u

    add("embed_tokens.weight", rng.normal(0, 0.02, size=(vocab, D)))
    add("norm.weight", rng.normal(0, 0.1, size=D))  # Gemma stores RMSNorm weights as (w - 1)
    for i in range(GEMMA_LAYERS):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            add(p + n + ".weight", rng.normal(0, 0.1, size=D))
        add(p + "self_attn.q_norm.weight", rng.normal(0, 0.1, size=HD))
        add(p + "self_attn.k_norm.weight", rng.normal(0, 0.1, size=HD))
        for n, shape in (("q", (H * HD, D)), ("k", (HKV * HD, D)), ("v", (HKV * HD, D)), ("o", (D, H * HD))):
            add(p + f"self_attn.{n}_proj.weight", rng.normal(0, 0.02, size=shape))
        for n, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
            add(p + f"mlp.{n}_proj.weight", rng.normal(0, 0.02, size=shape))
    if multimodal:
        stored["vision_tower.vision_model.embeddings.patch_embedding.weight"] = (np.zeros((8, 3), np.float32), "F32")
        stored["multi_modal_projector.mm_input_projection_weight"] = (np.zeros((8, D), np.float32), "F32")
    write_safetensors(folder / "model.safetensors", stored)
    return weights


def gemma3_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Gemma 3's HF math: (1 + w) RMSNorms, scaled embeddings, QK norms, GELU-tanh, local/global RoPE."""
    T = len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (1.0 + g)
    x = w["embed_tokens.weight"][ids].astype(np.float64) * np.sqrt(D)
    pos = np.arange(T)
    causal = pos[None, :] > pos[:, None]
    for i in range(GEMMA_LAYERS):
        p = f"layers.{i}."
        local = (i + 1) % 6 != 0
        inv = 1.0 / (10000.0 if local else 1000000.0) ** (np.arange(0, HD, 2) / HD)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        def rope(t, cos=cos, sin=sin):
            return t * cos[:, None] + np.concatenate([-t[..., HD // 2:], t[..., :HD // 2]], -1) * sin[:, None]
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q, k, v = q.reshape(T, H, HD), k.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]))
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]))
        k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
        s = np.einsum("thd,shd->hts", q, k) * HD ** -0.5
        mask = causal | ((pos[:, None] - pos[None, :]) >= GEMMA_WINDOW) if local else causal
        s = np.where(mask, -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * HD) @ w[p + "self_attn.o_proj.weight"].T
        x = x + rms(o, w[p + "post_attention_layernorm.weight"])
        h = rms(x, w[p + "pre_feedforward_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        m = (gelu * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = x + rms(m, w[p + "post_feedforward_layernorm.weight"])
    return rms(x, w["norm.weight"]) @ w["embed_tokens.weight"].T


def test_gemma3_sentencepiece_and_logits(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    folder = tmp_path / "tiny-gemma3"
    weights = make_gemma3(folder)
    out = write_gguf_unquantized(folder, tmp_path / "tiny-gemma3.gguf")
    r = gguf.GGUFReader(out)
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["tokenizer.ggml.model"] == "llama" and kv["tokenizer.ggml.add_space_prefix"] is False
    assert kv["gemma3.attention.sliding_window"] == GEMMA_WINDOW and kv["gemma3.rope.freq_base"] == 1e6
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
    want = gemma3_forward(weights, ids)
    assert len(ids) > GEMMA_WINDOW
    assert np.abs(ref - want).max() <= 0.02 * np.abs(want).max(), np.abs(ref - want).max()
    model = load_model(out)
    runner = CpuTransformer(model.config, model.weights, n_threads=2)
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
