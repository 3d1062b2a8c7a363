"""The cpu backend's buffers: every array a forward pass writes, sized once from the model's
config (a Workspace per runner; grow makes room for a longer context). Apart from runner.py, which
prepares the weights and runs the Runner protocol over these buffers."""
from __future__ import annotations

import math

import numpy as np

from .kv_pool import kind_layers
from .matmul import MatmulWorkspace
from .target import CHUNKS_PER_THREAD


class Workspace:
    """Every buffer a forward pass writes, sized once for max_tokens tokens and n_ctx positions
    (grow: room for more positions), so that a step allocates nothing but small views."""

    def __init__(self, cfg, max_tokens: int, n_ctx: int, n_threads: int, embd_row_bytes: int, ple_row_bytes: int = 0):
        T, D, F = max_tokens, cfg.n_embd, cfg.n_ff
        f32 = np.float32
        self.max_tokens, self.n_ctx = T, n_ctx
        self.embd = np.zeros((T, embd_row_bytes), np.uint8)  # the batch's embedding rows, as stored
        self.rows = np.arange(T, dtype=np.int32)  # 0, 1, ...: embd's row of each token
        self.x = np.zeros((T, D), f32)
        self.xn = np.zeros((T, D), f32)
        # the attention's shapes: the global layers', then the sliding-window layers' where they differ
        # (Gemma 4: other head sizes and KV heads; ModelConfig.attn_shape)
        shapes = [cfg.attn_shape(il) for il in kind_layers(cfg)]
        self._scratch(cfg, T, shapes)
        for kind, (hkv, dk, dv, _) in zip(self.kinds, shapes):
            kind["qd"] = np.zeros((T, cfg.n_head * dk // 16), f32)  # Q's q8_0 scales (a q8_0 K cache)
            kind["kf"] = np.zeros((hkv, dk), f32)
            kind["vf"] = np.zeros((hkv, dv), f32)
        # RoPE's cos and sin: [0] of the global layers, [1] of the sliding-window layers (their own
        # rotated dims: Gemma 4)
        halves = [cfg.n_rot // 2, cfg.attn_shape(cfg.layer_swa.index(True))[3] // 2 if any(cfg.layer_swa) else 1]
        self.cos = [np.zeros((T, h), f32) for h in halves]
        self.sin = [np.zeros((T, h), f32) for h in halves]
        widest = max(max(cfg.n_head, hkv) * max(dk, dv) for hkv, dk, dv, _ in shapes)
        self.dxb = np.zeros(widest // 16 + 1, f32)  # quantizer scratch (q8_0 cache types)
        self.bsum = np.zeros_like(self.dxb)
        self.o = np.zeros((T, D), f32)
        self.positions = np.zeros(T, np.int32)
        # the attention temperature of every position (llama4, mistral3: ModelConfig.attn_temperature)
        # and the batch's, looked up without allocating per step
        self.temp_table = cfg.attn_temperature(np.arange(n_ctx)) if cfg.attn_temp_scale else np.zeros(0, f32)
        self.q_temp = np.zeros(T if cfg.attn_temp_scale else 0, f32)
        n_chunks = max(1, CHUNKS_PER_THREAD * n_threads)
        # attention's scratch: a row per chunk, room in each for the scores of all the query heads
        # that share a KV head (attention.py serves them together)
        self.group = max(cfg.n_head // hkv for hkv, _, _, _ in shapes)
        self.scores = np.zeros((n_chunks, self.group * n_ctx), f32)
        # MLA's heads_matmul quantizes every head's input at once: n_head of the widest
        mla_k = cfg.n_head * max(cfg.head_dim_k_mla - cfg.n_rot, cfg.n_lora_kv) if cfg.kv_v_in_k else 0
        self.mm = MatmulWorkspace(T, max(D, F, max(cfg.n_head * dv for _, _, dv, _ in shapes), cfg.ssm_inner_size,
                                         cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_embd_per_layer, mla_k), n_chunks)
        if cfg.recurrent_layers:
            self.seq_first = np.zeros(T, np.int32)  # per sequence of the batch (at most T of them)
            self.seq_count = np.zeros(T, np.int32)
        if cfg.n_expert:  # a mixture of experts (moe.py)
            self._experts(cfg, T)
        if cfg.n_embd_per_layer:  # Gemma 4's per-layer embeddings: every layer's input (its own token
            # embedding's rows as stored, the projection of the embedding, their mix) and one layer's gate
            n = cfg.n_layer * cfg.n_embd_per_layer
            self.ple_rows = np.zeros((T, ple_row_bytes), np.uint8)
            self.ple_proj = np.zeros((T, n), f32)
            self.ple = np.zeros((T, n), f32)
            self.ple_g = np.zeros((T, cfg.n_embd_per_layer), f32)
        if cfg.n_ff_shexp:  # the shared expert: gate|up, its activation, its output, its gate's logit
            Fs = cfg.n_ff_shexp
            self.sgu = np.zeros((T, 2 * Fs), f32)
            self.sact = np.zeros((T, Fs), f32)
            self.sy = np.zeros((T, D), f32)
            self.sg = np.zeros((T, 1), f32)

    def _scratch(self, cfg, T: int, shapes: list[tuple[int, int, int, int]]) -> None:
        """The mixers' and the FFN's scratch, as views of one arena (below); self.kinds: a set of
        views per kind of attention layer (shapes: their attn_shape)."""
        D, F, f32 = cfg.n_embd, cfg.n_ff, np.float32
        gate = cfg.architecture.attn_output_gate  # the gate's n_head * head_dim columns after V
        # A layer's mixer (attention, or a recurrent layer's) and its FFN never hold scratch at once:
        # the mixer ends in its output product (o) before the FFN begins. So the sets of
        # scratch below are views of one arena as large as the largest (a hybrid's 512-token batch:
        # Qwen3.5-4B's 64 MiB where they took 154), each set's buffers one after another; each kind
        # of attention layer has a set of its own (one of them runs at a time).
        attention = [{"qkv": (T, cfg.n_head * dk * (1 + gate) + hkv * (dk + dv)),
                      "q": (T, cfg.n_head, dk), "attn": (T, cfg.n_head * dv)} for hkv, dk, dv, _ in shapes]
        if cfg.kv_v_in_k:  # MLA (mla.py): the Q, compressed Q and latent products, the heads' outputs
            R, H = cfg.n_lora_kv, cfg.n_head
            attention = [{"qkv": (T, 0), "mla_qa": (T, cfg.n_lora_q), "mla_q": (T, H * cfg.head_dim_k_mla),
                          "mla_kv": (T, R + cfg.n_rot), "q": (T, H, cfg.head_dim), "attn": (T, H * R),
                          "mla_out": (T, H * cfg.head_dim_v_mla),
                          # one head's input to attn_k_b's or attn_v_b's product, made contiguous
                          "mla_x": (T, max(cfg.head_dim_k_mla - cfg.n_rot, R)),
                          # mla_post's per-token scratch: the latent, the key's RoPE part, Q's RoPE
                          # parts (flat, then by head), the cache row
                          "mla_kn": (1, R), "mla_kp": (1, cfg.n_rot), "mla_qp": (H * cfg.n_rot,),
                          "mla_qr": (H, cfg.n_rot), "mla_krow": (R + cfg.n_rot,)}]
        ffn = {"gu": (T, 2 * F), "act": (T, F)}
        recurrent: dict[str, tuple[int, ...]] = {}
        if cfg.recurrent_layers and cfg.ssm_state_size:  # Mamba-2 mixers (mamba.py: z|xBC|dt) or gated
            # delta nets (delta_net.py: Q|K|V, z, beta, alpha): in-projection, conv output, its scratch, y
            C, inner = cfg.ssm_conv_channels, cfg.ssm_inner_size
            width = inner + C + cfg.ssm_dt_rank if cfg.mamba2 else C + inner + 2 * cfg.ssm_dt_rank
            recurrent = {"ssm_in": (T, width), "ssm_xc": (T, C), "ssm_e": (T, C), "ssm_y": (T, inner)}
        elif cfg.recurrent_layers:  # short convolutions (shortconv.py): B | C | x, B * x, their output
            recurrent = {"bcx": (T, 3 * D), "bx": (T, D), "conv_y": (T, D)}
        sets = (*attention, ffn, recurrent)
        arena = np.zeros(max(sum(math.prod(shape) for shape in views.values()) for views in sets), f32)
        self.kinds: list[dict[str, np.ndarray]] = [{} for _ in attention]
        for i, views in enumerate(sets):
            at = 0
            for name, shape in views.items():
                n = math.prod(shape)
                if i < len(attention):
                    self.kinds[i][name] = arena[at:at + n].reshape(shape)
                else:
                    setattr(self, name, arena[at:at + n].reshape(shape))
                at += n

    def _experts(self, cfg, T: int) -> None:
        """A mixture of experts' buffers (moe.py): the router's output, the batch grouped by expert."""
        D, f32 = cfg.n_embd, np.float32
        E, k, Fe = cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp
        self.router = np.zeros((T, E), f32)
        self.sel = np.zeros((T, k), np.int32)
        self.wts = np.zeros((T, k), f32)
        self.probs = np.zeros(E, f32)  # one token's router probabilities
        self.starts = np.zeros(E + 1, np.int32)
        self.fill = np.zeros(E, np.int32)
        self.order = np.zeros(T * k, np.int32)
        self.ex = np.zeros((T, D), f32)  # the rows of one expert's tokens
        self.egu = np.zeros((T, 2 * Fe), f32)
        self.eact = np.zeros((T, Fe), f32)
        self.ey = np.zeros((T, D), f32)
        self.slots = np.zeros((T * k, D), f32)  # every (token, expert) output
        if cfg.architecture.shared_expert == "dense":  # Gemma 4: the dense FFN's output, the router's input
            self.mlp = np.zeros((T, D), f32)
            self.rin = np.zeros((T, D), f32)
            self.escale = np.zeros((T * k, 1), f32)  # each (token, expert) output's scale
        if cfg.architecture.moe_weight_before:  # llama4: every (token, expert) input, weighted
            self.weighed = np.zeros((T * k, D), f32)
            self.ones = np.ones((T, k), f32)  # the weights the outputs are then added with

    def grow(self, cfg, n_ctx: int) -> None:
        """Room for n_ctx positions: only the attention scores and the temperature table depend on
        the context."""
        self.n_ctx = n_ctx
        self.scores = np.zeros((self.scores.shape[0], self.group * n_ctx), np.float32)
        if self.temp_table.size:
            self.temp_table = cfg.attn_temperature(np.arange(n_ctx))
