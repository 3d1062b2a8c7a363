"""A tiny random Hugging Face Qwen3.5 folder (Qwen3_5ForCausalLM: gated delta nets around a gated
attention layer, more value heads than key heads) and a numpy forward pass of transformers'
Qwen3.5 math in float64, the reference for converted logits. Its variants: Qwen3.5 MoE
(Qwen3_5MoeForCausalLM: the MLP a mixture of experts beside a gated shared expert) and Qwen3-Next
(Qwen3NextForCausalLM: the MoE layers with in_proj_qkvz and in_proj_ba fused per key head), the
same math."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .hf_models import HD, HKV, SPECIALS, D, F, H, HfCheckpoint, chatml_tokenizer_config, train_bpe

QWEN35_TYPES = ["linear_attention", "full_attention", "linear_attention"]  # full_attention_interval 2
LIN = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
       "linear_num_key_heads": 2, "linear_num_value_heads": 4}
PARTIAL = 0.5  # of each head's dims rotated
EPS, THETA = 1e-6, 1000000.0
# the mixture of experts of the qwen35moe and qwen3next variants
N_EXPERT, N_USED, MOE_FF, SHARED_FF = 4, 2, 64, 96
VARIANTS = {"qwen35": ("qwen3_5_text", "Qwen3_5ForCausalLM"), "qwen35moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"),
            "qwen3next": ("qwen3_next", "Qwen3NextForCausalLM")}


def make_qwen35(folder: Path, seed: int, variant: str = "qwen35") -> dict[str, np.ndarray]:
    """The checkpoint (matrices and the conv kernel BF16; norms, A_log, dt_bias F32; tied embeddings);
    returns the float32 weights the HF model computes with, by Qwen3.5's names (Qwen3-Next's fused
    matrices unfused; the experts one matrix each, under mlp.experts.E.*)."""
    ck = HfCheckpoint(folder, seed)
    rng = ck.rng
    tok = train_bpe("qwen")
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIALS["qwen"]}
    model_type, hf_class = VARIANTS[variant]
    cfg = {"model_type": model_type, "architectures": [hf_class], "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": len(QWEN35_TYPES), "num_attention_heads": H,
           "num_key_value_heads": HKV, "head_dim": HD, "layer_types": QWEN35_TYPES, "full_attention_interval": 2,
           **LIN, "max_position_embeddings": 256, "rms_norm_eps": EPS,
           "rope_parameters": {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": PARTIAL,
                               "mrope_section": [6, 5, 5], "mrope_interleaved": True},
           "vocab_size": vocab, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
           "eos_token_id": ids["<|im_end|>"]}
    if variant != "qwen35":
        cfg.update(num_experts=N_EXPERT, num_experts_per_tok=N_USED, moe_intermediate_size=MOE_FF,
                   shared_expert_intermediate_size=SHARED_FF, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[])
        if variant == "qwen35moe":
            del cfg["intermediate_size"]  # Qwen3.5 MoE's config has no dense width
        else:  # Qwen3-Next: plain partial RoPE, no sections
            cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": PARTIAL}
    ck.write_config(cfg)
    ck.write_tokenizer(tok, chatml_tokenizer_config(tok))
    add, normal = ck.add, ck.normal
    shifted = lambda n: rng.normal(0, 0.1, size=n)  # Qwen3.5's RMSNorms scale by 1 + w
    hk, hv, dk, dv, L = (LIN[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                          "linear_value_head_dim", "linear_conv_kernel_dim"))
    C = 2 * hk * dk + hv * dv
    add("model.embed_tokens.weight", normal(vocab, D))
    add("model.norm.weight", shifted(D), "F32")
    for i, kind in enumerate(QWEN35_TYPES):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", shifted(D), "F32")
        add(p + "post_attention_layernorm.weight", shifted(D), "F32")
        if kind == "linear_attention":
            a = p + "linear_attn."
            add(a + "in_proj_qkv.weight", normal(C, D))
            add(a + "in_proj_z.weight", normal(hv * dv, D))
            add(a + "in_proj_b.weight", normal(hv, D))
            add(a + "in_proj_a.weight", normal(hv, D))
            if variant == "qwen3next":
                _fuse_qwen3next(ck.stored, ck.weights, a)
            add(a + "conv1d.weight", rng.uniform(-L ** -0.5, L ** -0.5, size=(C, 1, L)))
            add(a + "dt_bias", rng.uniform(0.5, 1.5, size=hv), "F32")
            add(a + "A_log", np.log(rng.uniform(0.05, 1.0, size=hv)), "F32")
            add(a + "norm.weight", 1.0 + rng.normal(0, 0.1, size=dv), "F32")
            add(a + "out_proj.weight", normal(D, hv * dv))
        else:
            add(p + "self_attn.q_proj.weight", normal(2 * H * HD, D))  # each head's query, then its gate
            add(p + "self_attn.k_proj.weight", normal(HKV * HD, D))
            add(p + "self_attn.v_proj.weight", normal(HKV * HD, D))
            add(p + "self_attn.o_proj.weight", normal(D, H * HD))
            add(p + "self_attn.q_norm.weight", shifted(HD), "F32")
            add(p + "self_attn.k_norm.weight", shifted(HD), "F32")
        if variant == "qwen35":
            add(p + "mlp.gate_proj.weight", normal(F, D))
            add(p + "mlp.up_proj.weight", normal(F, D))
            add(p + "mlp.down_proj.weight", normal(D, F))
            continue
        add(p + "mlp.gate.weight", normal(N_EXPERT, D) * 20)  # a router whose choices differ
        for e in range(N_EXPERT):
            for w, shape in (("gate_proj", (MOE_FF, D)), ("up_proj", (MOE_FF, D)), ("down_proj", (D, MOE_FF))):
                add(p + f"mlp.experts.{e}.{w}.weight", normal(*shape))
        for w, shape in (("gate_proj", (SHARED_FF, D)), ("up_proj", (SHARED_FF, D)), ("down_proj", (D, SHARED_FF))):
            add(p + f"mlp.shared_expert.{w}.weight", normal(*shape))
        add(p + "mlp.shared_expert_gate.weight", normal(1, D) * 20)
        if variant == "qwen35moe" and i > 0:  # transformers 5's fused experts (the first layer's stay apart)
            _fuse_experts(ck.stored, p + "mlp.experts.")
    return ck.save()


def _fuse_qwen3next(stored: dict[str, tuple[np.ndarray, str]], weights: dict[str, np.ndarray], a: str) -> None:
    """Qwen3-Next's in_proj_qkvz and in_proj_ba in place of Qwen3.5's four matrices: per key head,
    its q, k, v, z rows (and its value heads' b rows, then their a rows)."""
    hk, dk = LIN["linear_num_key_heads"], LIN["linear_key_head_dim"]
    qkv, z, b, al = (stored.pop(a + n)[0] for n in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight",
                                                     "in_proj_a.weight"))
    q, k, v = np.split(qkv, [hk * dk, 2 * hk * dk])
    per = lambda m: np.split(m, hk)  # each key head's rows
    stored[a + "in_proj_qkvz.weight"] = (np.concatenate([np.concatenate(g) for g in zip(per(q), per(k), per(v), per(z))]),
                                         "BF16")
    stored[a + "in_proj_ba.weight"] = (np.concatenate([np.concatenate(g) for g in zip(per(b), per(al))]), "BF16")


