"""A model in MLX (Apple GPU, CUDA, or MLX's CPU build): its weights uploaded, and the Runner protocol.

The forward pass is the architecture's layer recipe (models/arch/decoder.py) over this backend's
primitives (primitives.py), the same computation as the cpu backend, with MLX's quantized products
over weights mapped to its affine format (weights.py). On the CPU device everything is float32
(K/V kept as float16, like the cpu backend); on a GPU the products take float16 inputs.

MLX's CPU build evaluates on one thread and has no thread setting (two CPU streams do not run
in parallel either: measured), so n_threads is 1 there whatever was asked.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from infer.backends.base import STATE_KINDS, BackendError, RunnerOptions
from infer.backends.batch import Batch

from .kv_pool import MlxKVPool
from .primitives import MlxPrimitives
from .state_pool import MlxStatePool
from .weights import Matrix, stack, upload


def _vec(a) -> mx.array | None:
    return None if a is None else mx.array(np.asarray(a, np.float32))


@dataclass(frozen=True, eq=False)
class _Layer:
    qkv: list[Matrix]  # one stacked matrix, or Q, K, V
    wo: list[Matrix]
    gate_up: list[Matrix]  # one stacked matrix, or gate, up
    down: list[Matrix]
    attn_norm: mx.array | None
    ffn_norm: mx.array | None
    post_attn_norm: mx.array | None
    post_ffn_norm: mx.array | None
    bqkv: mx.array | None  # the three biases side by side (qwen2)
    q_norm: mx.array | None
    k_norm: mx.array | None
    router: list[Matrix]  # a mixture of experts: the router, and per expert (gate_up, down)
    experts: list
    # gpt-oss (models/weights.py), None where absent: the attention output's bias, the sink logit per
    # head, the router's bias, each expert's (gate|up biases (E, 2F), down biases (E, D))
    bo: mx.array | None = None
    sinks: mx.array | None = None
    router_bias: mx.array | None = None
    expert_biases: tuple[mx.array, mx.array] | None = None
    # the experts' selection bias (LFM2-MoE), (E,) float32 on the host, where the router's choice
    # is made (cpu's moe.route); (0,) when absent
    exp_probs_b: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    # a short-convolution layer (LFM2; models/weights.py), in place of the attention: in_proj and
    # out_proj ([] in an attention layer, which the recipe tells them apart by), the depthwise
    # kernel (L, D) f32, oldest input first (the GGUF's (D, L) transposed)
    shortconv_in: list[Matrix] = field(default_factory=list)
    shortconv_out: list[Matrix] = field(default_factory=list)
    shortconv: mx.array | None = None
    # a gated delta net layer (Qwen3.5; models/weights.py), in place of the attention: Q|K|V, z,
    # beta, alpha products side by side and ssm_out ([] in an attention layer), the convolution's
    # kernel (L, C) f32 oldest input first, dt_bias and A (Hv,), the gated norm's weight (S,)
    ssm_in: list[Matrix] = field(default_factory=list)
    ssm_out: list[Matrix] = field(default_factory=list)
    ssm_conv: mx.array | None = None
    ssm_dt: mx.array | None = None
    ssm_a: mx.array | None = None
    ssm_norm: mx.array | None = None
    # a Mamba-2 mixer (granitehybrid; mamba.py): ssm_in above is its one in-projection z|xBC|dt,
    # ssm_conv its kernel (L, C), ssm_norm the grouped norm's weight (I,); the convolution's bias
    # (C,), D per head (H,)
    ssm_conv_b: mx.array | None = None
    ssm_d: mx.array | None = None
    # a shared expert (qwen35moe, qwen3next; [] where none): its gate|up (one stacked matrix, or
    # gate, up), its down, and the (1, D) row of its sigmoid gate
    shexp: list[Matrix] = field(default_factory=list)
    shexp_down: list[Matrix] = field(default_factory=list)
    shexp_gate: list[Matrix] = field(default_factory=list)
    # multi-head latent attention (deepseek2; [] / None where none): attn_q_a, attn_q (or
    # attn_q_b), attn_kv_a_mqa; per head attn_k_b's and attn_v_b's matrix; the compressed Q's
    # and the latent's norms
    q_a: list[Matrix] = field(default_factory=list)
    q: list[Matrix] = field(default_factory=list)
    kv_a: list[Matrix] = field(default_factory=list)
    k_b: list[Matrix] = field(default_factory=list)
    v_b: list[Matrix] = field(default_factory=list)
    q_a_norm: mx.array | None = None
    kv_a_norm: mx.array | None = None
    # Gemma 4 (models/arch/gemma4.py): V is K's product (no attn_v: qkv holds Q and K alone), V
    # RMS-normed per head without a weight; the layer's output scale (1,); the per-layer
    # embedding's inp_gate, proj and post_norm ([] / None where none)
    v_from_k: bool = False
    v_norm: bool = False
    out_scale: mx.array | None = None
    ple_gate: list[Matrix] = field(default_factory=list)
    ple_proj: list[Matrix] = field(default_factory=list)
    ple_norm: mx.array | None = None
    # Gemma 4's experts beside its dense FFN (26B-A4B; None where none): the router input's scale
    # (D,), each expert's output scale (E,) f32 on the host (primitives.moe picks it per expert),
    # the experts' pre-norm and the two branches' post-norms
    router_scale: mx.array | None = None
    expert_scale: np.ndarray | None = None
    pre_ffn_norm_2: mx.array | None = None
    post_ffn_norm_1: mx.array | None = None
    post_ffn_norm_2: mx.array | None = None
    # the BERT family (models/weights.py; None where absent): the LayerNorms after the residual adds,
    # weight and bias; the FFN's biases (up's: its product is act(up), gate_up holds up alone)
    attn_out_norm: mx.array | None = None
    attn_out_norm_b: mx.array | None = None
    layer_out_norm: mx.array | None = None
    layer_out_norm_b: mx.array | None = None
    up_b: mx.array | None = None
    down_b: mx.array | None = None
    # jina-bert-v2's LayerNorms of Q and K, weight and bias, and the Q|K|V biases added before them
    q_layer_norm: mx.array | None = None
    q_layer_norm_b: mx.array | None = None
    k_layer_norm: mx.array | None = None
    k_layer_norm_b: mx.array | None = None
    qkv_b: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        experts = [m for gu, d in self.experts for m in (*gu, *d)]
        mats = [a for m in (*self.qkv, *self.wo, *self.gate_up, *self.down, *self.router, *experts,
                            *self.shortconv_in, *self.shortconv_out, *self.ssm_in, *self.ssm_out,
                            *self.shexp, *self.shexp_down, *self.shexp_gate, *self.q_a, *self.q, *self.kv_a,
                            *self.k_b, *self.v_b, *self.ple_gate, *self.ple_proj)
                for a in m.arrays()]
        return mats + [a for a in vars(self).values() if isinstance(a, mx.array)] + list(self.expert_biases or ())


def _products(mats: list[Matrix]) -> list[Matrix]:
    s = stack(mats)
    return mats if s is None else [s]


class MlxRunner:
    """A model's weights on the MLX default device, run in batched forward passes over a paged KV pool."""

    backend = "mlx"
    embeddings = True

    def __init__(self, config, weights, options: RunnerOptions = RunnerOptions()):
        if (options.cache_type_k, options.cache_type_v) != ("f16", "f16"):
            raise BackendError("the mlx backend keeps its KV cache in f16; --cache-type-k/--cache-type-v q8_0 "
                               "run on --backend cpu or llama.cpp")
        missing = set(config.state_shapes) - STATE_KINDS["mlx"]
        if missing:
            raise BackendError(f"the mlx backend does not keep {config.arch}'s recurrent state ({', '.join(sorted(missing))}) "
                               "yet (issue 34's follow-up); use --backend cpu")
        self.cfg = config
        self.max_tokens = options.max_tokens
        self.gpu = mx.default_device().type == mx.gpu
        self.n_threads = 1  # the host thread that drives MLX (its CPU build computes on it too)
        # float16 products on a GPU; float32 on the CPU, to agree with the cpu backend
        self.dtype = mx.float16 if self.gpu else mx.float32
        half = config.n_rot // 2
        ff = weights.rope_freqs
        self.freq_factors = np.ones(half, np.float32) if ff is None else np.ascontiguousarray(ff, np.float32)
        # the sliding-window layers' factors: the same, or none where only the global layers take the
        # file's (Gemma 4's proportional RoPE; their rotated dims may differ too: ModelConfig.attn_shape)
        swa = config.layer_swa.index(True) if any(config.layer_swa) else None
        self.freq_factors_swa = (np.ones(config.attn_shape(swa)[3] // 2, np.float32)
                                 if swa is not None and config.architecture.rope_freqs_global_only else self.freq_factors)

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
            dense = lw.w_up is not None
            conv = lw.shortconv_in is not None
            delta = lw.ssm_qkv is not None
            mamba = lw.ssm_in is not None
            recurrent = conv or delta or mamba  # a recurrent layer: no attention matrices
            mla = lw.kv_a is not None  # multi-head latent attention: its own matrices
            # a gated attention's gate rows after V (primitives.attn_gate reads them off the end)
            # a layer that reads an earlier layer's K/V (Gemma 4's shared-KV layers) has Q alone; one
            # whose V is K's product (Gemma 4 without attn_v: models/weights.py hands K's matrix as V)
            # has that product once
            v_from_k = lw.wv is not None and lw.wv is lw.wk
            attn = [m for m in (lw.wq, lw.wk, None if v_from_k else lw.wv, lw.attn_gate) if m is not None]
            self.layers.append(_Layer(
                qkv=[] if recurrent or mla else _products([up(t) for t in attn]),
                wo=[] if recurrent else [up(lw.wo)],
                gate_up=_products([up(w) for w in (lw.w_gate, lw.w_up) if w is not None]) if dense else [],
                down=[up(lw.w_down)] if dense else [],
                router=[up(lw.router)] if lw.router is not None else [],
                experts=[(_products([up(w) for w in (g, u) if w is not None]), [up(d)]) for g, u, d in lw.experts],
                attn_norm=_vec(lw.attn_norm), ffn_norm=_vec(lw.ffn_norm),
                post_attn_norm=_vec(lw.post_attn_norm), post_ffn_norm=_vec(lw.post_ffn_norm),
                bqkv=bqkv, q_norm=_vec(lw.q_norm), k_norm=_vec(lw.k_norm),
                bo=_vec(lw.bo), sinks=_vec(lw.sinks), router_bias=_vec(lw.router_bias),
                expert_biases=None if lw.expert_biases is None else (
                    _vec(np.concatenate(lw.expert_biases[:2], axis=1)), _vec(lw.expert_biases[2])),
                exp_probs_b=np.zeros(0, np.float32) if lw.exp_probs_b is None else np.array(lw.exp_probs_b, np.float32),
                shortconv_in=[up(lw.shortconv_in)] if conv else [],
                shortconv_out=[up(lw.shortconv_out)] if conv else [],
                shortconv=mx.array(np.ascontiguousarray(np.asarray(lw.shortconv, np.float32).T)) if conv else None,
                ssm_in=_products([up(lw.ssm_qkv), up(lw.ssm_z), up(lw.ssm_beta), up(lw.ssm_alpha)]) if delta
                else [up(lw.ssm_in)] if mamba else [],
                ssm_out=[up(lw.ssm_out)] if delta or mamba else [],
                ssm_conv=mx.array(np.ascontiguousarray(np.asarray(lw.ssm_conv, np.float32).T)) if delta or mamba
                else None,
                ssm_dt=_vec(lw.ssm_dt), ssm_a=_vec(lw.ssm_a), ssm_norm=_vec(lw.ssm_norm),
                ssm_conv_b=_vec(lw.ssm_conv_b), ssm_d=_vec(lw.ssm_d),
                shexp=_products([up(lw.shexp[0]), up(lw.shexp[1])]) if lw.shexp else [],
                shexp_down=[up(lw.shexp[2])] if lw.shexp else [],
                shexp_gate=[up(lw.shexp_gate)] if lw.shexp_gate is not None else [],
                q_a=[up(lw.q_a)] if lw.q_a is not None else [], q=[up(lw.wq)] if mla else [],
                kv_a=[up(lw.kv_a)] if mla else [], k_b=[up(w) for w in lw.k_b], v_b=[up(w) for w in lw.v_b],
                q_a_norm=_vec(lw.q_a_norm), kv_a_norm=_vec(lw.kv_a_norm),
                v_from_k=v_from_k, v_norm=lw.v_norm is not None, out_scale=_vec(lw.out_scale),
                ple_gate=[up(lw.ple_gate)] if lw.ple_gate is not None else [],
                ple_proj=[up(lw.ple_proj)] if lw.ple_proj is not None else [], ple_norm=_vec(lw.ple_norm),
                router_scale=_vec(lw.router_scale),
                expert_scale=None if lw.expert_scale is None else np.array(lw.expert_scale, np.float32),
                pre_ffn_norm_2=_vec(lw.pre_ffn_norm_2), post_ffn_norm_1=_vec(lw.post_ffn_norm_1),
                post_ffn_norm_2=_vec(lw.post_ffn_norm_2),
                attn_out_norm=_vec(lw.attn_out_norm), attn_out_norm_b=_vec(lw.attn_out_norm_b),
                layer_out_norm=_vec(lw.layer_out_norm), layer_out_norm_b=_vec(lw.layer_out_norm_b),
                up_b=_vec(lw.up_b), down_b=_vec(lw.down_b),
                q_layer_norm=_vec(lw.q_layer_norm), q_layer_norm_b=_vec(lw.q_layer_norm_b),
                k_layer_norm=_vec(lw.k_layer_norm), k_layer_norm_b=_vec(lw.k_layer_norm_b), qkv_b=_vec(lw.qkv_b),
            ))
            # Evaluated layer by layer: the stacked copies replace the separate uploads at once (no
            # second copy of the model at the peak), and nothing stays lazy: a lazy array belongs to
            # this thread's stream, and the engine may run forward passes on another thread.
            mx.eval(self.layers[-1].arrays())
        self.embed = up(weights.token_embd)
        self.output = self.embed if weights.output is weights.token_embd else up(weights.output)  # tied: once
        self.output_norm = _vec(weights.output_norm) if weights.output_norm.size else None  # none: bert
        # the BERT family's embeddings (models/weights.py): the position embeddings, token type 0's
        # row, their LayerNorm; None where none
        self.pos_embd = None if weights.pos_embd is None else mx.array(
            np.asarray(weights.pos_embd.dequantize(), np.float32).reshape(-1, config.n_embd))
        self.token_type = _vec(weights.token_type)
        self.embd_norm, self.embd_norm_b = _vec(weights.token_embd_norm), _vec(weights.token_embd_norm_b)
        self.alibi = _vec(config.alibi_slopes()) if config.architecture.alibi else None  # jina-bert-v2's slopes
        mx.eval(self.embed.arrays(), self.output.arrays(),
                [a for a in (self.output_norm, self.pos_embd, self.token_type, self.embd_norm, self.embd_norm_b)
                 if a is not None])
        # Gemma 4 E2B/E4B's per-layer token embeddings stay in the file (E2B's: 262144 tokens x 35
        # layers x 256, 2.3 billion weights, of which a batch reads a few rows): the batch's rows are
        # dequantized on the host (primitives.per_layer_inputs); their projection from the embedding
        # and its norm are on the device
        self.ple_embd = weights.ple_embd
        self.ple_model_proj = [up(weights.ple_model_proj)] if weights.ple_embd is not None else []
        self.ple_proj_norm = _vec(weights.ple_proj_norm)
        mx.eval([a for m in self.ple_model_proj for a in m.arrays()],
                [] if self.ple_proj_norm is None else self.ple_proj_norm)

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

    def state_bytes_per_seq(self) -> int:
        return MlxStatePool.bytes_per_slot(self.cfg)

    def new_state_pool(self, n_slots: int) -> MlxStatePool | None:
        return MlxStatePool(self.cfg, n_slots) if self.cfg.recurrent_layers else None

    def warmup(self) -> None:
        """One token through every layer, so MLX's first-use costs are paid now."""
        bs = 16
        pool = self.new_kv_pool([1] * len(self.cfg.kv_groups), bs)
        tables = [np.zeros((1, 1), np.int32) for _ in self.cfg.kv_groups]
        self.forward_batch(Batch.single(np.zeros(1, np.int32), 0, tables, bs), pool, self.new_state_pool(1))

    def forward_batch(self, batch: Batch, pool: MlxKVPool, states: MlxStatePool | None = None) -> np.ndarray:
        """One forward pass over tokens of any number of sequences (at most max_tokens tokens).

        Writes each token's K/V to its slot in pool and returns float32 logits (R, V) of
        batch.logit_rows; a hybrid model also reads and updates each sequence's recurrent state in
        states, at its slot batch.state_slots.  On the CPU device a row's result does not depend
        on the rest of the batch."""
        T = len(batch.tokens)
        if not 0 < T <= self.max_tokens:
            raise ValueError(f"a forward pass takes 1 to {self.max_tokens} tokens, got {T}")
        if self.cfg.recurrent_layers and (states is None or batch.state_slots is None):
            raise ValueError("a model with recurrent layers needs a state pool and the batch's state slots")
        ops = MlxPrimitives(self, batch, pool, states)
        logits = self.cfg.architecture.forward(ops, self.layers, self.output_norm)
        # evaluated now, caches and states included: nothing stays lazy (a lazy array belongs to
        # this thread's stream, and the engine may call from another thread)
        kept = pool.arrays() + (states.arrays() if states is not None else [])
        if logits is None:  # only prefill chunks that end mid-prompt: their K/V and states were the point
            mx.eval(kept)
            return np.zeros((0, self.cfg.n_vocab), np.float32)
        mx.eval(logits, kept)
        return np.array(logits)
