"""A tiny random Hugging Face LFM2 folder (Lfm2ForCausalLM: short convolutions and attention
layers; or Lfm2MoeForCausalLM: the same with experts after the first layer) and a numpy forward
pass of the HF model's math, the reference for converted logits."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_models import HD, HKV, SPECIALS, D, F, H, HfCheckpoint, chatml_tokenizer_config, train_bpe

LFM2_TYPES = ["conv", "full_attention", "conv"]  # layer_types
LFM2_L = 3  # conv_L_cache
# block_ff_dim 768 auto-adjusted: 2/3 of it, times the multiplier, rounded up to a multiple of 256 -> F (512)
LFM2_FF = {"block_ff_dim": 768, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
           "block_multiple_of": 256}
# Lfm2MoeForCausalLM's own keys: its first layer dense (intermediate_size F), then 4 experts of
# width 256, 2 per token, under a sigmoid router with a selection bias
LFM2MOE = {"num_dense_layers": 1, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
           "norm_topk_prob": True, "routed_scaling_factor": 1.0, "use_expert_bias": True}


def make_lfm2(folder: Path, seed: int, moe: bool = False) -> dict[str, np.ndarray]:
    """The checkpoint (matrices BF16, norms, the conv kernels and the experts' bias F32, tied
    embeddings as LFM2's; moe: Lfm2MoeForCausalLM's); returns the float32 weights the HF model
    computes with."""
    ck = HfCheckpoint(folder, seed)
    rng = ck.rng
    tok = train_bpe("qwen")
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIALS["qwen"]}
    own = {"model_type": "lfm2_moe", "architectures": ["Lfm2MoeForCausalLM"], "intermediate_size": F, **LFM2MOE} if moe \
        else {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "intermediate_size": 4 * D, **LFM2_FF}
    cfg = {**own, "hidden_size": D, "num_hidden_layers": len(LFM2_TYPES), "num_attention_heads": H,
           "num_key_value_heads": HKV, "layer_types": LFM2_TYPES, "conv_L_cache": LFM2_L, "conv_bias": False,
           "max_position_embeddings": 256, "norm_eps": 1e-5, "rope_theta": 1000000.0, "vocab_size": vocab,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16", "eos_token_id": ids["<|im_end|>"]}
    ck.write_config(cfg)
    ck.write_tokenizer(tok, chatml_tokenizer_config(tok))
    add, normal, norm = ck.add, ck.normal, ck.norm
    add("model.embed_tokens.weight", normal(vocab, D))
    add("model.embedding_norm.weight", norm(D), "F32")
    for i, kind in enumerate(LFM2_TYPES):
        p = f"model.layers.{i}."
        add(p + "operator_norm.weight", norm(D), "F32")
        add(p + "ffn_norm.weight", norm(D), "F32")
        if kind == "conv":
            add(p + "conv.in_proj.weight", normal(3 * D, D))
            # nn.Conv1d's initialization (uniform within 1/sqrt(fan_in)), depthwise: (D, 1, L)
            add(p + "conv.conv.weight", rng.uniform(-LFM2_L ** -0.5, LFM2_L ** -0.5, size=(D, 1, LFM2_L)))
            add(p + "conv.out_proj.weight", normal(D, D))
        else:
            for n, rows in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
                add(p + f"self_attn.{n}_proj.weight", normal(rows, D))
            add(p + "self_attn.out_proj.weight", normal(D, H * HD))
            add(p + "self_attn.q_layernorm.weight", norm(HD), "F32")
            add(p + "self_attn.k_layernorm.weight", norm(HD), "F32")
        if moe and i >= LFM2MOE["num_dense_layers"]:
            E, Fe = LFM2MOE["num_experts"], LFM2MOE["moe_intermediate_size"]
            # biases 0.6 apart (in a random order): the choice rarely near a tie, which llama.cpp's bf16
            # activations would break otherwise, and still the sigmoids' on some tokens
            add(p + "feed_forward.gate.weight", 10 * normal(E, D))
            add(p + "feed_forward.expert_bias", rng.permutation(np.linspace(0.9, -0.9, E)), "F32")
            for e in range(E):
                add(p + f"feed_forward.experts.{e}.w1.weight", normal(Fe, D))
                add(p + f"feed_forward.experts.{e}.w3.weight", normal(Fe, D))
                add(p + f"feed_forward.experts.{e}.w2.weight", normal(D, Fe))
            continue
        add(p + "feed_forward.w1.weight", normal(F, D))
        add(p + "feed_forward.w3.weight", normal(F, D))
        add(p + "feed_forward.w2.weight", normal(D, F))
    return ck.save()


def _swiglu(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    g = h @ w[p + "w1.weight"].T
    return ((g / (1 + np.exp(-g))) * (h @ w[p + "w3.weight"].T)) @ w[p + "w2.weight"].T


def _sparse_moe(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """Lfm2MoeSparseMoeBlock: each expert's sigmoid, the top k by sigmoid + expert_bias, their
    sigmoids over their sum (+ 1e-6), each a SwiGLU (Lfm2MoeMLP)."""
    prob = 1 / (1 + np.exp(-(h @ w[p + "gate.weight"].T)))
    out = np.zeros_like(h)
    for t in range(len(h)):
        top = np.argsort(-(prob[t] + w[p + "expert_bias"]))[:LFM2MOE["num_experts_per_tok"]]
        wts = prob[t, top] / (prob[t, top].sum() + 1e-6) * LFM2MOE["routed_scaling_factor"]
        for e, wt in zip(top, wts):
            out[t] += wt * _swiglu(w, f"{p}experts.{e}.", h[t:t + 1])[0]
    return out


def lfm2_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """transformers' Lfm2 math in float64: Lfm2ShortConv (in_proj to B, C, x; Conv1d over B * x with
    L - 1 zeros of left padding; C times it; out_proj), attention with per-head Q/K RMSNorm and
    rotate_half RoPE, the SwiGLU w2(silu(w1 x) * w3 x) (Lfm2Moe: the sparse block where a layer
    has a router), embedding_norm last, tied lm_head."""
    eps, theta, T = 1e-5, 1000000.0, len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    ang = np.arange(T)[:, None] * (1.0 / theta ** (np.arange(0, HD, 2) / HD))[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # x: (T, heads, HD)
        return x * cos[:, None] + np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1) * sin[:, None]

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i, kind in enumerate(LFM2_TYPES):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "operator_norm.weight"])
        if kind == "conv":
            b, c, xx = np.split(h @ w[p + "conv.in_proj.weight"].T, 3, axis=-1)
            bx = np.concatenate([np.zeros((LFM2_L - 1, D)), b * xx])  # (L - 1 + T, D)
            k = w[p + "conv.conv.weight"][:, 0, :]  # (D, L), oldest input first
            conv = np.stack([(bx[t:t + LFM2_L] * k.T).sum(0) for t in range(T)])
            o = (c * conv) @ w[p + "conv.out_proj.weight"].T
        else:
            q, kk, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
            q, kk, v = q.reshape(T, H, HD), kk.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
            q, kk = rope(rms(q, w[p + "self_attn.q_layernorm.weight"])), rope(rms(kk, w[p + "self_attn.k_layernorm.weight"]))
            kk, v = np.repeat(kk, H // HKV, 1), np.repeat(v, H // HKV, 1)
            s = np.einsum("thd,shd->hts", q, kk) * HD ** -0.5 + np.triu(np.full((T, T), -np.inf), 1)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", a, v).reshape(T, H * HD) @ w[p + "self_attn.out_proj.weight"].T
        x = x + o
        h = rms(x, w[p + "ffn_norm.weight"])
        moe = p + "feed_forward.gate.weight" in w
        x = x + (_sparse_moe if moe else _swiglu)(w, p + "feed_forward.", h)
    return rms(x, w["model.embedding_norm.weight"]) @ w["model.embed_tokens.weight"].T