def _fuse_experts(stored: dict[str, tuple[np.ndarray, str]], e: str) -> None:
    """A layer's experts as transformers 5 stores them: gate_up_proj (experts, 2 * ff, D), each
    expert's gate rows then its up rows; down_proj (experts, D, ff)."""
    mats = {w: [stored.pop(f"{e}{x}.{w}.weight")[0] for x in range(N_EXPERT)]
            for w in ("gate_proj", "up_proj", "down_proj")}
    stored[e + "gate_up_proj"] = (np.stack([np.concatenate(g) for g in zip(mats["gate_proj"], mats["up_proj"])]), "BF16")
    stored[e + "down_proj"] = (np.stack(mats["down_proj"]), "BF16")


def _moe(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """Qwen3.5 MoE's / Qwen3-Next's sparse MoE block: softmax router, the top N_USED experts with
    their weights renormalized, plus the shared expert times sigmoid of its gate."""
    silu = lambda x: x / (1 + np.exp(-x))
    ffn = lambda x, g, u, d: (silu(x @ g.T) * (x @ u.T)) @ d.T
    logits = h @ w[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-probs[t])[:N_USED]
        for e in top:
            x = p + f"mlp.experts.{e}."
            out[t] += probs[t, e] / probs[t, top].sum() * ffn(h[t], w[x + "gate_proj.weight"], w[x + "up_proj.weight"],
                                                               w[x + "down_proj.weight"])
    s = p + "mlp.shared_expert."
    shared = ffn(h, w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
    return out + shared / (1 + np.exp(-(h @ w[p + "mlp.shared_expert_gate.weight"].T)))


def qwen35_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """transformers' Qwen3.5 math in float64: (1 + w) RMSNorms; the gated delta net (causal
    depthwise conv1d with SiLU; Q, K L2-normalized and repeated per value head in groups; the
    recurrent gated delta rule; RMSNorm times SiLU(z)); the attention with its per-head query gate,
    Q/K norms, RoPE over the first PARTIAL of each head (rotate_half); the SwiGLU MLP; tied lm_head."""
    T = len(ids)
    hk, hv, dk, dv, L = (LIN[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                          "linear_value_head_dim", "linear_conv_kernel_dim"))
    rms = lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    silu = lambda x: x / (1 + np.exp(-x))
    rot = int(HD * PARTIAL)
    ang = np.arange(T)[:, None] * (1.0 / THETA ** (np.arange(0, rot, 2) / rot))[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # x: (T, heads, HD); the first rot dims rotate
        r, rest = x[..., :rot], x[..., rot:]
        r = r * cos[:, None] + np.concatenate([-r[..., rot // 2:], r[..., :rot // 2]], -1) * sin[:, None]
        return np.concatenate([r, rest], -1)

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    for i, kind in enumerate(QWEN35_TYPES):
        p = f"model.layers.{i}."
        h = rms(x) * (1 + w[p + "input_layernorm.weight"])
        if kind == "linear_attention":
            a = p + "linear_attn."
            qkv = h @ w[a + "in_proj_qkv.weight"].T
            padded = np.concatenate([np.zeros((L - 1, qkv.shape[1])), qkv])
            kern = w[a + "conv1d.weight"][:, 0, :]  # (C, L), oldest input first
            qkv = silu(np.stack([(padded[t:t + L] * kern.T).sum(0) for t in range(T)]))
            q, k, v = np.split(qkv, [hk * dk, 2 * hk * dk], axis=-1)
            q, k, v = q.reshape(T, hk, dk), k.reshape(T, hk, dk), v.reshape(T, hv, dv)
            q = np.repeat(q, hv // hk, 1)  # repeat_interleave: value head h reads key head h // (hv / hk)
            k = np.repeat(k, hv // hk, 1)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            z = (h @ w[a + "in_proj_z.weight"].T).reshape(T, hv, dv)
            beta = 1 / (1 + np.exp(-(h @ w[a + "in_proj_b.weight"].T)))
            g = -np.exp(w[a + "A_log"]) * np.log1p(np.exp(h @ w[a + "in_proj_a.weight"].T + w[a + "dt_bias"]))
            state = np.zeros((hv, dk, dv))
            out = np.zeros((T, hv, dv))
            for t in range(T):
                state *= np.exp(g[t])[:, None, None]
                mem = (state * k[t][:, :, None]).sum(1)
                delta = (v[t] - mem) * beta[t][:, None]
                state += k[t][:, :, None] * delta[:, None, :]
                out[t] = (state * q[t][:, :, None]).sum(1)
            o = (rms(out) * w[a + "norm.weight"] * silu(z)).reshape(T, hv * dv) @ w[a + "out_proj.weight"].T
        else:
            qg = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, 2 * HD)
            q, gate = qg[..., :HD], qg[..., HD:].reshape(T, H * HD)
            kk = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, HKV, HD)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, HKV, HD)
            q = rope(rms(q) * (1 + w[p + "self_attn.q_norm.weight"]))
            kk = rope(rms(kk) * (1 + w[p + "self_attn.k_norm.weight"]))
            kk, v = np.repeat(kk, H // HKV, 1), np.repeat(v, H // HKV, 1)
            s = np.einsum("thd,shd->hts", q, kk) * HD ** -0.5 + np.triu(np.full((T, T), -np.inf), 1)
            att = np.exp(s - s.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att, v).reshape(T, H * HD) * (1 / (1 + np.exp(-gate)))
            o = o @ w[p + "self_attn.o_proj.weight"].T
        x = x + o
        h = rms(x) * (1 + w[p + "post_attention_layernorm.weight"])
        if p + "mlp.gate.weight" in w:
            x = x + _moe(w, p, h)
        else:
            x = x + (silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
                w[p + "mlp.down_proj.weight"].T
    return (rms(x) * (1 + w["model.norm.weight"])) @ w["model.embed_tokens.weight"].T
