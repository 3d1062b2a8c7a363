"""The generic decoder's forward pass on the CPU.

Architectures differ only through config.flags (see infer.models.config); this module
knows nothing of files or tokenizers. All per-step buffers live in a Workspace sized
once, so a decode step allocates nothing but small views.

Each layer is a handful of numba calls: the Q/K/V products (one matrix when the three weights
can be stacked, see repack.py), one call for what follows them up to the cache write, the
attention, the output product, one call for residual + norm, the gate/up products (stacked
likewise), the activation, the down product and residual + the next norm.  At a decode step
Python dispatch is a noticeable part of the time, so fewer, larger calls pay.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from .attention import attention
from .matmul import MatmulWorkspace, qmatmul
from .ops import embed, glu, qkv_post, residual_norm, rmsnorm, rope_cache, softcap
from .repack import GROUP, pack_stacked

DEFAULT_CHUNK = 512  # most tokens one forward call takes; longer prompts are fed in chunks
_NONE = np.zeros(0, np.float32)  # an absent bias or norm weight


@dataclass
class KVCache:
    """Keys and values of one sequence: row p of each layer's array is position p."""

    k: list[np.ndarray]  # per layer (n_ctx, n_head_kv, head_dim) uint16: f16 bits, as llama.cpp keeps them
    v: list[np.ndarray]  # per layer (n_ctx, n_head_kv, head_dim_v) uint16

    @property
    def n_ctx(self) -> int:
        return self.k[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)


def _pack(w):
    """The repacked form of a QTensor, or the QTensor itself for types kept as they are."""
    return pack_stacked((w,)) or w


def _products(*ws) -> list[tuple[object, int]]:
    """(weight, first output column) pairs computing the weights' products side by side: one
    stacked packed matrix if possible, else each weight (packed, or kept as it is) on its own."""
    stacked = pack_stacked(ws)
    if stacked is not None:
        return [(stacked, 0)]
    out, col = [], 0
    for w in ws:
        out.append((_pack(w), col))
        col += w.raw.shape[0]
    return out


def _vec(a) -> np.ndarray:
    return _NONE if a is None else np.ascontiguousarray(a, np.float32)


@dataclass
class _Layer:
    """One layer's weights as the forward pass uses them, prepared once."""

    qkv: list  # products into Workspace.qkv
    wo: object
    gate_up: list  # products into Workspace.gu
    down: object
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    post_attn_norm: np.ndarray  # (0,) when absent
    post_ffn_norm: np.ndarray
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray

    @classmethod
    def prepare(cls, lw) -> "_Layer":
        return cls(
            qkv=_products(lw.wq, lw.wk, lw.wv), wo=_pack(lw.wo),
            gate_up=_products(lw.w_gate, lw.w_up), down=_pack(lw.w_down),
            attn_norm=_vec(lw.attn_norm), ffn_norm=_vec(lw.ffn_norm),
            post_attn_norm=_vec(lw.post_attn_norm), post_ffn_norm=_vec(lw.post_ffn_norm),
            bq=_vec(lw.bq), bk=_vec(lw.bk), bv=_vec(lw.bv), q_norm=_vec(lw.q_norm), k_norm=_vec(lw.k_norm),
        )


