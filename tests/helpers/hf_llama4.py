"""A tiny random Hugging Face Llama 4 folder (Llama4ForConditionalGeneration: the text model under
language_model.*, a vision tower the converter skips) and a numpy forward pass of the HF text
model's math, the reference for converted logits."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .hf_models import HD, HKV, SPECIALS, D, F, H, train_bpe, write_safetensors

# 4 layers: the 4th without RoPE; experts in every 2nd (the 2nd and 4th), 4 of width 256, 1 per token
LLAMA4 = {"num_hidden_layers": 4, "interleave_moe_layer_step": 2, "num_local_experts": 4, "num_experts_per_tok": 1,
          "intermediate_size": 256, "intermediate_size_mlp": F, "no_rope_layer_interval": 4}
THETA, EPS = 10000.0, 1e-5


def make_llama4(folder: Path, seed: int) -> dict[str, np.ndarray]:
    """The checkpoint (float32, untied lm_head; the experts fused and transposed as Llama 4 stores
    them: gate_up_proj (experts, D, 2 ff), down_proj (experts, ff, D)); returns the weights by
    their checkpoint names."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_bpe("llama")
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    text = {"model_type": "llama4_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": HKV,
            "head_dim": HD, "rope_theta": THETA, "rms_norm_eps": EPS, "vocab_size": vocab,
            "max_position_embeddings": 256, "use_qk_norm": True, "attention_chunk_size": 8192,
            "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1, **LLAMA4}
    cfg = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": text,
           "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 32}, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(cfg))
    ids = {t: tok.token_to_id(t) for t in SPECIALS["llama"]}
    tcfg = {"add_bos_token": False, "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": {str(i): {"content": t, "special": True} for t, i in ids.items()}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
    w: dict[str, np.ndarray] = {}
    normal = lambda *s: rng.normal(0, 0.02, size=s).astype(np.float32)
    norm = lambda n: (1.0 + rng.normal(0, 0.1, size=n)).astype(np.float32)
    lm = "language_model.model."
    w[lm + "embed_tokens.weight"] = normal(vocab, D)
    w[lm + "norm.weight"] = norm(D)
    w["language_model.lm_head.weight"] = normal(vocab, D)
    E, Fe = LLAMA4["num_local_experts"], LLAMA4["intermediate_size"]
    for i in range(LLAMA4["num_hidden_layers"]):
        p = f"{lm}layers.{i}."
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        for n, rows in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
            w[p + f"self_attn.{n}_proj.weight"] = normal(rows, D)
        w[p + "self_attn.o_proj.weight"] = normal(D, H * HD)
        if (i + 1) % LLAMA4["interleave_moe_layer_step"] == 0:
            # a decisive router (logits ~N(0, 3)): near-ties would let float roundings pick another expert
            w[p + "feed_forward.router.weight"] = 10 * normal(E, D)
            w[p + "feed_forward.experts.gate_up_proj"] = normal(E, D, 2 * Fe)
            w[p + "feed_forward.experts.down_proj"] = normal(E, Fe, D)
            for n, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
                w[p + f"feed_forward.shared_expert.{n}_proj.weight"] = normal(*shape)
        else:
            for n, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
                w[p + f"feed_forward.{n}_proj.weight"] = normal(*shape)
    w["vision_model.patch_embedding.linear.weight"] = normal(32, 48)  # skipped: llama.cpp's mmproj file
    w["multi_modal_projector.linear_1.weight"] = normal(D, 32)
    write_safetensors(folder / "model.safetensors", {k: (v, "F32") for k, v in w.items()})
    return w


def llama4_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """transformers' Llama4ForCausalLM math in float64 for a prompt within the first chunk (the
    chunked mask and the attention temperature, 1 there, change nothing): RoPE on adjacent pairs
    (its complex rotary) with Q and K L2-normed after it on the RoPE layers, none on every 4th;
    a dense SwiGLU or the MoE: the top-1 expert by router logit, its input times the sigmoid of
    that logit, plus the shared expert."""
    T = len(ids)
    rms = lambda x, g=1.0: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    ang = np.arange(T)[:, None] * (1.0 / THETA ** (np.arange(0, HD, 2) / HD))[None, :]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rope(x):  # x: (T, heads, HD), pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)

    def mlp(x, g, u, d):
        gate = x @ g.T
        return (gate / (1 + np.exp(-gate)) * (x @ u.T)) @ d.T

    f = {k: v.astype(np.float64) for k, v in w.items()}
    lm = "language_model.model."
    x = f[lm + "embed_tokens.weight"][ids]
    mask = np.tril(np.ones((T, T), bool))
    for i in range(LLAMA4["num_hidden_layers"]):
        p = f"{lm}layers.{i}."
        h = rms(x, f[p + "input_layernorm.weight"])
        q = (h @ f[p + "self_attn.q_proj.weight"].T).reshape(T, H, HD)
        k = (h @ f[p + "self_attn.k_proj.weight"].T).reshape(T, HKV, HD)
        v = (h @ f[p + "self_attn.v_proj.weight"].T).reshape(T, HKV, HD)
        if (i + 1) % LLAMA4["no_rope_layer_interval"]:
            q, k = rms(rope(q)), rms(rope(k))
        k, v = np.repeat(k, H // HKV, axis=1), np.repeat(v, H // HKV, axis=1)
        s = np.where(mask[None], np.einsum("thd,shd->hts", q, k) / np.sqrt(HD), -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        a = np.einsum("hts,shd->thd", pr / pr.sum(-1, keepdims=True), v).reshape(T, H * HD)
        x = x + a @ f[p + "self_attn.o_proj.weight"].T
        h = rms(x, f[p + "post_attention_layernorm.weight"])
        if p + "feed_forward.router.weight" in f:
            logits = h @ f[p + "feed_forward.router.weight"].T
            top = logits.argmax(-1)
            score = 1 / (1 + np.exp(-logits[np.arange(T), top]))
            gu, down = f[p + "feed_forward.experts.gate_up_proj"], f[p + "feed_forward.experts.down_proj"]
            Fe = down.shape[1]
            out = np.stack([mlp(h[t] * score[t], gu[top[t]][:, :Fe].T, gu[top[t]][:, Fe:].T, down[top[t]].T)
                            for t in range(T)])
            o = out + mlp(h, *(f[p + f"feed_forward.shared_expert.{n}_proj.weight"] for n in ("gate", "up", "down")))
        else:
            o = mlp(h, *(f[p + f"feed_forward.{n}_proj.weight"] for n in ("gate", "up", "down")))
        x = x + o
    return rms(x, f[lm + "norm.weight"]) @ f["language_model.lm_head.weight"].T
