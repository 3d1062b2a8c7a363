"""The exact reference of the backend tests: a float64 forward pass on the dequantized GGML
weights, no rounding anywhere, that arbitrates where two backends' roundings disagree."""
from __future__ import annotations

import numpy as np

from infer.quant.tensor import QTensor


def _rms(x, w, eps):
    if w is None:  # the architecture has no such norm (olmo2's pre-norms)
        return x
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, n_rot, base, scale, ff, neox, mscale=1.0, yarn=None):
    # yarn: (n_ctx_orig, beta_fast, beta_slow): YaRN's ramp between scaled and unscaled angles, and its magnitude
    half = n_rot // 2
    theta = np.arange(len(x))[:, None] * (base ** (-2.0 * np.arange(half) / n_rot) / ff)[None, :]
    ang = scale * theta
    if yarn is not None:
        n_orig, fast, slow = yarn
        dim = [n_rot * np.log(n_orig / (b * 2 * np.pi)) / (2 * np.log(base)) for b in (fast, slow)]
        lo, hi = max(0.0, np.floor(dim[0])), min(n_rot - 1.0, np.ceil(dim[1]))
        mix = 1 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0, 1)
        ang = ang * (1 - mix) + theta * mix
        mscale *= 1 + 0.1 * np.log(1 / scale)
    c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    lo, hi = (slice(0, half), slice(half, n_rot)) if neox else (slice(0, n_rot, 2), slice(1, n_rot, 2))
    a, b = x[..., lo].copy(), x[..., hi].copy()
    x[..., lo], x[..., hi] = a * c - b * s, a * s + b * c
    return x


def _dense(t: QTensor, rows=None) -> np.ndarray:
    if rows is not None:
        t = QTensor(t.type_id, (len(rows), t.n), t.raw[rows])
    return t.dequantize().astype(np.float64)


