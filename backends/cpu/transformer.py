"""The generic decoder's forward pass on the CPU.

Architectures differ only through config.flags (see infer.models.config); this module
knows nothing of files or tokenizers. All per-step buffers live in a Workspace sized
once, so a decode step allocates nothing but small views.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from infer.quant.dequant import dequant_row

from .attention import attention
from .matmul import MatmulWorkspace, qmatmul
from .ops import add_bias, add_into, gated_act, rmsnorm, rmsnorm_heads, rope, rope_cache, round_f16, softcap

DEFAULT_CHUNK = 512  # most tokens one forward call takes; longer prompts are fed in chunks


@dataclass
class KVCache:
    """Keys and values of one sequence: row p of each layer's array is position p."""

    k: list[np.ndarray]  # per layer (n_ctx, n_head_kv, head_dim) f32
    v: list[np.ndarray]  # per layer (n_ctx, n_head_kv, head_dim_v) f32

    @property
    def n_ctx(self) -> int:
        return self.k[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)


class Workspace:
    def __init__(self, cfg, max_tokens: int, n_ctx: int, max_weight_elems: int, n_threads: int):
        T, D, F = max_tokens, cfg.n_embd, cfg.n_ff
        f32 = np.float32
        self.max_tokens = T
        self.x = np.zeros((T, D), f32)
        self.xn = np.zeros((T, D), f32)
        self.q = np.zeros((T, cfg.n_head * cfg.head_dim), f32)
        self.k = np.zeros((T, cfg.n_head_kv * cfg.head_dim), f32)
        self.v = np.zeros((T, cfg.n_head_kv * cfg.head_dim_v), f32)
        self.attn = np.zeros((T, cfg.n_head * cfg.head_dim_v), f32)
        self.o = np.zeros((T, D), f32)
        self.gate = np.zeros((T, F), f32)
        self.up = np.zeros((T, F), f32)
        self.positions = np.zeros(T, np.int32)
        half = cfg.n_rot // 2
        self.cos = np.zeros((2, T, half), f32)  # [0]: global layers, [1]: sliding-window layers
        self.sin = np.zeros((2, T, half), f32)
        n_chunks = max(1, 4 * n_threads)
        self.scores = np.zeros((n_chunks, n_ctx), f32)
        self.mm = MatmulWorkspace(T, max(D, F, cfg.n_head * cfg.head_dim_v), max_weight_elems, n_chunks)