class Workspace:
    def __init__(self, cfg, max_tokens: int, n_ctx: int, max_weight_elems: int, n_threads: int):
        T, D, F = max_tokens, cfg.n_embd, cfg.n_ff
        f32 = np.float32
        self.max_tokens, self.n_ctx = T, n_ctx
        self.x = np.zeros((T, D), f32)
        self.xn = np.zeros((T, D), f32)
        nq, nk, nv = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
        self.qkv = np.zeros((T, nq + nk + nv), f32)
        self.q = np.zeros((T, cfg.n_head, cfg.head_dim), f32)
        self.kf = np.zeros((cfg.n_head_kv, cfg.head_dim), f32)
        self.vf = np.zeros((cfg.n_head_kv, cfg.head_dim_v), f32)
        self.attn = np.zeros((T, cfg.n_head * cfg.head_dim_v), f32)
        self.o = np.zeros((T, D), f32)
        self.gu = np.zeros((T, 2 * F), f32)
        self.act = np.zeros((T, F), f32)
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
        # Weights repacked once for the matrix kernels; this runner owns the copies.
        self.layers = [_Layer.prepare(lw) for lw in weights.layers]
        self.output = _pack(weights.output)
        self.output_norm = _vec(weights.output_norm)
        # Largest float (unpacked) body weight: the dense buffer of their prefill path.
        body = [t for lw in weights.layers for t in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)]
        self.max_weight_elems = max([t.raw.shape[0] * t.shape[-1] for t in body if t.type_id not in GROUP], default=0)
        self._ws: Workspace | None = None
        self.logits = np.zeros((max_tokens, config.n_vocab), np.float32)

    def new_kv_cache(self, n_ctx: int) -> KVCache:
        c = self.cfg
        return KVCache(
            k=[np.zeros((n_ctx, c.n_head_kv, c.head_dim), np.uint16) for _ in range(c.n_layer)],
            v=[np.zeros((n_ctx, c.n_head_kv, c.head_dim_v), np.uint16) for _ in range(c.n_layer)],
        )

    def warmup(self) -> None:
        """One token through every kernel, so compiling (or loading compiled code) happens now."""
        self.forward(np.zeros(1, np.int32), 0, self.new_kv_cache(8))

    def _workspace(self, n_ctx: int) -> Workspace:
        if self._ws is None or self._ws.n_ctx < n_ctx:
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
        cfg = self.cfg
        ws = self._workspace(cache.n_ctx)
        mm = ws.mm
        x, xn = ws.x[:T], ws.xn[:T]
        pos = ws.positions[:T]
        pos[:] = np.arange(pos0, pos0 + T, dtype=np.int32)

        emb = self.w.token_embd
        embed(emb.type_id, emb.raw, np.ascontiguousarray(tokens, np.int32), np.float32(cfg.embed_scale), x)

        ws_cos, ws_sin = ws.cos[:, :T], ws.sin[:, :T]
        rope_cache(pos, cfg.n_rot, cfg.rope_base, cfg.rope_scale, self.freq_factors, ws_cos[0], ws_sin[0])
        if any(cfg.layer_swa):
            rope_cache(pos, cfg.n_rot, cfg.rope_base_swa, 1.0, self.freq_factors, ws_cos[1], ws_sin[1])

        qkv, q3, attn, o, gu, act = ws.qkv[:T], ws.q[:T], ws.attn[:T], ws.o[:T], ws.gu[:T], ws.act[:T]
        attn3 = attn.reshape(T, cfg.n_head, cfg.head_dim_v)
        eps = np.float32(cfg.norm_eps)
        gelu = cfg.flags.activation == "gelu"
        neox = cfg.flags.rope_neox
        q_scale = np.float32(cfg.attn_scale) if cfg.flags.prescale_q else np.float32(1.0)
        kq_scale = np.float32(1.0) if cfg.flags.prescale_q else np.float32(cfg.attn_scale)
        softcap_attn = np.float32(cfg.attn_logit_softcap)
        n_ff = cfg.n_ff
        layers = self.layers
        rmsnorm(x, layers[0].attn_norm, eps, xn)
        for il, ly in enumerate(layers):
            r = 1 if cfg.layer_swa[il] else 0
            for w, col in ly.qkv:
                qmatmul(w, xn, qkv, mm, col)
            kc, vc = cache.k[il][pos0:pos0 + T], cache.v[il][pos0:pos0 + T]
            qkv_post(qkv, ly.bq, ly.bk, ly.bv, ly.q_norm, ly.k_norm, eps, ws_cos[r], ws_sin[r], neox, q_scale,
                     q3, kc, vc, ws.kf, ws.vf)
            attention(q3, cache.k[il], cache.v[il], pos, cfg.sliding_window if r else 0,
                      kq_scale, softcap_attn, attn3, ws.scores)
            qmatmul(ly.wo, attn, o, mm)
            residual_norm(x, o, ly.post_attn_norm, eps, ly.ffn_norm, xn)
            for w, col in ly.gate_up:
                qmatmul(w, xn, gu, mm, col)
            glu(gu, n_ff, gelu, act)
            qmatmul(ly.down, act, o, mm)
            nxt = layers[il + 1].attn_norm if il + 1 < len(layers) else self.output_norm
            residual_norm(x, o, ly.post_ffn_norm, eps, nxt, xn)

        rows = xn if all_logits else xn[T - 1:T]
        logits = self.logits[:rows.shape[0]]
        qmatmul(self.output, rows, logits, mm)
        if cfg.final_logit_softcap > 0:
            softcap(logits, np.float32(cfg.final_logit_softcap))
        return logits