def exact_hidden(cfg, w, seqs: list[np.ndarray]) -> list[np.ndarray]:
    """float64 forward passes of whole sequences on the dequantized weights, no rounding anywhere:
    each (T, D), after the output norm.  The sequences' rows go through each product together."""
    H, eps = cfg.n_head, cfg.norm_eps
    ff_global = np.ones(cfg.n_rot // 2) if w.rope_freqs is None else w.rope_freqs.astype(np.float64)
    ends = np.cumsum([len(s) for s in seqs])[:-1]
    tokens = np.concatenate(seqs)
    x = _dense(w.token_embd, tokens) * cfg.embed_scale
    ple = _exact_per_layer_inputs(cfg, w, tokens, x) if w.ple_embd is not None else None
    kv_of: dict[int, list] = {}  # layer -> its K and V per sequence, after norms and RoPE (Gemma 4's shared-KV layers read them)
    for il, lw in enumerate(w.layers):
        if lw.shortconv_in is not None or lw.ssm_qkv is not None or lw.ssm_in is not None:
            # a recurrent layer in place of the attention (granite's residual_scale on both blocks'
            # outputs, 1 elsewhere)
            h = _rms(x, lw.attn_norm, eps)
            if lw.shortconv_in is not None:  # LFM2's short convolution
                o = _exact_shortconv(h, lw, ends) @ _dense(lw.shortconv_out).T
            elif lw.ssm_in is not None:  # Granite 4.0 H's Mamba-2 mixer
                o = _exact_mamba2(cfg, h, lw, ends) @ _dense(lw.ssm_out).T
            else:  # Qwen3.5's gated delta net
                o = _exact_delta_net(cfg, h, lw, ends) @ _dense(lw.ssm_out).T
            x = x + o * cfg.residual_scale
            h = _rms(x, lw.ffn_norm, eps)
            o = _exact_moe(cfg, lw, h) if lw.experts else _exact_ffn(cfg, h, lw.w_gate, lw.w_up, lw.w_down)
            if lw.shexp is not None:  # qwen35moe, qwen3next: the shared expert beside the experts
                o = o + _exact_shared_expert(cfg, lw, h)
            x = x + o * cfg.residual_scale
            continue
        swa = cfg.layer_swa[il]
        base, scale = (cfg.rope_base_swa, cfg.rope_scale_swa) if swa else (cfg.rope_base, cfg.rope_scale)
        Hkv, hd, _, n_rot = cfg.attn_shape(il)  # the layer's own (Gemma 4's differ by kind)
        # Gemma 4's sliding-window layers rotate without the file's factors (proportional RoPE is global)
        ff = np.ones(n_rot // 2) if swa and cfg.architecture.rope_freqs_global_only else ff_global
        own_kv = cfg.kv_source(il) == il
        h = _rms(x, lw.attn_norm, eps)
        if lw.kv_a is not None:  # deepseek2's multi-head latent attention, decompressed (_exact_mla)
            x = x + _exact_mla(cfg, h, lw, ends, ff_global) @ _dense(lw.wo).T
            h = _rms(x, lw.ffn_norm, eps)
            o = _exact_moe(cfg, lw, h) if lw.experts else _exact_ffn(cfg, h, lw.w_gate, lw.w_up, lw.w_down)
            if lw.shexp is not None:
                o = o + _exact_shared_expert(cfg, lw, h)
            x = x + o
            continue
        q = h @ _dense(lw.wq).T
        # Gemma 4's shared-KV layers have Q alone (their K/V: an earlier layer's, kv_of); none here
        k, v = (h @ _dense(lw.wk).T, h @ _dense(lw.wv).T) if own_kv else (np.zeros((len(x), 0)),) * 2
        # Qwen3.5's gated attention: the gate's rows of attn_q (models/mixer_weights.py split them out)
        gate = None if lw.attn_gate is None else h @ _dense(lw.attn_gate).T
        if lw.bq is not None:
            q, k, v = q + lw.bq, k + lw.bk, v + lw.bv
        whole = lw.q_norm is not None and len(lw.q_norm) == H * hd  # olmo2: over the whole projection
        if whole:
            q, k = _rms(q, lw.q_norm, eps), _rms(k, lw.k_norm, eps)
        n_kv = Hkv if own_kv else 0
        q, k = q.reshape(len(x), H, hd), k.reshape(len(x), n_kv, hd)
        v = v.reshape(len(x), n_kv, -1) if own_kv else k
        if lw.q_norm is not None and not whole:
            q, k = _rms(q, lw.q_norm, eps), _rms(k, lw.k_norm, eps)
        if lw.v_norm is not None and own_kv:  # Gemma 4: each V head RMS-normed, no weight
            v = _rms(v, 1.0, eps)
        outs = []
        for si, (qs, ks, vs) in enumerate(zip(np.split(q, ends), np.split(k, ends), np.split(v, ends))):
            T = len(qs)
            yarn = (cfg.n_ctx_orig, cfg.yarn_beta_fast, cfg.yarn_beta_slow) if cfg.rope_ext_factor else None
            if cfg.layer_rope(il):  # else no positions (granitehybrid's NoPE, smollm3's and llama4's every 4th layer)
                qs = _rope(qs, n_rot, base, scale, ff, cfg.architecture.rope_neox, cfg.rope_attn_factor, yarn)
                ks = _rope(ks, n_rot, base, scale, ff, cfg.architecture.rope_neox, cfg.rope_attn_factor, yarn)
                if cfg.kq_l2_norm:  # llama4: each head RMS-normalized after RoPE
                    qs, ks = _rms(qs, 1.0, eps), _rms(ks, 1.0, eps)
            if own_kv:
                kv_of.setdefault(il, []).append((ks, vs))
            else:
                ks, vs = kv_of[cfg.kv_source(il)][si]
            if cfg.layer_attn_temp(il):  # Llama 4's attention temperature (each sequence from position 0)
                qs = qs * cfg.attn_temperature(np.arange(T)).astype(np.float64)[:, None, None]
            ks, vs = np.repeat(ks, H // Hkv, axis=1), np.repeat(vs, H // Hkv, axis=1)
            sc = np.einsum("thd,shd->hts", qs, ks) * cfg.attn_scale
            if cfg.attn_logit_softcap > 0:
                sc = cfg.attn_logit_softcap * np.tanh(sc / cfg.attn_logit_softcap)
            qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
            W = cfg.sliding_window
            visible = (ki <= qi) & (((ki >= qi // W * W) if cfg.chunked else (qi - ki < W)) if swa else True)
            sc = np.where(visible[None], sc, -np.inf)
            top = sc.max(-1, keepdims=True)
            sink = 0.0
            if lw.sinks is not None:  # gpt-oss: each head's sink logit joins the softmax, without a value
                top = np.maximum(top, lw.sinks[:, None, None])
                sink = np.exp(lw.sinks[:, None, None] - top)
            p = np.exp(sc - top)
            outs.append(np.einsum("hts,shd->thd", p / (p.sum(-1, keepdims=True) + sink), vs).reshape(T, -1))
        a = np.concatenate(outs)
        if gate is not None:  # times sigmoid(gate) before attn_output
            a = a / (1 + np.exp(-gate))
        o = a @ _dense(lw.wo).T
        if lw.bo is not None:
            o = o + lw.bo
        x = x + _rms(o, lw.post_attn_norm, eps) * cfg.residual_scale
        h = _rms(x, lw.ffn_norm, eps)
        if lw.router_scale is not None:  # Gemma 4's experts beside its dense FFN (_exact_gemma4_ffn)
            o = _exact_gemma4_ffn(cfg, lw, x, h)
        else:
            o = _exact_moe(cfg, lw, h) if lw.experts else _exact_ffn(cfg, h, lw.w_gate, lw.w_up, lw.w_down)
        if lw.shexp is not None:
            o = o + _exact_shared_expert(cfg, lw, h)
        x = x + _rms(o, lw.post_ffn_norm, eps) * cfg.residual_scale
        if ple is not None:  # Gemma 4's per-layer embedding: proj(GELU(inp_gate x) * the layer's input), normed
            P = cfg.n_embd_per_layer
            g = _gelu(x @ _dense(lw.ple_gate).T) * ple[:, il * P:(il + 1) * P]
            x = x + _rms(g @ _dense(lw.ple_proj).T, lw.ple_norm, eps)
        if lw.out_scale is not None:  # Gemma 4's layer_output_scale
            x = x * float(lw.out_scale[0])
    return np.split(_rms(x, w.output_norm, eps), ends)


def _exact_per_layer_inputs(cfg, w, tokens, x):
    """gemma4.cpp's project_per_layer_inputs (with build_inp_per_layer): from x the scaled token
    embeddings, (RMSNorm of each layer's P columns of per_layer_model_proj x / sqrt(n_embd), times
    per_layer_proj_norm, + the token's per_layer_token_embd row * sqrt(P)) / sqrt(2), (T, n_layer * P)."""
    P, L = cfg.n_embd_per_layer, cfg.n_layer
    proj = (x @ _dense(w.ple_model_proj).T / np.sqrt(cfg.n_embd)).reshape(len(x), L, P)
    proj = _rms(proj, w.ple_proj_norm, cfg.norm_eps).reshape(len(x), L * P)
    return (proj + _dense(w.ple_embd, tokens) * np.sqrt(P)) / np.sqrt(2)


def _gelu(g):
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


def _exact_mla(cfg, h, lw, ends, ff):
    """deepseek2.cpp's attention in the form it is trained in (its non-absorbed branch): per head
    K = (its nope part: the normalized latent through the head's attn_k_b, transposed) | the shared
    RoPE'd key part, V = the latent through its attn_v_b; Q from attn_q (or attn_q_a, its norm,
    attn_q_b), its RoPE part rotated; softmax(Q·K * attn_scale) V per head, causal, each sequence alone."""
    H, R, n_rot, eps = cfg.n_head, cfg.n_lora_kv, cfg.n_rot, cfg.norm_eps
    dq, dv = cfg.head_dim_k_mla, cfg.head_dim_v_mla
    nope = dq - n_rot
    if lw.q_a is not None:
        q = _rms(h @ _dense(lw.q_a).T, lw.q_a_norm, eps) @ _dense(lw.wq).T
    else:
        q = h @ _dense(lw.wq).T
    q = q.reshape(len(h), H, dq)
    kv = h @ _dense(lw.kv_a).T
    latent = _rms(kv[:, :R], lw.kv_a_norm, eps)
    k_b = [_dense(t) for t in lw.k_b]  # (R, nope) each
    v_b = [_dense(t) for t in lw.v_b]  # (dv, R) each
    yarn = (cfg.n_ctx_orig, cfg.yarn_beta_fast, cfg.yarn_beta_slow) if cfg.rope_ext_factor else None
    outs = []
    for lo, hi in zip([0, *ends], [*ends, len(h)]):
        T = hi - lo
        q_pe = _rope(q[lo:hi, :, nope:].copy(), n_rot, cfg.rope_base, cfg.rope_scale, ff, False,
                     cfg.rope_attn_factor, yarn)
        k_pe = _rope(kv[lo:hi, None, R:].copy(), n_rot, cfg.rope_base, cfg.rope_scale, ff, False,
                     cfg.rope_attn_factor, yarn)[:, 0]
        o = np.empty((T, H, dv))
        visible = np.arange(T)[None, :] <= np.arange(T)[:, None]
        for hh in range(H):
            k_nope = latent[lo:hi] @ k_b[hh]  # (T, nope)
            v = latent[lo:hi] @ v_b[hh].T  # (T, dv)
            sc = (q[lo:hi, hh, :nope] @ k_nope.T + q_pe[:, hh] @ k_pe.T) * cfg.attn_scale
            sc = np.where(visible, sc, -np.inf)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            o[:, hh] = (p / p.sum(-1, keepdims=True)) @ v
        outs.append(o.reshape(T, H * dv))
    return np.concatenate(outs)


def _exact_shortconv(h, lw, ends):
    """llama.cpp's build_shortconv_block between in_proj and out_proj, each sequence from a zero
    state: in_proj to B | C | x; B * x with L - 1 zero rows before it (the state of a new
    sequence); ggml_ssm_conv (output t = sum over i of kernel[:, i] * input[t + i], the kernel
    (D, L) as in the GGUF); C times that."""
    D = h.shape[1]
    bcx = h @ _dense(lw.shortconv_in).T
    b, c, xs = bcx[:, :D], bcx[:, D:2 * D], bcx[:, 2 * D:]
    kernel = np.asarray(lw.shortconv, np.float64)  # (D, L)
    L = kernel.shape[1]
    outs = []
    for bs, xss in zip(np.split(b, ends), np.split(xs, ends)):
        padded = np.concatenate([np.zeros((L - 1, D)), bs * xss])
        outs.append(sum(padded[i:i + len(bs)] * kernel[:, i] for i in range(L)))
    return c * np.concatenate(outs)


def _exact_delta_net(cfg, h, lw, ends):
    """llama.cpp's build_layer_attn_linear (qwen35.cpp, delta-net-base.cpp) between the input
    products and ssm_out, each sequence from a zero state, read from ggml's graph rather than from
    any backend: qkv_mixed = attn_qkv h; ggml_ssm_conv over it with L - 1 zero columns before the
    sequence, SiLU; the Q, K, V views (Hk key heads of S, Hk again, Hv value heads of S);
    build_gdn_l2_norm (rms_norm with eps / S, times 1 / sqrt(S)) of Q and K; Q and K repeated
    (ggml_repeat_4d) to Hv heads, so value head h reads key head h % Hk (qwen35.cpp), or
    repeat-interleaved (qwen3next.cpp: reshaped to [S, 1, Hk], repeated to [S, Hv / Hk, Hk], so
    value head h reads key head h // (Hv / Hk)); gate g = softplus(alpha h +
    ssm_dt) * ssm_a, beta = sigmoid(ssm_beta h); then per token build_delta_net_autoregressive on
    the state s (ne: [S, S, Hv], s[i0, i1] with i0 along the key, i1 along the value): q scaled by
    1 / sqrt(S); s *= exp(g); sk = sum_i0 s k; d = (v - sk) beta; s += k d^T; o = sum_i0 s q;
    last build_norm_gated: RMSNorm of each head's o times ssm_norm, times SiLU(attn_gate h)."""
    S, Hk, Hv, eps = cfg.ssm_state_size, cfg.ssm_group_count, cfg.ssm_dt_rank, cfg.norm_eps
    qkv = h @ _dense(lw.ssm_qkv).T
    z = (h @ _dense(lw.ssm_z).T).reshape(len(h), Hv, S)
    beta = 1 / (1 + np.exp(-(h @ _dense(lw.ssm_beta).T)))
    g = np.logaddexp(0, h @ _dense(lw.ssm_alpha).T + lw.ssm_dt) * lw.ssm_a  # softplus
    kernel = np.asarray(lw.ssm_conv, np.float64)  # (C, L), as in the GGUF
    L = kernel.shape[1]
    outs = []
    for lo, hi in zip([0, *ends], [*ends, len(h)]):
        padded = np.concatenate([np.zeros((L - 1, qkv.shape[1])), qkv[lo:hi]])
        conv = sum(padded[i:i + hi - lo] * kernel[:, i] for i in range(L))
        conv = conv / (1 + np.exp(-conv))
        n = hi - lo
        q = conv[:, :Hk * S].reshape(n, Hk, S)
        k = conv[:, Hk * S:2 * Hk * S].reshape(n, Hk, S)
        v = conv[:, 2 * Hk * S:].reshape(n, Hv, S)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / np.sqrt(S)  # l2 norm, then the 1/sqrt(S) scale
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        if cfg.architecture.ssm_v_heads_grouped:
            q, k = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)
        else:
            q, k = np.tile(q, (1, Hv // Hk, 1)), np.tile(k, (1, Hv // Hk, 1))
        s = np.zeros((Hv, S, S))  # s[h, i1, i0]: value component i1, key component i0
        o = np.empty((n, Hv, S))
        for t in range(n):
            s *= np.exp(g[lo + t])[:, None, None]
            sk = (s * k[t][:, None, :]).sum(-1)
            d = (v[t] - sk) * beta[lo + t][:, None]
            s += d[:, :, None] * k[t][:, None, :]
            o[t] = (s * q[t][:, None, :]).sum(-1)
        outs.append(o)
    o = np.concatenate(outs)
    o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * lw.ssm_norm
    return (o * (z / (1 + np.exp(-z)))).reshape(len(h), Hv * S)


def _exact_mamba2(cfg, h, lw, ends):
    """llama.cpp's build_mamba2_layer (mamba-base.cpp) between ssm_in and ssm_out, each sequence
    from a zero state, read from ggml's graph rather than from any backend: zxBCdt = ssm_in h split
    into z (d_inner), xBC (d_inner + 2 n_group d_state) and dt (n_head); ggml_ssm_conv over xBC with
    d_conv - 1 zero columns before the sequence, plus ssm_conv1d.b, SiLU; x (head_dim per head), B
    and C (d_state per group) views of it; dt + ssm_dt_b; then ggml_ssm_scan per token with the
    state s (ne: [d_state, head_dim, n_head]) and head h reading group h / (n_head / n_group):
    dt' = softplus(dt) (dt itself past 20), dA = exp(dt' A[h]); s = s dA + B (x dt'); y = sum over
    d_state of s C; then y + x ssm_d, ggml_swiglu_split(z, y) = SiLU(z) y, and the grouped RMS norm
    (rows of d_inner / n_group) times ssm_norm."""
    N, G, H, inner, eps = cfg.ssm_state_size, cfg.ssm_group_count, cfg.ssm_dt_rank, cfg.ssm_inner_size, cfg.norm_eps
    P, width = inner // H, inner + 2 * G * N
    zxbcdt = h @ _dense(lw.ssm_in).T
    z, xbc, dt = zxbcdt[:, :inner], zxbcdt[:, inner:inner + width], zxbcdt[:, inner + width:] + lw.ssm_dt
    sp = np.where(dt > 20, dt, np.logaddexp(0, dt))  # (T, H)
    kernel = np.asarray(lw.ssm_conv, np.float64)  # (C, L), as in the GGUF
    L = kernel.shape[1]
    y = np.empty((len(h), H, P))
    xs = np.empty((len(h), H, P))
    for lo, hi in zip([0, *ends], [*ends, len(h)]):
        padded = np.concatenate([np.zeros((L - 1, width)), xbc[lo:hi]])
        conv = sum(padded[i:i + hi - lo] * kernel[:, i] for i in range(L)) + lw.ssm_conv_b
        conv = conv / (1 + np.exp(-conv))
        s = np.zeros((H, P, N))  # s[h, i, j]: row i of head h's x, state component j
        for t in range(hi - lo):
            x = conv[t, :inner].reshape(H, P)
            B = conv[t, inner:inner + G * N].reshape(G, N)
            C = conv[t, inner + G * N:].reshape(G, N)
            for hh in range(H):
                g = hh // (H // G)
                d = sp[lo + t, hh]
                s[hh] = s[hh] * np.exp(d * lw.ssm_a[hh]) + np.outer(x[hh] * d, B[g])
                y[lo + t, hh] = s[hh] @ C[g]
            xs[lo + t] = x
    y = (y + xs * np.asarray(lw.ssm_d, np.float64)[:, None]).reshape(len(h), inner)
    y = y * (z / (1 + np.exp(-z)))
    yg = y.reshape(len(h), G, inner // G)
    yg = yg / np.sqrt(np.mean(yg * yg, axis=-1, keepdims=True) + eps)
    return yg.reshape(len(h), inner) * lw.ssm_norm


def _exact_ffn(cfg, h, w_gate, w_up, w_down, biases=(0.0, 0.0, 0.0)):
    g, u = h @ _dense(w_gate).T + biases[0], h @ _dense(w_up).T + biases[1]
    if cfg.ffn_activation == "gelu":
        act = _gelu(g)
    elif cfg.ffn_activation == "swiglu_oai":  # gpt-oss
        x = np.minimum(g, 7.0)
        act, u = x / (1 + np.exp(-1.702 * x)), np.clip(u, -7.0, 7.0) + 1
    else:
        act = g / (1 + np.exp(-g))
    return (act * u) @ _dense(w_down).T + biases[2]


def _exact_gemma4_ffn(cfg, lw, x, h):
    """gemma4.cpp's FFN block of a layer with experts (26B-A4B), before post_ffw_norm: the dense FFN
    of h (ffn_norm(x)), normed by post_ffw_norm_1, plus the experts of pre_ffw_norm_2(x), routed on
    RMSNorm(x) without a weight times 1 / sqrt(n_embd) times ffn_gate_inp.scale, their weighted sum
    normed by post_ffw_norm_2."""
    eps = cfg.norm_eps
    dense = _rms(_exact_ffn(cfg, h, lw.w_gate, lw.w_up, lw.w_down), lw.post_ffn_norm_1, eps)
    r = _rms(x, 1.0, eps) / np.sqrt(cfg.n_embd) * np.asarray(lw.router_scale, np.float64)
    experts = _exact_moe(cfg, lw, _rms(x, lw.pre_ffn_norm_2, eps), r)
    return dense + _rms(experts, lw.post_ffn_norm_2, eps)


def _exact_moe(cfg, lw, h, r=None):
    """The mixture of experts in float64: softmax router, the top experts, weights renormalized
    (gpt-oss: the router's bias, the top logits' own softmax, the experts' biases; lfm2moe: each
    logit's sigmoid, the top experts by sigmoid plus the selection bias; Gemma 4: the router on r,
    each expert's output times its expert_scale)."""
    logits = (h if r is None else r) @ _dense(lw.router).T
    if lw.router_bias is not None:
        logits = logits + lw.router_bias
    gating = cfg.moe_gating
    after = gating == "softmax_weight"
    if gating == "sigmoid":
        p = 1 / (1 + np.exp(-logits))
    elif after:
        p = logits
    else:
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
    if gating == "sigmoid_logits":  # llama4: chosen by the logits, weighted by their sigmoids
        p = 1 / (1 + np.exp(-logits))
    choice = logits if gating == "sigmoid_logits" else p if lw.exp_probs_b is None else p + lw.exp_probs_b
    out = np.zeros_like(h)
    for t in range(len(h)):
        top = np.argsort(-choice[t])[:cfg.n_expert_used]
        wts = p[t, top]
        if after:
            wts = np.exp(wts - wts.max()) / np.exp(wts - wts.max()).sum()
        if cfg.moe_norm_weights:
            wts = wts / wts.sum()
        wts = wts * cfg.moe_weights_scale
        for e, wt in zip(top, wts):
            biases = (0.0, 0.0, 0.0) if lw.expert_biases is None else tuple(b[e] for b in lw.expert_biases)
            if lw.expert_scale is not None:
                wt = wt * float(lw.expert_scale[e])
            if cfg.architecture.moe_weight_before:  # llama4: the expert's input weighted instead
                out[t] += _exact_ffn(cfg, wt * h[t:t + 1], *lw.experts[e], biases)[0]
            else:
                out[t] += wt * _exact_ffn(cfg, h[t:t + 1], *lw.experts[e], biases)[0]
    return out


def _exact_shared_expert(cfg, lw, h):
    """qwen35moe.cpp's and qwen3next.cpp's shared expert: build_ffn(cur, ffn_up_shexp, ffn_gate_shexp,
    ffn_down_shexp, SILU, PAR) times ggml_sigmoid(ffn_gate_inp_shexp · cur), one gate per token
    (what the trunk adds to the experts' output); granite-hybrid.cpp's: the FFN alone (no gate)."""
    gate, up, down = lw.shexp
    y = _exact_ffn(cfg, h, gate, up, down)
    if lw.shexp_gate is None:
        return y
    g = h @ _dense(lw.shexp_gate).T  # (T, 1)
    return y / (1 + np.exp(-g))


def exact_logits(cfg, w, h: np.ndarray) -> np.ndarray:
    """h (N, D) -> (N, V) float64, the output matrix dequantized a slice at a time."""
    out = np.empty((len(h), cfg.n_vocab))
    step = 16384
    for r in range(0, cfg.n_vocab, step):
        out[:, r:r + step] = h @ _dense(w.output, np.arange(r, min(r + step, cfg.n_vocab))).T
    out *= cfg.logit_scale
    if cfg.final_logit_softcap > 0:
        out = cfg.final_logit_softcap * np.tanh(out / cfg.final_logit_softcap)
    return out
