"""The decoder's primitives (the layer recipe is models/arch/decoder.py) in MLX.

Built per forward pass: the batch's RoPE angles, attention plans and cache slots. Where the cpu
backend reproduces llama.cpp's roundings cheaply (Q to f16 before Q·K, GELU through f16) this does
the same, so the two backends agree closely; activations are not quantized to 8 bits as the cpu
kernels do, which is the main remaining difference. On a GPU the products take float16 inputs
while the residual stream stays float32.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from infer.backends.batch import Batch
from infer.backends.cpu.elementwise import rope_angles
from infer.backends.cpu.glu import OAI_ALPHA, OAI_LIMIT
from infer.backends.cpu.moe import GATING, route
from infer.quant.dequant import dequantize

from .attention import AttentionPlan, as_dtype
from .delta_net import DeltaPlan, delta_net
from .kv_pool import KV_DTYPE, MlxKVPool
from .mamba import mamba2
from .shortconv import ConvPlan, shortconv
from .state_pool import MlxStatePool


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array, neox: bool) -> mx.array:
    """x (T, H, D): its first n_rot dims rotated; cos, sin (T, 1, n_rot/2)."""
    half = cos.shape[-1]
    n_rot = 2 * half
    T, H, D = x.shape
    if neox:  # pairs (i, i + n_rot/2)
        a, b = x[..., :half], x[..., half:n_rot]
        parts = [a * cos - b * sin, a * sin + b * cos]
    else:  # adjacent pairs (2i, 2i+1)
        p = x[..., :n_rot].reshape(T, H, half, 2)
        a, b = p[..., 0], p[..., 1]
        parts = [mx.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(T, H, n_rot)]
    if n_rot < D:
        parts.append(x[..., n_rot:])
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)


def _f16_round(x: mx.array) -> mx.array:
    return x.astype(mx.float16).astype(x.dtype)


def gelu_ggml(g: mx.array) -> mx.array:
    """ggml's GELU: the tanh approximation of the input rounded to f16, rounded to f16 (its table);
    exact 0 / identity beyond ±10."""
    h = _f16_round(g)
    y = _f16_round(0.5 * h * (1.0 + mx.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h))))
    return mx.where(g >= 10.0, g, mx.where(g <= -10.0, mx.zeros_like(g), y))


class MlxPrimitives:
    """The primitives for one batch of one runner (an MlxRunner)."""

    def __init__(self, runner: Any, batch: Batch, pool: MlxKVPool, states: MlxStatePool | None = None):
        cfg = runner.cfg
        arch = cfg.architecture
        self.runner, self.cfg, self.batch, self.pool, self.states = runner, cfg, batch, pool, states
        # a hybrid model's causal convolutions: which inputs each token reads (shortconv.py; the
        # "conv" state keeps L - 1 inputs); the steps of its gated delta nets (delta_net.py) or
        # Mamba-2 scans (mamba.py), a token of each sequence per step
        shapes = cfg.state_shapes
        self.conv_plan = ConvPlan(batch, shapes["conv"][0] + 1) if cfg.recurrent_layers else None
        self.step_plan = DeltaPlan(batch) if cfg.recurrent_layers and ("delta" in shapes or "ssm" in shapes) else None
        self.dt = runner.dtype
        self.T = len(batch.tokens)
        self.plans = [AttentionPlan(batch, g, pool.block_size, w, c, cfg.causal) for g, (w, c) in
                      enumerate(zip(pool.windows, pool.chunked))]
        self.slots = [mx.array(s) for s in batch.slots]
        # the batch's RoPE angles; none where attention has no positions (granitehybrid's NoPE)
        self.ropes = [self._rope(False)] if cfg.rope else []
        if cfg.rope and any(cfg.layer_swa):
            self.ropes.append(self._rope(True))
        self.q_scale = cfg.attn_scale if arch.prescale_q else 1.0
        # the attention temperature per token times the prescale, a factor of Q on the layers that take
        # it (cfg.layer_attn_temp), as the cpu backend's one multiply (float32)
        self.q_temp = (mx.array(cfg.attn_temperature(batch.positions) * np.float32(self.q_scale))[:, None, None]
                       if cfg.attn_temp_scale else None)
        self.kq_scale = 1.0 if arch.prescale_q else cfg.attn_scale

    def _rope(self, swa: bool) -> tuple[mx.array, mx.array]:
        # the cpu backend's angles (ggml's arithmetic), so both rotate by the same cos and sin; the
        # sliding-window layers' rotated dims and factors may be their own (Gemma 4)
        cfg, r = self.cfg, self.runner
        ff = r.freq_factors_swa if swa else r.freq_factors
        n_rot = cfg.attn_shape(cfg.layer_swa.index(True))[3] if swa else cfg.n_rot
        c = np.empty((self.T, n_rot // 2), np.float32)
        s = np.empty_like(c)
        rope_angles(cfg, self.batch.positions, swa, ff, c, s)
        return mx.array(c)[:, None, :], mx.array(s)[:, None, :]

    def _norm(self, x: mx.array, w: mx.array | None) -> mx.array:
        return x if w is None else mx.fast.rms_norm(x, w, self.cfg.norm_eps)

    # -- the primitives (models/arch/decoder.py) -------------------------------------------------------

    def embed(self, name: str) -> mx.array:
        x = self.runner.embed.take(mx.array(self.batch.tokens)).astype(mx.float32)
        x = x * self.cfg.embed_scale if self.cfg.embed_scale != 1.0 else x
        if self.cfg.architecture.bert_norms:  # token type 0's row, the positions' embeddings, the norm
            r = self.runner
            if r.token_type is not None:
                x = x + r.token_type
            if r.pos_embd is not None:
                x = r.pos_embd[mx.array(self.batch.positions)] + x
            x = mx.fast.layer_norm(x, r.embd_norm, r.embd_norm_b, self.cfg.norm_eps)
        return x

    def add_layer_norm(self, x: mx.array, o: mx.array, w: mx.array, b: mx.array, name: str, il: int) -> mx.array:
        return mx.fast.layer_norm(x + o, w, b, self.cfg.norm_eps)

    def qk_layer_norm(self, qkv: mx.array, ly: Any, il: int) -> mx.array:
        if ly.qkv_b is None:
            return qkv
        qkv = qkv + ly.qkv_b
        nq, nk = self.cfg.n_head * self.cfg.head_dim, self.cfg.n_head_kv * self.cfg.head_dim
        q, k = qkv[:, :nq], qkv[:, nq:nq + nk]
        if ly.q_layer_norm is not None:
            q = mx.fast.layer_norm(q, ly.q_layer_norm, ly.q_layer_norm_b, self.cfg.norm_eps)
        if ly.k_layer_norm is not None:
            k = mx.fast.layer_norm(k, ly.k_layer_norm, ly.k_layer_norm_b, self.cfg.norm_eps)
        return mx.concatenate([q, k, qkv[:, nq + nk:]], axis=-1)

    def act(self, y: mx.array, il: int) -> mx.array:
        return gelu_ggml(y)

    def norm(self, x: mx.array, w: mx.array | None, name: str, il: int) -> mx.array:
        return as_dtype(self._norm(x, w), self.dt)

    def linear(self, ws: list, h: mx.array, name: str, il: int) -> mx.array:
        ys = [m.matmul(as_dtype(h, self.dt)) for m in ws]
        return as_dtype(ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=-1), mx.float32)

    def attention(self, qkv: mx.array, ly: Any, il: int) -> mx.array:
        cfg, T = self.cfg, self.T
        H = cfg.n_head
        Hkv, D, Dv, _ = cfg.attn_shape(il)  # this layer's own (Gemma 4's differ by kind)
        nq, nk = H * D, Hkv * D
        own_kv = cfg.kv_source(il) == il  # else Q alone: the layer reads an earlier layer's K/V (Gemma 4)
        if ly.bqkv is not None:
            qkv = qkv + ly.bqkv
        # a gated attention's gate follows V (attn_gate); Gemma 4's V may be K's product as it is
        q, k = qkv[:, :nq], qkv[:, nq:nq + nk]
        v = k if ly.v_from_k else qkv[:, nq + nk:nq + nk + Hkv * Dv]
        whole = ly.q_norm is not None and ly.q_norm.shape[0] == nq and H > 1
        if whole:  # over the whole projection (olmo2)
            q, k = self._norm(q, ly.q_norm), self._norm(k, ly.k_norm)
        q = q.reshape(T, H, D)
        if own_kv:
            k, v = k.reshape(T, Hkv, D), v.reshape(T, Hkv, Dv)
        if ly.q_norm is not None and not whole:  # over each head
            q = self._norm(q, ly.q_norm)
            if own_kv:
                k = self._norm(k, ly.k_norm)
        if own_kv and ly.v_norm:  # Gemma 4: each V head RMS-normed, no weight
            v = mx.fast.rms_norm(v, None, cfg.norm_eps)
        if self.ropes and cfg.layer_rope(il):  # else NoPE: Q and K as they are
            cos, sin = self.ropes[1 if cfg.layer_swa[il] else 0]
            neox = cfg.architecture.rope_neox
            q = apply_rope(q, cos, sin, neox)
            k = apply_rope(k, cos, sin, neox) if own_kv else k
            if cfg.kq_l2_norm:  # llama4: each head RMS-normalized after RoPE, no weight
                q, k = mx.fast.rms_norm(q, None, cfg.norm_eps), mx.fast.rms_norm(k, None, cfg.norm_eps)
        if self.q_temp is not None and cfg.layer_attn_temp(il):
            q = q * self.q_temp
        elif self.q_scale != 1.0:
            q = q * self.q_scale
        q = _f16_round(q)  # as the cpu backend (and llama.cpp) before Q·K
        g, j = self.pool.layer_at[il]  # a shared-KV layer's: its source layer's arrays themselves
        kc, vc = self.pool.k[g][j], self.pool.v[g][j]
        if own_kv:
            kc[self.slots[g]] = k.astype(KV_DTYPE)  # in place: the pool's arrays now include this batch
            vc[self.slots[g]] = v.astype(KV_DTYPE)
        return self.plans[g].attend(as_dtype(q, self.dt), kc, vc, self.kq_scale, cfg.attn_logit_softcap, ly.sinks,
                                    self.runner.alibi)

    def rms_norm(self, y: mx.array, w: mx.array | None, name: str, il: int) -> mx.array:
        return self._norm(y, w)

    def mla_attention(self, q: mx.array, kv: mx.array, ly: Any, il: int) -> mx.array:
        """As the cpu backend's (backends/cpu/mla.py): the cache row latent | RoPE'd key part, Q as
        each head's nope part through attn_k_b | its RoPE'd part, MQA over the latent (V: each row's
        leading latent), each head's output through attn_v_b."""
        cfg, T = self.cfg, self.T
        H, R, n_rot, dq = cfg.n_head, cfg.n_lora_kv, cfg.n_rot, cfg.head_dim_k_mla
        nope = dq - n_rot
        cos, sin = self.ropes[0]
        q = q.reshape(T, H, dq)
        q_pe = apply_rope(q[..., nope:], cos, sin, False)
        absorbed = mx.stack([self.linear([w], q[:, h, :nope], "q_nope_absorbed", il) for h, w in enumerate(ly.k_b)],
                            axis=1)
        q = _f16_round(mx.concatenate([absorbed, q_pe], axis=-1))  # as the cpu backend (and llama.cpp) before Q·K
        latent = self._norm(kv[:, :R], ly.kv_a_norm)
        k_pe = apply_rope(kv[:, None, R:], cos, sin, False)
        g, j = self.pool.layer_at[il]
        kc = self.pool.k[g][j]
        kc[self.slots[g]] = mx.concatenate([latent[:, None], k_pe], axis=-1).astype(KV_DTYPE)
        a = self.plans[g].attend(as_dtype(q, self.dt), kc, kc[..., :R], self.kq_scale, 0.0).reshape(T, H, R)
        return mx.concatenate([self.linear([w], a[:, h], "kqv_mla", il) for h, w in enumerate(ly.v_b)], axis=-1)

    def bias(self, y: mx.array, b: mx.array | None, name: str, il: int) -> mx.array:
        return y if b is None else y + b

    def add_norm(self, x: mx.array, o: mx.array, post: mx.array | None, w: mx.array | None, il: int, name: str,
                 next_name: str, next_il: int) -> tuple[mx.array, mx.array]:
        o = self._norm(o, post)
        if self.cfg.residual_scale != 1.0:
            o = o * self.cfg.residual_scale
        x = x + o
        return x, self._norm(x, w)

    def per_layer_inputs(self, x: mx.array) -> None:
        """Gemma 4's per-layer inputs of the batch (T, n_layer * P), kept for per_layer_gate, from x
        the scaled token embeddings: (RMSNorm(per_layer_model_proj · x / sqrt(D)) per layer + the
        token's own per_layer_token_embd rows * sqrt(P)) / sqrt(2), as llama.cpp's
        project_per_layer_inputs (and the cpu backend, in the same float32 steps)."""
        cfg, r, T, f32 = self.cfg, self.runner, self.T, np.float32
        P, n = cfg.n_embd_per_layer, cfg.n_layer * cfg.n_embd_per_layer
        t = r.ple_embd  # on the host: only the batch's rows dequantized (runner)
        rows = dequantize(np.ascontiguousarray(t.raw[self.batch.tokens]), t.type_id, (T, n)) * np.sqrt(f32(P))
        proj = self.linear(r.ple_model_proj, x, "per_layer_proj", -1) * (f32(1.0) / np.sqrt(f32(cfg.n_embd)))
        proj = mx.fast.rms_norm(proj.reshape(T, cfg.n_layer, P), r.ple_proj_norm, cfg.norm_eps).reshape(T, n)
        self.ple = (proj + mx.array(rows)) * (f32(1.0) / np.sqrt(f32(2.0)))

    def per_layer_gate(self, x: mx.array, ly: Any, il: int) -> mx.array:
        """GELU(inp_gate · x) times layer il's per-layer input (T, P)."""
        P = self.cfg.n_embd_per_layer
        g = self.linear(ly.ple_gate, x, "per_layer_inp_gate", il)
        return gelu_ggml(g) * self.ple[:, il * P:(il + 1) * P]

    def add_scale_norm(self, x: mx.array, o: mx.array, post: mx.array | None, s: mx.array | None,
                       w: mx.array | None, il: int, next_name: str, next_il: int) -> tuple[mx.array, mx.array]:
        x, h = self.add_norm(x, o, post, None if s is not None else w, il, "l_out", next_name, next_il)
        if s is None:
            return x, h
        x = x * s
        return x, self._norm(x, w)

    def glu(self, gu: mx.array, il: int) -> mx.array:
        F = gu.shape[-1] // 2  # n_ff, or an expert's width
        gate, up = gu[:, :F], gu[:, F:]
        kind = self.cfg.architecture.activation
        if kind == "swiglu_oai":  # gpt-oss (ggml_swiglu_oai)
            limit, alpha = float(OAI_LIMIT), float(OAI_ALPHA)
            x = mx.minimum(gate, limit)
            return x / (1.0 + mx.exp(-alpha * x)) * (mx.clip(up, -limit, limit) + 1.0)
        act = gelu_ggml(gate) if kind == "gelu" else gate / (1.0 + mx.exp(-gate))
        return act * up

    def moe(self, h: mx.array, ly: Any, il: int, r: mx.array | None = None) -> mx.array:
        """The mixture of experts: the router evaluated (on r where given: Gemma 4), the choice made
        as the cpu backend makes it (backends/cpu/moe.py's route), then each expert the batch uses
        once, on its tokens, its output times its scale where the layer has one."""
        cfg, T = self.cfg, self.T
        k = cfg.n_expert_used
        h_router = h
        if r is not None:  # Gemma 4: RMSNorm(r) times 1 / sqrt(n_embd), times ffn_gate_inp.scale (float32, as the cpu backend)
            h_router = mx.fast.rms_norm(r, None, cfg.norm_eps) * (np.float32(1.0) / np.sqrt(np.float32(cfg.n_embd)))
            h_router = h_router * ly.router_scale
        logits = self.linear(ly.router, h_router, "ffn_moe_logits", il)
        if ly.router_bias is not None:
            logits = logits + ly.router_bias
        logits = np.ascontiguousarray(np.array(logits), np.float32)
        sel, w = np.zeros((T, k), np.int32), np.zeros((T, k), np.float32)
        route(logits, k, cfg.moe_norm_weights, cfg.moe_weights_scale, GATING[cfg.moe_gating], ly.exp_probs_b, sel, w,
              np.zeros(cfg.n_expert, np.float32))
        slots = mx.zeros((T * k, cfg.n_embd), mx.float32)
        flat = sel.reshape(-1)
        before = cfg.architecture.moe_weight_before  # llama4: each slot's input weighted, its output added as it is
        if before:
            h = (h[:, None, :] * mx.array(w)[:, :, None]).reshape(T * k, -1)
            w = np.ones_like(w)
        for e in np.unique(flat).tolist():
            where = np.flatnonzero(flat == e)  # slots t * k + j routed to e
            x = h[mx.array(where if before else where // k)]
            gate_up, down = ly.experts[e]
            gu = self.linear(gate_up, x, "ffn_gate_up", il)
            if ly.expert_biases is not None:  # gpt-oss: (gate|up, down) biases of each expert
                gu = gu + ly.expert_biases[0][e]
            act = self.glu(gu, il) if cfg.architecture.ffn_gated else self.act(gu, il)  # nomic-bert-moe: GELU(up)
            y = self.linear(down, act, "ffn_out", il)
            if ly.expert_biases is not None:
                y = y + ly.expert_biases[1][e]
            if ly.expert_scale is not None:  # Gemma 4: each expert's output times its ffn_down_exps.scale
                y = y * ly.expert_scale[e]
            slots[mx.array(where)] = y
        slots = slots.reshape(T, k, cfg.n_embd)
        wts = mx.array(w)[:, :, None]
        out = slots[:, 0] * wts[:, 0]
        for j in range(1, k):  # the slots added in order, as llama.cpp
            out = out + slots[:, j] * wts[:, j]
        return out

    def shortconv(self, bcx: mx.array, ly: Any, il: int) -> mx.array:
        # float32 whatever the products' dtype: the state is float32, as the cpu backend's
        state = self.states.conv[self.states.index(il)]
        return shortconv(as_dtype(bcx, mx.float32), ly.shortconv, state, self.conv_plan)

    def delta_net(self, proj: mx.array, ly: Any, il: int) -> mx.array:
        # float32 whatever the products' dtype: the states are float32, as the cpu backend's
        j = self.states.index(il)
        return delta_net(as_dtype(proj, mx.float32), ly, self.cfg.ssm_group_count,
                         self.cfg.architecture.ssm_v_heads_grouped, self.cfg.norm_eps,
                         self.states.conv[j], self.states.delta[j], self.conv_plan, self.step_plan)

    def mamba2(self, proj: mx.array, ly: Any, il: int) -> mx.array:
        # float32 whatever the products' dtype: the states are float32, as the cpu backend's
        j = self.states.index(il)
        return mamba2(as_dtype(proj, mx.float32), ly, self.cfg.ssm_group_count, self.cfg.norm_eps,
                      self.states.conv[j], self.states.ssm[j], self.conv_plan, self.step_plan)

    def shared_expert(self, h: mx.array, o: mx.array, ly: Any, il: int) -> mx.array:
        # as the cpu backend: the gated FFN of h, times sigmoid(ffn_gate_inp_shexp · h) where the layer
        # has that gate (qwen35moe, qwen3next), added to o
        y = self.linear(ly.shexp_down, self.glu(self.linear(ly.shexp, h, "ffn_shexp_gate_up", il), il), "ffn_shexp", il)
        if not ly.shexp_gate:  # granitehybrid: added as it is
            return o + y
        g = self.linear(ly.shexp_gate, h, "shared_expert_gate", il)  # (T, 1)
        return o + y * (1.0 / (1.0 + mx.exp(-g)))

    def attn_gate(self, a: mx.array, qkv: mx.array, il: int) -> mx.array:
        gate = qkv[:, qkv.shape[1] - a.shape[1]:]
        return a * (1.0 / (1.0 + mx.exp(-gate)))

    def logits(self, h: mx.array) -> mx.array | None:
        """The logits of batch.logit_rows (lazy), or None when no row is wanted."""
        rows_wanted = self.batch.logit_rows
        if self.batch.hidden_rows is not None:  # embeddings: evaluated now, into the caller's array
            picked = as_dtype(h[mx.array(self.batch.hidden_rows)], mx.float32)
            self.batch.hidden[:] = np.asarray(picked)
        R = len(rows_wanted)
        if R == 0:
            return None
        rows = h if R == self.T else h[mx.array(rows_wanted)]
        logits = as_dtype(self.runner.output.matmul(as_dtype(rows, self.dt)), mx.float32)
        if self.cfg.logit_scale != 1.0:
            logits = logits * self.cfg.logit_scale
        cap = self.cfg.final_logit_softcap
        if cap > 0:
            logits = cap * mx.tanh(logits / cap)
        return logits
