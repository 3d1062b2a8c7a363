"""A tiny random Hugging Face GLM-4.5 folder (Glm4MoeForCausalLM: a dense first layer, then
sigmoid-routed experts with a selection bias and a shared expert; partial RoPE; Q/K/V biases; Q/K
norms in GLM-4.5's layout, none in -Air's; an MTP layer after the others) and a numpy forward pass
of the HF model's math, the reference for converted logits."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_models import HD, HKV, SPECIALS, D, F, H, HfCheckpoint, train_bpe

# GLM's chat markers, added tokens of its tokenizer (llama.cpp's converter names bos, eot, unk and eom by them)
GLM_SPECIALS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
GLM_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# Glm4MoeForCausalLM's own keys: 3 layers (the first dense) and 1 MTP layer; 4 experts of width 256,
# 2 per token, their weights renormalized and scaled by 2.5; RoPE over half of each head
GLM4MOE = {"num_hidden_layers": 3, "num_nextn_predict_layers": 1, "first_k_dense_replace": 1, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 256, "norm_topk_prob": True,
           "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "partial_rotary_factor": 0.5}


def make_glm4moe(folder: Path, seed: int, air: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """The checkpoint (matrices BF16, norms, biases and the selection bias F32); air: GLM-4.5-Air's
    layout (no Q/K norms, 2 shared experts, no MTP layer). Returns the float32 weights the HF model
    computes with, and its config."""
    ck = HfCheckpoint(folder, seed)
    rng = ck.rng
    tok = train_bpe("qwen")
    tok.add_special_tokens(GLM_SPECIALS)
    vocab = tok.get_vocab_size()
    n_shared, nextn = (2, 0) if air else (1, GLM4MOE["num_nextn_predict_layers"])
    cfg = {**GLM4MOE, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "hidden_size": D,
           "intermediate_size": F, "num_attention_heads": H, "num_key_value_heads": HKV, "head_dim": HD,
           "n_shared_experts": n_shared, "num_nextn_predict_layers": nextn, "use_qk_norm": not air,
           "attention_bias": True, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
           "vocab_size": vocab, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    ck.write_config(cfg)
    specials = SPECIALS["qwen"] + GLM_SPECIALS
    tcfg = {"chat_template": GLM_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "added_tokens_decoder": {str(tok.token_to_id(t)): {"content": t, "special": True} for t in specials}}
    ck.write_tokenizer(tok, tcfg)
    add, normal, norm = ck.add, ck.normal, ck.norm
    E, Fe = GLM4MOE["n_routed_experts"], GLM4MOE["moe_intermediate_size"]
    add("model.embed_tokens.weight", normal(vocab, D))
    add("model.norm.weight", norm(D), "F32")
    add("lm_head.weight", normal(vocab, D))
    for i in range(GLM4MOE["num_hidden_layers"] + nextn):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", norm(D), "F32")
        add(p + "post_attention_layernorm.weight", norm(D), "F32")
        for n, rows in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
            add(p + f"self_attn.{n}_proj.weight", normal(rows, D))
            add(p + f"self_attn.{n}_proj.bias", rng.normal(0, 0.1, size=rows))
        add(p + "self_attn.o_proj.weight", normal(D, H * HD))
        if not air:
            add(p + "self_attn.q_norm.weight", norm(HD), "F32")
            add(p + "self_attn.k_norm.weight", norm(HD), "F32")
        if i < GLM4MOE["first_k_dense_replace"]:
            for n, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
                add(p + f"mlp.{n}_proj.weight", normal(*shape))
        else:
            # a decisive router (its sigmoids spread) and biases 0.6 apart in a random order: the
            # choice rarely near a tie, which llama.cpp's rounded activations would break
            add(p + "mlp.gate.weight", 10 * normal(E, D))
            add(p + "mlp.gate.e_score_correction_bias", rng.permutation(np.linspace(0.9, -0.9, E)), "F32")
            for e in range(E):
                for n, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
                    add(p + f"mlp.experts.{e}.{n}_proj.weight", normal(*shape))
            Fs = Fe * n_shared
            for n, shape in (("gate", (Fs, D)), ("up", (Fs, D)), ("down", (D, Fs))):
                add(p + f"mlp.shared_experts.{n}_proj.weight", normal(*shape))
        if i >= GLM4MOE["num_hidden_layers"]:  # the MTP layer's own tensors
            add(p + "eh_proj.weight", normal(D, 2 * D))
            for n in ("enorm", "hnorm", "shared_head.norm"):
                add(p + f"{n}.weight", norm(D), "F32")
    return ck.save(), cfg


def _mlp(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    g = h @ w[p + "gate_proj.weight"].T
    return ((g / (1 + np.exp(-g))) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def _moe(w: dict[str, np.ndarray], cfg: dict, p: str, h: np.ndarray) -> np.ndarray:
    """Glm4MoeMoE: each expert's sigmoid, the top k by sigmoid + e_score_correction_bias (one
    group), their sigmoids over their sum (+ 1e-20) where norm_topk_prob, times
    routed_scaling_factor, each a SwiGLU; plus the shared experts' SwiGLU of every token."""
    prob = 1 / (1 + np.exp(-(h @ w[p + "gate.weight"].T)))
    out = _mlp(w, p + "shared_experts.", h)
    for t in range(len(h)):
        top = np.argsort(-(prob[t] + w[p + "gate.e_score_correction_bias"]))[:cfg["num_experts_per_tok"]]
        wts = prob[t, top]
        if cfg["norm_topk_prob"]:
            wts = wts / (wts.sum() + 1e-20)
        for e, wt in zip(top, wts * cfg["routed_scaling_factor"]):
            out[t] += wt * _mlp(w, f"{p}experts.{e}.", h[t:t + 1])[0]
    return out


def glm4moe_forward(w: dict[str, np.ndarray], cfg: dict, ids: list[int]) -> np.ndarray:
    """transformers' Glm4Moe math in float64 (the MTP layer not run): attention with Q/K/V biases,
    per-head Q/K RMSNorm where the checkpoint has it, rotate_half RoPE over the first
    head_dim * partial_rotary_factor dims of each head; the dense MLP in the first layers, the
    MoE block in the others; the final norm, the untied lm_head."""
    eps, theta, T = cfg["rms_norm_eps"], cfg["rope_theta"], len(ids)
    rot = int(HD * cfg["partial_rotary_factor"])
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    ang = np.arange(T)[:, None] * (1.0 / theta ** (np.arange(0, rot, 2) / rot))[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # x: (T, heads, HD): the first rot dims rotated, the rest passed
        r, rest = x[..., :rot], x[..., rot:]
        half = np.concatenate([-r[..., rot // 2:], r[..., :rot // 2]], -1)
        return np.concatenate([r * cos[:, None] + half * sin[:, None], rest], -1)

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T + w[p + f"self_attn.{n}_proj.bias"] for n in "qkv")
        q, k, v = q.reshape(T, H, HD), k.reshape(T, HKV, HD), v.reshape(T, HKV, HD)
        if cfg["use_qk_norm"]:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, H // HKV, 1), np.repeat(v, H // HKV, 1)
        s = np.einsum("thd,shd->hts", q, k) * HD ** -0.5 + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(T, H * HD) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (_moe(w, cfg, p + "mlp.", h) if p + "mlp.gate.weight" in w else _mlp(w, p + "mlp.", h))
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
