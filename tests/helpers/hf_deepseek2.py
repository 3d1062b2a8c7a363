"""A tiny random Hugging Face DeepSeek-V2 folder (DeepseekV2ForCausalLM: multi-head latent
attention with kv_b_proj whole, a dense first layer, then a softmax router over experts with a
shared expert; q_lora_rank set (V2) or not (V2-Lite)) and a numpy forward pass of the HF model's
math, the reference for converted logits."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_models import SPECIALS, D, F, H, HfCheckpoint, chatml_tokenizer_config, train_bpe

# the latent (kv_lora_rank), each head's nope and RoPE parts and V, Q's compression (V2)
DS_SIZES = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
DS_Q_RANK = 48
# 4 experts of width 128, 2 per token, one shared expert, the first layer dense
DS_MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "n_shared_experts": 1,
          "first_k_dense_replace": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
          "scoring_func": "softmax", "topk_method": "greedy"}
# layers: V2-Lite's 27 without Q compression (llama.cpp knows a model without q_lora_rank by that
# count, and refuses any other without the key), 2 with it
DS_LAYERS = {False: 27, True: 2}


def make_deepseek2(folder: Path, seed: int, q_lora: bool) -> dict[str, np.ndarray]:
    """The checkpoint (matrices BF16, norms F32, an untied lm_head); returns the float32 weights the
    HF model computes with."""
    ck = HfCheckpoint(folder, seed)
    tok = train_bpe("qwen")
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIALS["qwen"]}
    cfg = {"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": DS_LAYERS[q_lora], "num_attention_heads": H,
           "num_key_value_heads": H, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "vocab_size": vocab, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "q_lora_rank": DS_Q_RANK if q_lora else None, "eos_token_id": ids["<|im_end|>"], **DS_SIZES, **DS_MOE}
    ck.write_config(cfg)
    ck.write_tokenizer(tok, chatml_tokenizer_config(tok))
    add, normal, norm = ck.add, ck.normal, ck.norm
    R, nope, rope, v = (DS_SIZES[k] for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    E, Fe = DS_MOE["n_routed_experts"], DS_MOE["moe_intermediate_size"]
    add("model.embed_tokens.weight", normal(vocab, D))
    add("model.norm.weight", norm(D), "F32")
    add("lm_head.weight", normal(vocab, D))
    for i in range(DS_LAYERS[q_lora]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", norm(D), "F32")
        add(p + "post_attention_layernorm.weight", norm(D), "F32")
        if q_lora:
            add(p + "self_attn.q_a_proj.weight", normal(DS_Q_RANK, D))
            add(p + "self_attn.q_a_layernorm.weight", norm(DS_Q_RANK), "F32")
            add(p + "self_attn.q_b_proj.weight", normal(H * (nope + rope), DS_Q_RANK))
        else:
            add(p + "self_attn.q_proj.weight", normal(H * (nope + rope), D))
        add(p + "self_attn.kv_a_proj_with_mqa.weight", normal(R + rope, D))
        add(p + "self_attn.kv_a_layernorm.weight", norm(R), "F32")
        add(p + "self_attn.kv_b_proj.weight", normal(H * (nope + v), R))
        add(p + "self_attn.o_proj.weight", normal(D, H * v))
        if i < DS_MOE["first_k_dense_replace"]:
            for n, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
                add(p + f"mlp.{n}_proj.weight", normal(*shape))
            continue
        add(p + "mlp.gate.weight", 10 * normal(E, D))  # a decisive router (ties would follow roundings)
        for e in range(E):
            for n, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
                add(p + f"mlp.experts.{e}.{n}_proj.weight", normal(*shape))
        for n, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
            add(p + f"mlp.shared_experts.{n}_proj.weight", normal(*shape))
    return ck.save()


def _rms(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """DeepseekV2's rotary embedding (apply_rotary_emb: adjacent pairs as complex numbers),
    x (T, heads, n) at positions 0..T-1."""
    n = x.shape[-1]
    ang = np.arange(len(x))[:, None] * base ** (-np.arange(0, n, 2) / n)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def _mlp(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    g, u = h @ w[p + "gate_proj.weight"].T, h @ w[p + "up_proj.weight"].T
    return (g / (1 + np.exp(-g)) * u) @ w[p + "down_proj.weight"].T


def deepseek2_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 logits of the HF model (DeepseekV2ForCausalLM's math, kv_b_proj decompressing the
    latent per head, as it is trained) for ids at positions 0..n-1."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    R, nope, rope, v = (DS_SIZES[k] for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    T = len(ids)
    x = w["model.embed_tokens.weight"][ids]
    causal = np.tril(np.ones((T, T), bool))
    n_layer = DS_LAYERS["model.layers.0.self_attn.q_a_proj.weight" in w]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"])
        if p + "self_attn.q_proj.weight" in w:
            q = h @ w[p + "self_attn.q_proj.weight"].T
        else:
            qa = _rms(h @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"])
            q = qa @ w[p + "self_attn.q_b_proj.weight"].T
        q = q.reshape(T, H, nope + rope)
        ckv = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        c = _rms(ckv[:, :R], w[p + "self_attn.kv_a_layernorm.weight"])
        kv = (c @ w[p + "self_attn.kv_b_proj.weight"].T).reshape(T, H, nope + v)
        q_pe, k_pe = _rope(q[..., nope:], 10000.0), _rope(ckv[:, None, R:], 10000.0)
        sc = (np.einsum("thd,shd->hts", q[..., :nope], kv[..., :nope])
              + np.einsum("thd,sd->hts", q_pe, k_pe[:, 0])) / np.sqrt(nope + rope)
        sc = np.where(causal[None], sc, -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", pr / pr.sum(-1, keepdims=True), kv[..., nope:]).reshape(T, H * v)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"])
        if i < DS_MOE["first_k_dense_replace"]:
            x = x + _mlp(w, p + "mlp.", h)
            continue
        logits = h @ w[p + "mlp.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = _mlp(w, p + "mlp.shared_experts.", h)
        for t in range(T):
            for e in np.argsort(-probs[t])[:DS_MOE["num_experts_per_tok"]]:  # unnormalized, scale 1
                out[t] += probs[t, e] * DS_MOE["routed_scaling_factor"] * _mlp(w, p + f"mlp.experts.{e}.", h[t:t + 1])[0]
        x = x + out
    return _rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