class CpuTransformer:
    """Runs a model's weights; `forward` appends tokens to a KV cache and returns logits."""

    def __init__(self, config, weights, n_threads: int | None = None, max_tokens: int = DEFAULT_CHUNK):
        self.cfg = config
        self.w = weights
        self.n_threads = n_threads or numba.config.NUMBA_NUM_THREADS
        numba.set_num_threads(self.n_threads)
        self.max_tokens = max_tokens
        half = config.n_rot // 2
        self.freq_factors = (
            np.ascontiguousarray(weights.rope_freqs, np.float32) if weights.rope_freqs is not None
            else np.ones(half, np.float32)
        )
        # Largest body weight: the dense buffer of the prefill path (the head is only used for the last rows).
        body = [t for lw in weights.layers for t in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)]
        self.max_weight_elems = max(t.raw.shape[0] * t.shape[-1] for t in body)
        self._ws: Workspace | None = None
        self.logits = np.zeros((max_tokens, config.n_vocab), np.float32)

    def new_kv_cache(self, n_ctx: int) -> KVCache:
        c = self.cfg
        return KVCache(
            k=[np.zeros((n_ctx, c.n_head_kv, c.head_dim), np.float32) for _ in range(c.n_layer)],
            v=[np.zeros((n_ctx, c.n_head_kv, c.head_dim_v), np.float32) for _ in range(c.n_layer)],
        )

    def warmup(self) -> None:
        """One token through every kernel, so compiling (or loading compiled code) happens now."""
        self.forward(np.zeros(1, np.int32), 0, self.new_kv_cache(8))

    def _workspace(self, n_ctx: int) -> Workspace:
        if self._ws is None or self._ws.scores.shape[1] < n_ctx:
            self._ws = Workspace(self.cfg, self.max_tokens, n_ctx, self.max_weight_elems, self.n_threads)
        return self._ws

    def forward(self, tokens: np.ndarray, pos0: int, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run tokens at positions pos0.. through the model, writing their K/V into cache.

        Returns logits (T, V) for every token if all_logits, else (1, V) for the last one;
        the array is a view of an internal buffer, valid until the next call.
        """
        T = len(tokens)
        if T == 0:
            raise ValueError("forward needs at least one token")
        if pos0 + T > cache.n_ctx:
            raise ValueError(f"{pos0 + T} tokens exceed the context of {cache.n_ctx}")
        if T > self.max_tokens:
            out = None
            for s in range(0, T, self.max_tokens):
                out = self.forward(tokens[s:s + self.max_tokens], pos0 + s, cache, all_logits)
                if all_logits:
                    raise ValueError("all_logits needs at most max_tokens tokens per call")
            return out
        cfg, w = self.cfg, self.w
        ws = self._workspace(cache.n_ctx)
        x, xn = ws.x[:T], ws.xn[:T]
        pos = ws.positions[:T]
        pos[:] = np.arange(pos0, pos0 + T, dtype=np.int32)

        emb = w.token_embd
        for t in range(T):
            dequant_row(emb.type_id, emb.raw[int(tokens[t])], x[t])
        if cfg.embed_scale != 1.0:
            x *= np.float32(cfg.embed_scale)

        ws_cos, ws_sin = ws.cos[:, :T], ws.sin[:, :T]
        rope_cache(pos, cfg.n_rot, cfg.rope_base, cfg.rope_scale, self.freq_factors, ws_cos[0], ws_sin[0])
        if any(cfg.layer_swa):
            rope_cache(pos, cfg.n_rot, cfg.rope_base_swa, 1.0, self.freq_factors, ws_cos[1], ws_sin[1])

        H, Hkv, hd, hdv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        q, k, v = ws.q[:T], ws.k[:T], ws.v[:T]
        q3, k3, v3 = q.reshape(T, H, hd), k.reshape(T, Hkv, hd), v.reshape(T, Hkv, hdv)
        attn = ws.attn[:T]
        attn3 = attn.reshape(T, H, hdv)
        o, gate, up = ws.o[:T], ws.gate[:T], ws.up[:T]
        eps = np.float32(cfg.norm_eps)
        gelu = cfg.flags.activation == "gelu"
        for il, lw in enumerate(w.layers):
            swa = cfg.layer_swa[il]
            rmsnorm(x, lw.attn_norm, eps, xn)
            qmatmul(lw.wq, xn, q, ws.mm)
            qmatmul(lw.wk, xn, k, ws.mm)
            qmatmul(lw.wv, xn, v, ws.mm)
            if lw.bq is not None:
                add_bias(q, lw.bq)
            if lw.bk is not None:
                add_bias(k, lw.bk)
            if lw.bv is not None:
                add_bias(v, lw.bv)
            if lw.q_norm is not None:
                rmsnorm_heads(q3, lw.q_norm, eps)
                rmsnorm_heads(k3, lw.k_norm, eps)
            r = 1 if swa else 0
            rope(q3, ws_cos[r], ws_sin[r], cfg.flags.rope_neox)
            rope(k3, ws_cos[r], ws_sin[r], cfg.flags.rope_neox)
            scale = np.float32(cfg.attn_scale)
            if cfg.flags.prescale_q:
                q *= scale
                scale = np.float32(1.0)
            round_f16(q)
            cache.k[il][pos0:pos0 + T] = k3
            cache.v[il][pos0:pos0 + T] = v3
            round_f16(cache.k[il][pos0:pos0 + T])
            round_f16(cache.v[il][pos0:pos0 + T])
            attention(q3, cache.k[il], cache.v[il], pos, cfg.sliding_window if swa else 0,
                      scale, np.float32(cfg.attn_logit_softcap), attn3, ws.scores)
            qmatmul(lw.wo, attn, o, ws.mm)
            if lw.post_attn_norm is not None:
                rmsnorm(o, lw.post_attn_norm, eps, o)
            add_into(x, o)

            rmsnorm(x, lw.ffn_norm, eps, xn)
            qmatmul(lw.w_gate, xn, gate, ws.mm)
            qmatmul(lw.w_up, xn, up, ws.mm)
            gated_act(gate, up, gelu, gate)
            qmatmul(lw.w_down, gate, o, ws.mm)
            if lw.post_ffn_norm is not None:
                rmsnorm(o, lw.post_ffn_norm, eps, o)
            add_into(x, o)

        rows = x if all_logits else x[T - 1:T]
        n = rows.shape[0]
        rmsnorm(rows, w.output_norm, eps, xn[:n])
        logits = self.logits[:n]
        qmatmul(w.output, xn[:n], logits, ws.mm)
        if cfg.final_logit_softcap > 0:
            softcap(logits, np.float32(cfg.final_logit_softcap))
        return logits
