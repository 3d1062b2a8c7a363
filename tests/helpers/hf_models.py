"""Tiny random Hugging Face model folders (config.json, model.safetensors, tokenizer files) for the
conversion tests, and numpy forward passes of the HF models themselves, the reference for logits."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

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
# The tiny phi3's LongRoPE short factors (its long ones are 3x) and cos/sin magnitude (1024 / 256)
PHI3_SHORT = np.linspace(1.0, 1.8, HD // 2)
PHI3_MSCALE = np.sqrt(1 + np.log(4) / np.log(256))
# The tiny Qwen3-MoE: 8 experts of width 256, 3 per token
MOE_EXPERTS, MOE_USED, MOE_FF = 8, 3, 256
# Granite's config.json multipliers, each away from 1 (attention: instead of 1/sqrt(head_dim))
GRANITE_MULTIPLIERS = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.09,
                       "logits_scaling": 4.0}


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


class HfCheckpoint:
    """A tiny HF model folder being written: config.json, the tokenizer's files and model.safetensors,
    each tensor kept as stored (BF16, F16 or F32) and as the float32 the HF model computes with;
    normal and norm draw from the seed's generator in the order the caller asks."""

    def __init__(self, folder: Path, seed: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.rng = np.random.default_rng(seed)
        self.weights: dict[str, np.ndarray] = {}
        self.stored: dict[str, tuple[np.ndarray, str]] = {}

    def normal(self, *shape: int) -> np.ndarray:
        """A matrix's random weights."""
        return self.rng.normal(0, 0.02, size=shape)

    def norm(self, n: int) -> np.ndarray:
        """An RMSNorm's weights, near 1."""
        return 1.0 + self.rng.normal(0, 0.1, size=n)

    def add(self, name: str, x: np.ndarray, dtype: str = "BF16") -> None:
        if dtype == "BF16":
            u = bf16(x)
            self.stored[name], self.weights[name] = (u, "BF16"), from_bf16(u)
        elif dtype == "F16":
            h = x.astype(np.float16)
            self.stored[name], self.weights[name] = (h, "F16"), h.astype(np.float32)
        else:
            self.stored[name], self.weights[name] = (x.astype(np.float32), "F32"), x.astype(np.float32)

    def write_config(self, cfg: dict) -> None:
        (self.folder / "config.json").write_text(json.dumps(cfg))

    def write_tokenizer(self, tok: Tokenizer, tcfg: dict) -> None:
        """tokenizer.json and tokenizer_config.json."""
        tok.save(str(self.folder / "tokenizer.json"))
        (self.folder / "tokenizer_config.json").write_text(json.dumps(tcfg))

    def save(self) -> dict[str, np.ndarray]:
        """Writes model.safetensors; returns the float32 weights by their checkpoint names."""
        write_safetensors(self.folder / "model.safetensors", self.stored)
        return self.weights


def chatml_tokenizer_config(tok: Tokenizer, chat_template: str = CHAT_TEMPLATE) -> dict:
    """tokenizer_config.json of a Qwen-style (train_bpe("qwen")) tokenizer with a ChatML template."""
    ids = {t: tok.token_to_id(t) for t in SPECIALS["qwen"]}
    return {"add_bos_token": False, "add_eos_token": False, "chat_template": chat_template,
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "added_tokens_decoder": {str(ids[t]): {"content": t, "special": True} for t in SPECIALS["qwen"]}}


def make_hf_model(folder: Path, arch: str, seed: int, n_layer: int = 2) -> dict[str, np.ndarray]:
    """A tiny random checkpoint of n_layer layers; returns the float32 weights as the HF model
    computes with them."""
    ck = HfCheckpoint(folder, seed)
    rng = ck.rng
    style = "llama" if arch in ("llama", "mixtral") else "qwen"
    tok = train_bpe(style)
    n_tok = tok.get_vocab_size()
    vocab = n_tok + (6 if arch == "qwen2" else 0)  # qwen pads its embedding past the tokenizer
    tied = arch in ("qwen2", "qwen3", "granite", "qwen3moe")
    cfg = {"model_type": "qwen3_moe" if arch == "qwen3moe" else arch,
           "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                              "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                              "qwen3moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                              "phi3": "Phi3ForCausalLM"}[arch]],
           "hidden_size": D, "intermediate_size": F, "num_hidden_layers": n_layer, "num_attention_heads": H,
           "num_key_value_heads": HKV, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0 if arch == "llama" else 1000000.0, "vocab_size": vocab,
           "tie_word_embeddings": tied, "torch_dtype": "float32"}
    if arch in ("qwen3", "qwen3moe"):
        cfg["head_dim"] = HD
    if arch == "qwen3moe":
        cfg.update(num_experts=MOE_EXPERTS, num_experts_per_tok=MOE_USED, moe_intermediate_size=MOE_FF,
                   norm_topk_prob=True)
    if arch == "phi3":  # LongRoPE (Phi-4-mini): short factors within 256 tokens, long ones beyond
        cfg.update(max_position_embeddings=1024, original_max_position_embeddings=256,
                   rope_scaling={"type": "longrope", "short_factor": PHI3_SHORT.tolist(),
                                 "long_factor": (PHI3_SHORT * 3).tolist()})
    if arch == "mixtral":  # its experts are intermediate_size wide
        cfg.update(num_local_experts=MOE_EXPERTS, num_experts_per_tok=MOE_USED)
    cfg.update(GRANITE_MULTIPLIERS if arch == "granite" else {})
    ids = {t: tok.token_to_id(t) for t in SPECIALS[style]}
    bos = ids["<|begin_of_text|>"] if style == "llama" else None
    eos = ids["<|eot_id|>"] if style == "llama" else ids["<|im_end|>"]
    cfg.update(bos_token_id=bos, eos_token_id=eos)
    ck.write_config(cfg)
    tcfg = {"add_bos_token": style == "llama", "add_eos_token": False, "chat_template": CHAT_TEMPLATE,
            "tokenizer_class": "GPT2Tokenizer" if arch == "phi3" else "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>" if style == "llama" else None,
            "eos_token": SPECIALS[style][2], "pad_token": SPECIALS[style][1 if style == "llama" else 0],
            "added_tokens_decoder": {str(ids[t]): {"content": t, "special": True} for t in SPECIALS[style]}}
    ck.write_tokenizer(tok, tcfg)
    add = ck.add

    # Matrix dtypes: llama F32 with BF16 attention, qwen2 F16, qwen3 BF16.
    mat = {"llama": "F32", "qwen2": "F16", "qwen3": "BF16", "granite": "BF16", "olmo2": "F32", "qwen3moe": "BF16",
           "mixtral": "F16", "phi3": "BF16"}[arch]
    attn = "BF16" if arch in ("llama", "olmo2") else mat
    normal = ck.normal
    norm = ck.norm
    add("model.embed_tokens.weight", normal(vocab, D), mat)
    add("model.norm.weight", norm(D), "F32")
    if not tied:
        add("lm_head.weight", normal(vocab, D), mat)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        if arch != "olmo2":  # olmo2 normalizes each block's output instead (post_feedforward_layernorm)
            add(p + "input_layernorm.weight", norm(D), "F32")
        add(p + "post_attention_layernorm.weight", norm(D), "BF16" if arch == "qwen3" else "F32")
        if arch == "phi3":  # Q, K, V in one matrix
            add(p + "self_attn.qkv_proj.weight", normal((H + 2 * HKV) * HD, D), attn)
        else:
            add(p + "self_attn.q_proj.weight", normal(H * HD, D), attn)
            add(p + "self_attn.k_proj.weight", normal(HKV * HD, D), attn)
            add(p + "self_attn.v_proj.weight", normal(HKV * HD, D), attn)
        add(p + "self_attn.o_proj.weight", normal(D, H * HD), mat)
        if arch == "qwen2":
            for n, rows in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
                add(p + f"self_attn.{n}_proj.bias", rng.normal(0, 0.1, size=rows), "F32")
        if arch in ("qwen3", "qwen3moe"):
            add(p + "self_attn.q_norm.weight", norm(HD), "F32")
            add(p + "self_attn.k_norm.weight", norm(HD), "F32")
        if arch == "olmo2":  # over the whole projection
            add(p + "self_attn.q_norm.weight", norm(H * HD), "F32")
            add(p + "self_attn.k_norm.weight", norm(HKV * HD), "F32")
            add(p + "post_feedforward_layernorm.weight", norm(D), "F32")
        if arch == "qwen3moe":  # the router and each expert's own matrices, as HF stores them
            add(p + "mlp.gate.weight", normal(MOE_EXPERTS, D) * 20, mat)  # a router that prefers some experts
            for x in range(MOE_EXPERTS):
                add(p + f"mlp.experts.{x}.gate_proj.weight", normal(MOE_FF, D), mat)
                add(p + f"mlp.experts.{x}.up_proj.weight", normal(MOE_FF, D), mat)
                add(p + f"mlp.experts.{x}.down_proj.weight", normal(D, MOE_FF), mat)
            continue
        if arch == "mixtral":  # block_sparse_moe: gate, experts.E.w1 (gate) / w3 (up) / w2 (down)
            add(p + "block_sparse_moe.gate.weight", normal(MOE_EXPERTS, D) * 20, mat)
            for x in range(MOE_EXPERTS):
                add(p + f"block_sparse_moe.experts.{x}.w1.weight", normal(F, D), mat)
                add(p + f"block_sparse_moe.experts.{x}.w3.weight", normal(F, D), mat)
                add(p + f"block_sparse_moe.experts.{x}.w2.weight", normal(D, F), mat)
            continue
        if arch == "phi3":  # gate and up in one matrix, gate first
            add(p + "mlp.gate_up_proj.weight", normal(2 * F, D), mat)
        else:
            add(p + "mlp.gate_proj.weight", normal(F, D), mat)
            add(p + "mlp.up_proj.weight", normal(F, D), mat)
        add(p + "mlp.down_proj.weight", normal(D, F), mat)
    ck.stored["model.layers.0.self_attn.rotary_emb.inv_freq"] = (np.zeros(HD // 2, np.float32), "F32")  # skipped
    return ck.save()


def _moe(w: dict[str, np.ndarray], p: str, h: np.ndarray, arch: str) -> np.ndarray:
    """Qwen3-MoE's and Mixtral's sparse block: softmax over the router's logits, the top experts,
    their weights renormalized, each expert's SwiGLU weighted and summed."""
    names = {"qwen3moe": ("mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj"),
             "mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts.{}.", "w1", "w3", "w2")}[arch]
    logits = h @ w[p + names[0] + ".weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(len(h)):
        top = np.argsort(-probs[t])[:MOE_USED]
        weights = probs[t, top] / probs[t, top].sum()
        for x, wt in zip(top, weights):
            e = p + names[1].format(x)
            g = h[t] @ w[e + names[2] + ".weight"].T
            u, d = w[e + names[3] + ".weight"], w[e + names[4] + ".weight"]
            out[t] += wt * (((g / (1 + np.exp(-g))) * (h[t] @ u.T)) @ d.T)
    return out


def hf_forward(w: dict[str, np.ndarray], arch: str, ids: list[int], nope: tuple[bool, ...] = (),
               yarn: dict | None = None) -> np.ndarray:
    """The Hugging Face modelling code's math (rotate_half RoPE, GQA, SwiGLU; Granite's multipliers;
    OLMo 2's output norms and whole-projection Q/K norms) in float64 numpy. nope: per layer, no
    RoPE (SmolLM3's no_rope_layers, inverted); yarn: Ministral 3's rope_parameters (YaRN's
    frequencies, and Q times its Llama 4 attention temperature)."""
    eps, theta = 1e-5, 10000.0 if arch == "llama" else 1000000.0
    gm = GRANITE_MULTIPLIERS if arch == "granite" else {"embedding_multiplier": 1.0, "residual_multiplier": 1.0,
                                                         "attention_multiplier": HD ** -0.5, "logits_scaling": 1.0}
    T = len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    inv = 1.0 / theta ** (np.arange(0, HD, 2) / HD)
    mscale = 1.0
    if arch == "phi3":  # LongRoPE within the original context: the short factors divide the frequencies
        inv, mscale = inv / PHI3_SHORT, PHI3_MSCALE
    temp = np.ones(T)
    if yarn is not None:  # transformers' _compute_yarn_parameters (mscale = mscale_all_dim: magnitude 1)
        orig, factor = yarn["original_max_position_embeddings"], yarn["factor"]
        dim = [HD * np.log(orig / (b * 2 * np.pi)) / (2 * np.log(theta)) for b in (yarn["beta_fast"], yarn["beta_slow"])]
        lo, hi = max(np.floor(dim[0]), 0), min(np.ceil(dim[1]), HD - 1)
        extrapolate = 1 - np.clip((np.arange(HD // 2) - lo) / max(hi - lo, 0.001), 0, 1)
        inv = inv / factor * (1 - extrapolate) + inv * extrapolate
        temp = 1 + yarn["llama_4_scaling_beta"] * np.log(1 + np.floor(np.arange(T) / orig))
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = (mscale * f(np.concatenate([ang, ang], -1)) for f in (np.cos, np.sin))

    def rope(x):  # x: (T, heads, HD)
        half = np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1)
        return x * cos[:, None] + half * sin[:, None]

    x = w["model.embed_tokens.weight"][ids].astype(np.float64) * gm["embedding_multiplier"]
    for i in range(sum(k.endswith("post_attention_layernorm.weight") for k in w)):
        p = f"model.layers.{i}."
        h = x if arch == "olmo2" else rms(x, w[p + "input_layernorm.weight"])
        if arch == "phi3":
            q, k, v = np.split(h @ w[p + "self_attn.qkv_proj.weight"].T, [H * HD, (H + HKV) * HD], axis=-1)
        else:
            q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(p + f"self_attn.{n}_proj.bias", 0)
                       for n in "qkv")
        if arch == "olmo2":
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k, v = q.reshape(T, H, HD), k.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
        if arch in ("qwen3", "qwen3moe"):
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        if not (nope and nope[i]):
            q, k = rope(q), rope(k)
        q = q * temp[:, None, None]
        k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
        s = np.einsum("thd,shd->hts", q, k) * gm["attention_multiplier"]
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * HD) @ w[p + "self_attn.o_proj.weight"].T
        if arch == "olmo2":
            x = x + rms(o, w[p + "post_attention_layernorm.weight"])
            h = x
        else:
            x = x + o * gm["residual_multiplier"]
            h = rms(x, w[p + "post_attention_layernorm.weight"])
        if arch in ("qwen3moe", "mixtral"):
            m = _moe(w, p, h, arch)
        elif arch == "phi3":
            g, u = np.split(h @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
            m = ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
        else:
            g = h @ w[p + "mlp.gate_proj.weight"].T
            m = ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        if arch == "olmo2":
            m = rms(m, w[p + "post_feedforward_layernorm.weight"])
        x = x + m * gm["residual_multiplier"]
    x = rms(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T / gm["logits_scaling"]


# ----------------------------------------------------------------------------- gemma3 (SentencePiece)

GEMMA_LAYERS, GEMMA_WINDOW = 6, 8  # layer 5 global, the rest sliding; the window is shorter than the prompt


# Gemma 2's soft caps, small enough to bend the tiny model's scores and logits
GEMMA2_CAPS = {"attn_logit_softcapping": 0.1, "final_logit_softcapping": 2.0}


def make_gemma3(folder: Path, multimodal: bool = False, gemma2: bool = False) -> dict[str, np.ndarray]:
    """A tiny Gemma 3 folder (its text model inside a multimodal checkpoint if asked), or with gemma2
    a Gemma 2 one: no Q/K norms, soft caps, every other layer sliding, one RoPE base."""
    import sentencepiece as spm
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
    if gemma2:
        text.update(GEMMA2_CAPS, rope_theta=10000.0)
        del text["rope_local_base_freq"]
    if gemma2:
        cfg = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], **text}
        prefix = "model."
    elif multimodal:
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
        if not gemma2:
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


def gemma3_forward(w: dict[str, np.ndarray], ids: list[int], gemma2: bool = False) -> np.ndarray:
    """Gemma 3's HF math: (1 + w) RMSNorms, scaled embeddings, QK norms, GELU-tanh, local/global RoPE;
    with gemma2, Gemma 2's: no QK norms, soft caps, every other layer local, one RoPE base."""
    T = len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (1.0 + g)
    x = w["embed_tokens.weight"][ids].astype(np.float64) * np.sqrt(D)
    pos = np.arange(T)
    causal = pos[None, :] > pos[:, None]
    for i in range(GEMMA_LAYERS):
        p = f"layers.{i}."
        local = i % 2 == 0 if gemma2 else (i + 1) % 6 != 0
        inv = 1.0 / (10000.0 if local or gemma2 else 1000000.0) ** (np.arange(0, HD, 2) / HD)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        def rope(t, cos=cos, sin=sin):
            return t * cos[:, None] + np.concatenate([-t[..., HD // 2:], t[..., :HD // 2]], -1) * sin[:, None]
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q, k, v = q.reshape(T, H, HD), k.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
        if not gemma2:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
        s = np.einsum("thd,shd->hts", q, k) * HD ** -0.5
        if gemma2:
            cap = GEMMA2_CAPS["attn_logit_softcapping"]
            s = cap * np.tanh(s / cap)
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
    logits = rms(x, w["norm.weight"]) @ w["embed_tokens.weight"].T
    if gemma2:
        cap = GEMMA2_CAPS["final_logit_softcapping"]
        logits = cap * np.tanh(logits / cap)
    return logits
