"""The generic decoder's forward pass in MLX (Apple GPU, CUDA, or MLX's CPU build).

The same computation as the cpu backend (backends/cpu/transformer.py), architectures differing
only through config.flags, with MLX's quantized products over weights mapped to its affine format
(weights.py).  On the CPU device everything is float32 (K/V kept as float16, like the cpu
backend); on a GPU the products take float16 inputs while the residual stream stays float32.
Where the cpu backend reproduces llama.cpp's roundings cheaply (Q to f16 before Q·K, GELU through
f16) this does the same, so the two backends agree closely; activations are not quantized to
8 bits as the cpu kernels do, which is the main remaining difference.

MLX's CPU build evaluates on one thread and has no thread setting (two CPU streams do not run
in parallel either: measured), so n_threads is 1 there whatever was asked.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from infer.backends.base import BackendError, RunnerOptions
from infer.backends.batch import Batch
from infer.backends.cpu.ops import rope_cache

from .attention import AttentionPlan, as_dtype
from .kv_pool import KV_DTYPE, MlxKVPool
from .weights import Matrix, stack, upload


def _vec(a) -> mx.array | None:
    return None if a is None else mx.array(np.asarray(a, np.float32))


@dataclass(frozen=True, eq=False)
class _Layer:
    qkv: list[Matrix]  # one stacked matrix, or Q, K, V
    wo: Matrix
    gate_up: list[Matrix]  # one stacked matrix, or gate, up
    down: Matrix
    attn_norm: mx.array
    ffn_norm: mx.array
    post_attn_norm: mx.array | None
    post_ffn_norm: mx.array | None
    bqkv: mx.array | None  # the three biases side by side (qwen2)
    q_norm: mx.array | None
    k_norm: mx.array | None

    def arrays(self) -> list[mx.array]:
        mats = [a for m in (*self.qkv, self.wo, *self.gate_up, self.down) for a in m.arrays()]
        return mats + [a for a in vars(self).values() if isinstance(a, mx.array)]


def _products(mats: list[Matrix]) -> list[Matrix]:
    s = stack(mats)
    return mats if s is None else [s]


def _matmul(ms: list[Matrix], x: mx.array) -> mx.array:
    ys = [m.matmul(x) for m in ms]
    return ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=-1)


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


class MlxTransformer:
    """A model's weights on the MLX default device, run in batched forward passes over a paged KV pool."""

    backend = "mlx"

    def __init__(self, config, weights, options: RunnerOptions = RunnerOptions()):
        if (options.cache_type_k, options.cache_type_v) != ("f16", "f16"):
            raise BackendError("the mlx backend keeps its KV cache in f16; --cache-type-k/--cache-type-v q8_0 "
                               "run on --backend cpu or llama.cpp")
        self.cfg = config
        self.max_tokens = options.max_tokens
        self.gpu = mx.default_device().type == mx.gpu
        self.n_threads = 1  # the host thread that drives MLX (its CPU build computes on it too)
        # float16 products on a GPU; float32 on the CPU, to agree with the cpu backend
        self.dtype = mx.float16 if self.gpu else mx.float32
        half = config.n_rot // 2
        ff = weights.rope_freqs
        self.freq_factors = np.ones(half, np.float32) if ff is None else np.ascontiguousarray(ff, np.float32)

        def up(t) -> Matrix:
            try:
                return upload(t, self.dtype)
            except ValueError as e:
                raise BackendError(f"MLX backend: {e}") from None

        self.layers = []
        for lw in weights.layers:
            biases = [lw.bq, lw.bk, lw.bv]
            bqkv = None
            if any(b is not None for b in biases):
                sizes = (config.n_head * config.head_dim, config.n_head_kv * config.head_dim,
                         config.n_head_kv * config.head_dim_v)
                bqkv = mx.array(np.concatenate([np.zeros(n, np.float32) if b is None else np.asarray(b, np.float32)
                                                for b, n in zip(biases, sizes)]))
            self.layers.append(_Layer(
                qkv=_products([up(lw.wq), up(lw.wk), up(lw.wv)]), wo=up(lw.wo),
                gate_up=_products([up(lw.w_gate), up(lw.w_up)]), down=up(lw.w_down),
                attn_norm=_vec(lw.attn_norm), ffn_norm=_vec(lw.ffn_norm),
                post_attn_norm=_vec(lw.post_attn_norm), post_ffn_norm=_vec(lw.post_ffn_norm),
                bqkv=bqkv, q_norm=_vec(lw.q_norm), k_norm=_vec(lw.k_norm),
            ))
            # Evaluated layer by layer: the stacked copies replace the separate uploads at once (no
            # second copy of the model at the peak), and nothing stays lazy: a lazy array belongs to
            # this thread's stream, and the engine may run forward passes on another thread.
            mx.eval(self.layers[-1].arrays())
        self.embed = up(weights.token_embd)
        self.output = self.embed if weights.output is weights.token_embd else up(weights.output)  # tied: once
        self.output_norm = _vec(weights.output_norm)
        mx.eval(self.embed.arrays(), self.output.arrays(), self.output_norm)

    # -- the Runner protocol ------------------------------------------------------------------------

    def devices(self) -> list[str]:
        if not self.gpu:
            return [f"cpu: MLX {mx.__version__} (one thread)"]
        if mx.metal.is_available():
            info = mx.metal.device_info() if hasattr(mx.metal, "device_info") else {}
            return [f"metal: {info.get('device_name', 'Apple GPU')} (MLX {mx.__version__})"]
        return [f"cuda: MLX {mx.__version__}"]

    def bytes_per_block(self, block_size: int) -> tuple[int, ...]:
        return MlxKVPool.bytes_per_block(self.cfg, block_size)

    def new_kv_pool(self, n_blocks: list[int], block_size: int) -> MlxKVPool:
        return MlxKVPool(self.cfg, n_blocks, block_size)

    def warmup(self) -> None:
        """One token through every layer, so MLX's first-use costs are paid now."""
        bs = 16
        pool = self.new_kv_pool([1] * len(self.cfg.kv_groups), bs)
        tables = [np.zeros((1, 1), np.int32) for _ in self.cfg.kv_groups]
        self.forward_batch(Batch.single(np.zeros(1, np.int32), 0, tables, bs), pool)

    def forward_batch(self, batch: Batch, pool: MlxKVPool) -> np.ndarray:
        """One forward pass over tokens of any number of sequences (at most max_tokens tokens).

        Writes each token's K/V to its slot in pool and returns float32 logits (R, V) of
        batch.logit_rows.  On the CPU device a row's result does not depend on the rest of the batch."""
        T = len(batch.tokens)
        if not 0 < T <= self.max_tokens:
            raise ValueError(f"a forward pass takes 1 to {self.max_tokens} tokens, got {T}")
        cfg = self.cfg
        H, Hkv, D, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        nq, nk = H * D, Hkv * D
        dt = self.dtype
        eps = cfg.norm_eps
        bs = pool.block_size
        plans = [AttentionPlan(batch, g, bs, w) for g, w in enumerate(pool.windows)]
        slots = [mx.array(s) for s in batch.slots]

        def rope(base: float, scale: float) -> tuple[mx.array, mx.array]:
            # the cpu backend's angles (ggml's arithmetic), so both rotate by the same cos and sin
            c = np.empty((T, cfg.n_rot // 2), np.float32)
            s = np.empty_like(c)
            rope_cache(batch.positions, cfg.n_rot, base, scale, self.freq_factors, c, s)
            return mx.array(c)[:, None, :], mx.array(s)[:, None, :]

        ropes = [rope(cfg.rope_base, cfg.rope_scale)]
        if any(cfg.layer_swa):
            ropes.append(rope(cfg.rope_base_swa, 1.0))
        neox = cfg.flags.rope_neox
        q_scale = cfg.attn_scale if cfg.flags.prescale_q else 1.0
        kq_scale = 1.0 if cfg.flags.prescale_q else cfg.attn_scale
        gelu = cfg.flags.activation == "gelu"
        F = cfg.n_ff

        x = self.embed.take(mx.array(batch.tokens)).astype(mx.float32)
        if cfg.embed_scale != 1.0:
            x = x * cfg.embed_scale
        for il, ly in enumerate(self.layers):
            h = as_dtype(mx.fast.rms_norm(x, ly.attn_norm, eps), dt)
            qkv = as_dtype(_matmul(ly.qkv, h), mx.float32)
            if ly.bqkv is not None:
                qkv = qkv + ly.bqkv
            q = qkv[:, :nq].reshape(T, H, D)
            k = qkv[:, nq:nq + nk].reshape(T, Hkv, D)
            v = qkv[:, nq + nk:].reshape(T, Hkv, Dv)
            if ly.q_norm is not None:
                q = mx.fast.rms_norm(q, ly.q_norm, eps)
                k = mx.fast.rms_norm(k, ly.k_norm, eps)
            cos, sin = ropes[1 if cfg.layer_swa[il] else 0]
            q = apply_rope(q, cos, sin, neox)
            k = apply_rope(k, cos, sin, neox)
            if q_scale != 1.0:
                q = q * q_scale
            q = _f16_round(q)  # as the cpu backend (and llama.cpp) before Q·K
            g, j = pool.layer_at[il]
            kc, vc = pool.k[g][j], pool.v[g][j]
            kc[slots[g]] = k.astype(KV_DTYPE)  # in place: the pool's arrays now include this batch
            vc[slots[g]] = v.astype(KV_DTYPE)
            a = plans[g].attend(as_dtype(q, dt), kc, vc, kq_scale, cfg.attn_logit_softcap)
            o = as_dtype(ly.wo.matmul(as_dtype(a, dt)), mx.float32)
            if ly.post_attn_norm is not None:
                o = mx.fast.rms_norm(o, ly.post_attn_norm, eps)
            x = x + o
            h = as_dtype(mx.fast.rms_norm(x, ly.ffn_norm, eps), dt)
            gu = as_dtype(_matmul(ly.gate_up, h), mx.float32)
            gate, up = gu[:, :F], gu[:, F:]
            act = gelu_ggml(gate) if gelu else gate / (1.0 + mx.exp(-gate))
            o = as_dtype(ly.down.matmul(as_dtype(act * up, dt)), mx.float32)
            if ly.post_ffn_norm is not None:
                o = mx.fast.rms_norm(o, ly.post_ffn_norm, eps)
            x = x + o

        R = len(batch.logit_rows)
        if R == 0:  # only prefill chunks that end mid-prompt: their K/V were the point
            mx.eval(pool.arrays())
            return np.zeros((0, cfg.n_vocab), np.float32)
        rows = x if R == T else x[mx.array(batch.logit_rows)]
        h = as_dtype(mx.fast.rms_norm(rows, self.output_norm, eps), dt)
        logits = as_dtype(self.output.matmul(h), mx.float32)
        if cfg.final_logit_softcap > 0:
            cap = cfg.final_logit_softcap
            logits = cap * mx.tanh(logits / cap)
        mx.eval(logits, pool.arrays())
        return np.array(logits)
