"""A tiny random Hugging Face Granite 4.0 H folder (GraniteMoeHybridForCausalLM: Mamba-2 layers
around an attention layer without positions, the shared MLP as the FFN, granite's multipliers; with
experts, Granite 4.0 H Tiny's layout: a router and experts beside the shared MLP) and a numpy
forward pass of transformers' GraniteMoeHybrid math in float64, the reference for converted logits."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_models import GRANITE_MULTIPLIERS, HD, HKV, SPECIALS, D, F, H, HfCheckpoint, chatml_tokenizer_config, train_bpe

GH_TYPES = ["mamba", "attention", "mamba"]
MAMBA = {"mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
         "mamba_expand": 2, "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_chunk_size": 256}
EPS = 1e-5
# with experts: how many, how many per token, each one's width (intermediate_size) and the shared
# MLP's (shared_intermediate_size), different so that a swap would show
GH_EXPERTS, GH_USED, GH_FF_EXP, GH_FF_SHARED = 4, 2, 256, 384


def make_granitehybrid(folder: Path, seed: int, experts: bool = False) -> dict[str, np.ndarray]:
    """The checkpoint (matrices and the conv kernel BF16; norms, biases, A_log, D, dt_bias F32;
    tied embeddings); experts: GH_EXPERTS of them (block_sparse_moe) beside the shared MLP. Returns
    the float32 weights the HF model computes with."""
    ck = HfCheckpoint(folder, seed)
    rng = ck.rng
    tok = train_bpe("qwen")
    vocab = -(-tok.get_vocab_size() // 8) * 8  # the converter pads to a multiple of 8: none needed
    ids = {t: tok.token_to_id(t) for t in SPECIALS["qwen"]}
    cfg = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": D,
           "intermediate_size": F, "shared_intermediate_size": F, "num_local_experts": 0,
           "num_hidden_layers": len(GH_TYPES), "num_attention_heads": H, "num_key_value_heads": HKV,
           "layer_types": GH_TYPES, "position_embedding_type": "nope", **MAMBA, **GRANITE_MULTIPLIERS,
           "max_position_embeddings": 4096, "rms_norm_eps": EPS, "rope_theta": 10000.0, "vocab_size": vocab,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
           "eos_token_id": ids["<|im_end|>"]}
    if experts:
        cfg.update(num_local_experts=GH_EXPERTS, num_experts_per_tok=GH_USED, intermediate_size=GH_FF_EXP,
                   shared_intermediate_size=GH_FF_SHARED)
    Fs = cfg["shared_intermediate_size"]
    ck.write_config(cfg)
    ck.write_tokenizer(tok, chatml_tokenizer_config(tok))
    add, normal, norm = ck.add, ck.normal, ck.norm
    nh, G, N, L = MAMBA["mamba_n_heads"], MAMBA["mamba_n_groups"], MAMBA["mamba_d_state"], MAMBA["mamba_d_conv"]
    inner = MAMBA["mamba_expand"] * D
    C = inner + 2 * G * N
    add("model.embed_tokens.weight", normal(vocab, D))
    add("model.norm.weight", norm(D), "F32")
    for i, kind in enumerate(GH_TYPES):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", norm(D), "F32")
        add(p + "post_attention_layernorm.weight", norm(D), "F32")
        if kind == "mamba":
            m = p + "mamba."
            add(m + "in_proj.weight", normal(inner + C + nh, D))  # z, xBC, dt
            add(m + "conv1d.weight", rng.uniform(-L ** -0.5, L ** -0.5, size=(C, 1, L)))
            add(m + "conv1d.bias", rng.uniform(-L ** -0.5, L ** -0.5, size=C), "F32")
            add(m + "dt_bias", rng.uniform(-1.0, 0.5, size=nh), "F32")
            add(m + "A_log", np.log(rng.uniform(0.05, 1.0, size=nh)), "F32")
            add(m + "D", rng.uniform(0.5, 1.5, size=nh), "F32")
            add(m + "norm.weight", norm(inner), "F32")
            add(m + "out_proj.weight", normal(D, inner))
        else:
            add(p + "self_attn.q_proj.weight", normal(H * HD, D))
            add(p + "self_attn.k_proj.weight", normal(HKV * HD, D))
            add(p + "self_attn.v_proj.weight", normal(HKV * HD, D))
            add(p + "self_attn.o_proj.weight", normal(D, H * HD))
        if experts:  # a decisive router (near-ties would let BF16 roundings pick other experts)
            moe = p + "block_sparse_moe."
            add(moe + "router.layer.weight", 20 * normal(GH_EXPERTS, D))
            add(moe + "input_linear.weight", normal(GH_EXPERTS, 2 * GH_FF_EXP, D))  # per expert gate, then up
            add(moe + "output_linear.weight", normal(GH_EXPERTS, D, GH_FF_EXP))
        add(p + "shared_mlp.input_linear.weight", normal(2 * Fs, D))  # gate, then up
        add(p + "shared_mlp.output_linear.weight", normal(D, Fs))
    return ck.save()


def granitehybrid_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """transformers' GraniteMoeHybrid math in float64: embeddings times embedding_multiplier; each
    block's output times residual_multiplier; Mamba-2 (in_proj to z, xBC, dt; causal depthwise conv1d
    with bias and SiLU; the scan with softplus(dt + dt_bias), A = -exp(A_log), B and C per group;
    plus D x; the gated RMSNorm per group: RMSNorm(y * SiLU(z)) * w); attention without positions,
    scaled by attention_multiplier; the shared MLP (input_linear's gate and up halves); tied lm_head
    divided by logits_scaling. With experts (a router in w): the router's top GH_USED logits per
    token, softmaxed among themselves, weigh those experts' gated SiLU FFNs, to which the shared MLP's
    output is added."""
    T = len(ids)
    gm = GRANITE_MULTIPLIERS
    nh, hd, G, N, L = (MAMBA[k] for k in ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                                          "mamba_d_conv"))
    inner = nh * hd
    C = inner + 2 * G * N
    rms = lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    silu = lambda x: x / (1 + np.exp(-x))
    x = w["model.embed_tokens.weight"][ids].astype(np.float64) * gm["embedding_multiplier"]
    for i, kind in enumerate(GH_TYPES):
        p = f"model.layers.{i}."
        h = rms(x) * w[p + "input_layernorm.weight"]
        if kind == "mamba":
            m = p + "mamba."
            proj = h @ w[m + "in_proj.weight"].T
            z, xbc, dt = proj[:, :inner], proj[:, inner:inner + C], proj[:, inner + C:]
            padded = np.concatenate([np.zeros((L - 1, C)), xbc])
            kern = w[m + "conv1d.weight"][:, 0, :]  # (C, L), oldest input first
            xbc = silu(np.stack([(padded[t:t + L] * kern.T).sum(0) for t in range(T)]) + w[m + "conv1d.bias"])
            xs = xbc[:, :inner].reshape(T, nh, hd)
            B, Cm = xbc[:, inner:inner + G * N].reshape(T, G, N), xbc[:, inner + G * N:].reshape(T, G, N)
            sp = np.log1p(np.exp(dt + w[m + "dt_bias"]))
            A = -np.exp(w[m + "A_log"].astype(np.float64))
            s = np.zeros((nh, hd, N))
            y = np.zeros((T, nh, hd))
            for t in range(T):
                for hh in range(nh):
                    g = hh // (nh // G)
                    s[hh] = s[hh] * np.exp(sp[t, hh] * A[hh]) + np.outer(xs[t, hh] * sp[t, hh], B[t, g])
                    y[t, hh] = s[hh] @ Cm[t, g] + w[m + "D"][hh] * xs[t, hh]
            y = (y.reshape(T, inner) * silu(z)).reshape(T, G, inner // G)
            o = (rms(y).reshape(T, inner) * w[m + "norm.weight"]) @ w[m + "out_proj.weight"].T
        else:
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, HD)
            kk = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, HKV, HD)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, HKV, HD)
            kk, v = np.repeat(kk, H // HKV, 1), np.repeat(v, H // HKV, 1)
            sc = np.einsum("thd,shd->hts", q, kk) * gm["attention_multiplier"] + np.triu(np.full((T, T), -np.inf), 1)
            att = np.exp(sc - sc.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att, v).reshape(T, H * HD) @ w[p + "self_attn.o_proj.weight"].T
        x = x + o * gm["residual_multiplier"]
        h = rms(x) * w[p + "post_attention_layernorm.weight"]
        gate, up = np.split(h @ w[p + "shared_mlp.input_linear.weight"].T, 2, axis=-1)
        o = (silu(gate) * up) @ w[p + "shared_mlp.output_linear.weight"].T
        moe = p + "block_sparse_moe."
        if moe + "router.layer.weight" in w:
            logits = h @ w[moe + "router.layer.weight"].T
            for t in range(T):
                top = np.argsort(-logits[t])[:GH_USED]
                wts = np.exp(logits[t, top] - logits[t, top].max())
                for e, wt in zip(top, wts / wts.sum()):
                    g, u = np.split(h[t] @ w[moe + "input_linear.weight"][e].T, 2)
                    o[t] += wt * (silu(g) * u) @ w[moe + "output_linear.weight"][e].T
        x = x + o * gm["residual_multiplier"]
    return (rms(x) * w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T / gm["logits_scaling"]
