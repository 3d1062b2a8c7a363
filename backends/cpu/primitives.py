"""The decoder's primitives (the layer recipe is models/arch/decoder.py) on the cpu backend's kernels.

Every result lands in a buffer of the runner's Workspace, sized once, so a step allocates nothing
but small views. The primitives are few, large numba calls: `attention` is two (qkv_post: the
biases, Q/K norms, RoPE and the cache write; then the attention itself); `add_norm` one (the
residual add with the post-norm and the next norm: residual_norm). At a decode step Python dispatch is a noticeable
part of the time, so fewer, larger calls pay.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from infer.backends.batch import Batch
from infer.quant.static_type import static_type

from .attention import attention
from .delta_net import delta_net
from .elementwise import (
    add_rows,
    embed,
    layer_norm,
    residual_layer_norm,
    residual_norm,
    rmsnorm,
    rope_angles,
    sigmoid_gate,
    softcap,
)
from .expert_primitives import ExpertPrimitives
from .glu import ACT_GELU_UP, ACTIVATIONS, gelu_mul, gelu_rows, glu, glu_rows
from .kv_pool import KVPool, layer_kind
from .kv_write import q_post, qkv_post
from .mamba import mamba2
from .matmul import qmatmul
from .mla import heads_matmul, mla_post, mla_prepare_q
from .moe import GATING, add_row
from .shortconv import shortconv
from .state_pool import StatePool


class CpuPrimitives(ExpertPrimitives):
    """The primitives over one runner's Workspace; `begin` points them at a batch. A mixture of
    experts' primitives (moe, shared_expert) come from its base class (expert_primitives.py)."""

    def __init__(self, runner: Any):
        cfg = runner.cfg
        arch = cfg.architecture
        # a proxy: the runner holds these primitives, and a strong reference back would keep a
        # dropped runner (and its packed weights) alive until the cycle collector runs
        self.runner, self.cfg = weakref.proxy(runner), cfg
        self.eps = np.float32(cfg.norm_eps)
        self.neox = arch.rope_neox
        self.layer_norms = arch.layer_norms
        self.glu_act = ACTIVATIONS[cfg.ffn_activation]
        # the experts' activation: their gate's, or GELU of up alone (nomic-bert-moe's)
        self.exp_act = self.glu_act if arch.ffn_gated else ACT_GELU_UP
        self.gating = GATING[cfg.moe_gating]
        # a gated delta net's value heads per key head in a row (delta_net.py's k_repeat)
        self.k_repeat = cfg.ssm_dt_rank // cfg.ssm_group_count if arch.ssm_v_heads_grouped else 1
        # Q times the attention scale before Q·K (prescale_q), or the product times it after
        self.q_scale = np.float32(cfg.attn_scale if arch.prescale_q else 1.0)
        self.kq_scale = np.float32(1.0 if arch.prescale_q else cfg.attn_scale)
        self.attn_softcap = np.float32(cfg.attn_logit_softcap)
        self.residual_scale = np.float32(cfg.residual_scale)
        self.any_swa = any(cfg.layer_swa)
        # llama4's L2 norm of Q and K (cfg.kq_l2_norm): an RMSNorm of weight 1 after RoPE
        self.l2_norm = np.ones(cfg.head_dim if cfg.kq_l2_norm else 0, np.float32)
        # per layer: which of the workspace's kinds of attention scratch it uses (kv_pool.layer_kind)
        self.kind = [layer_kind(cfg, il) for il in range(cfg.n_layer)]
        # RoPE frequency factors of the sliding-window layers where only the global ones take the
        # file's (Gemma 4's proportional RoPE): none
        self.swa_ff = (np.ones(cfg.attn_shape(cfg.layer_swa.index(True))[3] // 2, np.float32)
                       if arch.rope_freqs_global_only and self.any_swa else None)
        # Gemma 4's router input: RMSNorm without a weight (a weight of ones), then its own scales
        self.ones = np.ones(cfg.n_embd if arch.shared_expert == "dense" else 0, np.float32)
        self.trace: Callable[[str, np.ndarray], None] | None = None
        self.causal = np.zeros(0, np.int32)  # the attention kernel's seq_last of a causal model

    def begin(self, batch: Batch, pool: KVPool, ws: Any, states: StatePool | None = None) -> None:
        """Point the primitives at a batch: its buffers (views of ws) and its RoPE angles; states:
        the recurrent state pool of a hybrid model's sequences."""
        cfg = self.cfg
        T = len(batch.tokens)
        self.batch, self.pool, self.ws, self.T, self.states = batch, pool, ws, T, states
        self.x, self.xn = ws.x[:T], ws.xn[:T]
        # each kind of attention layer's scratch (Q|K|V products, Q, its q8_0 scales, the output)
        self.kinds = [{name: a[:T] for name, a in kind.items() if name not in ("kf", "vf")} for kind in ws.kinds]
        self.out = {"per_layer_proj": ws.o[:T], "attn_wo": ws.o[:T], "ffn_gate_up": ws.gu[:T], "ffn_out": ws.o[:T],
                    # an FFN without a gate (bert): up's product, activated in place, and down's before its bias
                    "ffn_up": ws.act[:T], "ffn_down": ws.o[:T]}
        if cfg.n_expert and cfg.architecture.shared_expert == "dense":  # Gemma 4's dense FFN beside the experts
            self.out["ffn_mlp_down"] = ws.mlp[:T]
        if cfg.recurrent_layers and cfg.mamba2:
            self.out.update(ssm_in=ws.ssm_in[:T], mamba_out=ws.o[:T])
        elif cfg.recurrent_layers and cfg.ssm_state_size:
            self.out.update(ssm_in=ws.ssm_in[:T], linear_attn_out=ws.o[:T])
        elif cfg.recurrent_layers:
            self.out.update(shortconv_in_proj=ws.bcx[:T], shortconv_out_proj=ws.o[:T])
        if cfg.kv_v_in_k:  # MLA's products land in its kind's scratch (Workspace)
            mla = self.kinds[0]
            self.out.update(q_a=mla["mla_qa"], q=mla["mla_q"], kv_cmpr_pe=mla["mla_kv"])
        self.cos, self.sin = [c[:T] for c in ws.cos], [s[:T] for s in ws.sin]
        ff = self.runner.freq_factors
        if cfg.rope:  # else no layer rotates (cfg.layer_rope: granitehybrid's NoPE)
            rope_angles(cfg, batch.positions, False, ff, self.cos[0], self.sin[0])
            if self.any_swa:
                rope_angles(cfg, batch.positions, True, ff if self.swa_ff is None else self.swa_ff, self.cos[1],
                            self.sin[1])
        self.prompt_end = batch.prompt_ends()
        # non-causal attention (an encoder): each table row's last position this step, the end of
        # the keys its queries see; (0,): causal (the attention kernel's seq_last)
        self.seq_last = self.causal if cfg.causal else batch.seq_last()
        # the attention temperature per token, for the layers that take it (cfg.layer_attn_temp)
        self.q_temp = ws.q_temp[:T] if cfg.attn_temp_scale else ws.q_temp
        if cfg.attn_temp_scale:  # positions are below n_ctx (the pool's): clip only spares take a buffer
            np.take(ws.temp_table, batch.positions, out=self.q_temp, mode="clip")
        self.trace = self.runner.trace

    def _seen(self, name: str, il: int, a: np.ndarray) -> None:
        """The tracer's view of an intermediate, under llama.cpp's name ("attn_norm-0"; il -1: none)."""
        self.trace(name if il < 0 else f"{name}-{il}", a)

    def _seen_heads(self, name: str, il: int, a: np.ndarray) -> None:
        """The tracer's view of a (T, H, n) intermediate that llama.cpp keeps head by head ((H * T,
        n), head-major: MLA's per-head products), and what the tracer left in it put back (a
        tracer may replace what it sees: scripts/compare_llamacpp.py --force)."""
        T, H, n = a.shape
        heads = np.ascontiguousarray(a.transpose(1, 0, 2)).reshape(H * T, n)
        self._seen(name, il, heads)
        a[:] = heads.reshape(H, T, n).transpose(1, 0, 2)

    # -- the primitives (models/arch/decoder.py) -------------------------------------------------------

    def embed(self, name: str) -> np.ndarray:
        T, ws = self.T, self.ws
        self.runner.embd_rows.gather(self.batch.tokens, ws.embd)  # read, not mapped (rows.py)
        embed(static_type(self.runner.token_embd.type_id), ws.embd, ws.rows[:T], np.float32(self.cfg.embed_scale),
              self.x)
        if self.cfg.architecture.bert_norms:  # token type 0's row, the positions' embeddings, the norm
            r = self.runner
            add_rows(self.x, r.pos_embd, self.batch.positions, r.token_type)
            if self.trace is not None:
                self._seen("inp_embd", -1, self.x)
            residual_layer_norm(self.x, self.x[:0], r.embd_norm, r.embd_norm_b, self.eps)
            name = "inp_norm"
        elif self.layer_norms:  # modern-bert: the embeddings' LayerNorm without a bias
            if self.trace is not None:
                self._seen("inp_embd", -1, self.x)
            layer_norm(self.x, self.runner.embd_norm, self.runner.embd_norm_b, self.eps, self.x)
            name = "inp_norm"
        if self.trace is not None:
            self._seen(name, -1, self.x)
        return self.x

    def add_layer_norm(self, x: np.ndarray, o: np.ndarray, w: np.ndarray, b: np.ndarray, name: str,
                       il: int, w2: np.ndarray | None = None, b2: np.ndarray | None = None) -> np.ndarray:
        if w2 is not None and w2.shape[0]:  # o = LayerNorm(o + x), x kept; then x = LayerNorm(x + o)
            residual_layer_norm(o, x, w, b, self.eps)
            w, b = w2, b2
        residual_layer_norm(x, o, w, b, self.eps)
        if self.trace is not None:
            self._seen(name, il, x)
        return x

    def qk_layer_norm(self, qkv: np.ndarray, ly: Any, il: int) -> np.ndarray:
        if not ly.qkv_b.shape[0]:
            return qkv
        add_row(qkv, ly.qkv_b)
        nq, nk = self.cfg.n_head * self.cfg.head_dim, self.cfg.n_head_kv * self.cfg.head_dim
        for w, b, cols in ((ly.q_layer_norm, ly.q_layer_norm_b, qkv[:, :nq]),
                           (ly.k_layer_norm, ly.k_layer_norm_b, qkv[:, nq:nq + nk])):
            if w.shape[0]:
                residual_layer_norm(cols, cols[:0], w, b, self.eps)
        if self.trace is not None:
            self._seen("qkv_normed", il, qkv)
        return qkv

    def act(self, y: np.ndarray, il: int) -> np.ndarray:
        gelu_rows(y)
        if self.trace is not None:
            self._seen("ffn_act", il, y)
        return y

    def norm(self, x: np.ndarray, w: np.ndarray, name: str, il: int) -> np.ndarray:
        if w.shape[0] and self.layer_norms:  # modern-bert's LayerNorm without a bias
            layer_norm(x, w, w[:0], self.eps, self.xn)
        elif w.shape[0]:
            rmsnorm(x, w, self.eps, self.xn)
        else:  # no norm (olmo2): the input as it is
            self.xn[:] = x
        if self.trace is not None:
            self._seen(name, il, self.xn)
        return self.xn

    def linear(self, ws: list, h: np.ndarray, name: str, il: int) -> np.ndarray:
        if name == "qkv":
            out = self.kinds[self.kind[il]]["qkv"]
        elif name == "ffn_gate_up" and self.cfg.n_ff_layers:  # this layer's width (Gemma 4 E2B's differ)
            F = self.cfg.layer_n_ff(il)
            out = self.ws.gu.reshape(-1)[:self.T * 2 * F].reshape(self.T, 2 * F)
        else:
            out = self.out[name]
        mm = self.ws.mm
        for w, col in ws:
            qmatmul(w, h, out, mm, col)
        if self.trace is not None:
            self._seen(name, il, out)
        return out

    def attention(self, qkv: np.ndarray, ly: Any, il: int) -> np.ndarray:
        cfg, ws, batch, pool, T, r = self.cfg, self.ws, self.batch, self.pool, self.T, self.runner
        rope = 1 if cfg.layer_swa[il] else 0
        g, kc, vc = pool.layer(il)
        kind = self.kind[il]
        q3, qd, attn = self.kinds[kind]["q"], self.kinds[kind]["qd"], self.kinds[kind]["attn"]
        rot_k, rot_v = r.rot_k[kind], r.rot_v[kind]
        rot = cfg.layer_rope(il)
        l2 = rot and self.l2_norm.shape[0] > 0  # llama4: the L2 norm on the layers with RoPE
        q_norm, k_norm = (self.l2_norm, self.l2_norm) if l2 else (ly.q_norm, ly.k_norm)
        q_temp = self.q_temp if cfg.layer_attn_temp(il) else self.q_temp[:0]
        if cfg.kv_source(il) == il:
            qkv_post(qkv, ly.bq, ly.bk, ly.bv, q_norm, k_norm, ly.v_norm, self.eps, self.cos[rope], self.sin[rope], rot,
                     l2, self.neox, self.q_scale, q_temp, q3, qd, kc, vc, batch.slots[g], ws.kinds[kind]["kf"],
                     ws.kinds[kind]["vf"], ws.dxb, ws.bsum, rot_k, rot_v)
        else:  # a layer that attends over an earlier layer's K/V (Gemma 4's shared-KV layers): Q alone
            q_post(qkv, ly.bq, q_norm, self.eps, self.cos[rope], self.sin[rope], rot, l2, self.neox, self.q_scale,
                   q_temp, q3, qd, kc, ws.bsum, rot_k)
        attention(q3, qd, kc, vc, batch.tables[g], batch.tok_seq, batch.positions, self.prompt_end, self.seq_last,
                  pool.block_size, pool.windows[g], pool.chunked[g], self.kq_scale, self.attn_softcap, ly.sinks,
                  self.runner.alibi, rot_v,
                  attn.reshape(T, cfg.n_head, attn.shape[1] // cfg.n_head), ws.scores)
        if self.trace is not None:
            self._seen("kqv_out", il, attn)
        return attn

    def rms_norm(self, y: np.ndarray, w: np.ndarray, name: str, il: int) -> np.ndarray:
        rmsnorm(y, w, self.eps, y)
        if self.trace is not None:
            self._seen(name, il, y)
        return y

    def mla_attention(self, q: np.ndarray, kv: np.ndarray, ly: Any, il: int) -> np.ndarray:
        """MLA (mla.py): the cache row and Q's RoPE'd parts, each head's nope Q through attn_k_b
        into Q's latent columns, attention over the latent cache (V: K's leading latent), each
        head's output through attn_v_b."""
        cfg, ws, batch, pool, T = self.cfg, self.ws, self.batch, self.pool, self.T
        H, R, n_rot, dq, dv = cfg.n_head, cfg.n_lora_kv, cfg.n_rot, cfg.head_dim_k_mla, cfg.head_dim_v_mla
        nope = dq - n_rot
        g, kc, _ = pool.layer(il)
        scratch = self.kinds[0]  # MLA's layers are all of one kind
        q3, qd = scratch["q"], scratch["qd"]
        rows = ws.kinds[0]  # mla_post's per-token scratch, whole (self.kinds' views are cut to T rows)
        mla_post(q, kv, ly.kv_a_norm, self.eps, self.cos[0], self.sin[0], q3, rows["mla_kn"], rows["mla_kp"],
                 rows["mla_qp"], rows["mla_qr"], rows["mla_krow"], kc, batch.slots[g], ws.dxb, ws.bsum)
        q2 = q3.reshape(T, H * cfg.head_dim)
        x = scratch["mla_x"].reshape(-1)  # flat: a head's (T, K) input is its first T * K
        self._heads(ly.k_b, ly.k_b_heads, q, dq, nope, x, q2, cfg.head_dim)  # q_nope_absorbed: head h's first R columns
        if self.trace is not None:
            self._seen_heads("q_nope_absorbed", il, q3[:, :, :R])
        mla_prepare_q(q3, qd, ws.bsum, kc)
        lat = scratch["attn"].reshape(T, H, R)
        attention(q3, qd, kc, kc, batch.tables[g], batch.tok_seq, batch.positions, self.prompt_end, self.seq_last,
                  pool.block_size, pool.windows[g], pool.chunked[g], self.kq_scale, self.attn_softcap, ly.sinks,
                  self.runner.alibi, 0, lat, ws.scores)
        if self.trace is not None:
            self._seen_heads("kqv", il, lat)
        out = scratch["mla_out"]
        self._heads(ly.v_b, ly.v_b_heads, scratch["attn"], R, R, x, out, dv)  # kqv_mla: back to value_length_mla
        if self.trace is not None:
            self._seen("kqv_out", il, out)
        return out

    def _heads(self, heads: list, packed: Any, src: np.ndarray, in_stride: int, K: int, x: np.ndarray,
               out: np.ndarray, out_stride: int) -> None:
        """out[:, h * out_stride:][:N] = src[:, h * in_stride:][:K] @ heads[h].T for every head: one
        parallel loop where the heads are packed alike (mla.heads_matmul), else head by head."""
        T, mm = self.T, self.ws.mm
        if packed is not None:
            xq = mm.xi if packed.weights[0].int_kernel else mm.xq
            heads_matmul(src, in_stride, K, *packed.planes, *packed.info, xq, mm.dxb, mm.bsum, mm.acc, mm.expanded,
                         x, out, out_stride)
            return
        xs = x[:T * K].reshape(T, K)
        for h, w in enumerate(heads):
            np.copyto(xs, src[:, h * in_stride:h * in_stride + K])
            qmatmul(w, xs, out, mm, h * out_stride)

    def shortconv(self, bcx: np.ndarray, ly: Any, il: int) -> np.ndarray:
        ws, T, batch = self.ws, self.T, self.batch
        y = ws.conv_y[:T]
        shortconv(bcx, ly.shortconv, self.states.layer(il), batch.state_slots, batch.tok_seq, batch.positions,
                  ws.seq_first, ws.seq_count, ws.bx[:T], y)
        if self.trace is not None:
            self._seen("shortconv_y", il, y)
        return y

    def delta_net(self, proj: np.ndarray, ly: Any, il: int) -> np.ndarray:
        cfg, ws, T, batch = self.cfg, self.ws, self.T, self.batch
        y = ws.ssm_y[:T]
        delta_net(proj, ly.ssm_conv, ly.ssm_dt, ly.ssm_a, ly.ssm_norm, self.eps, cfg.ssm_group_count, self.k_repeat,
                  self.states.layer(il, "conv"), self.states.layer(il, "delta"), batch.state_slots, batch.tok_seq,
                  batch.positions, ws.seq_first, ws.seq_count, ws.ssm_xc[:T], ws.ssm_e[:T], y)
        if self.trace is not None:
            self._seen("final_output", il, y)
        return y

    def mamba2(self, proj: np.ndarray, ly: Any, il: int) -> np.ndarray:
        cfg, ws, T, batch = self.cfg, self.ws, self.T, self.batch
        y = ws.ssm_y[:T]
        mamba2(proj, ly.ssm_conv, ly.ssm_conv_b, ly.ssm_dt, ly.ssm_a, ly.ssm_d, ly.ssm_norm, self.eps,
               cfg.ssm_group_count, self.states.layer(il, "conv"), self.states.layer(il, "ssm"), batch.state_slots,
               batch.tok_seq, batch.positions, ws.seq_first, ws.seq_count, ws.ssm_xc[:T], ws.ssm_e[:T], y)
        if self.trace is not None:
            self._seen("mamba2_y_norm", il, y)
        return y

    def attn_gate(self, a: np.ndarray, qkv: np.ndarray, il: int) -> np.ndarray:
        nq = a.shape[1]
        sigmoid_gate(a, qkv[:, qkv.shape[1] - nq:])
        if self.trace is not None:
            self._seen("attn_gated", il, a)
        return a

    def bias(self, y: np.ndarray, b: np.ndarray, name: str, il: int) -> np.ndarray:
        if b.shape[0]:
            add_row(y, b)
        if self.trace is not None:
            self._seen(name, il, y)
        return y

    def add_norm(self, x: np.ndarray, o: np.ndarray, post: np.ndarray, w: np.ndarray | None, il: int, name: str,
                 next_name: str, next_il: int) -> tuple[np.ndarray, np.ndarray]:
        if self.layer_norms:  # modern-bert: x + o (ggml_add), then the next LayerNorm (no post-norm, no scale)
            np.add(x, o, out=x)
            if self.trace is not None:
                self._seen(name, il, x)
            return x, self.norm(x, post[:0] if w is None else w, next_name, next_il)
        residual_norm(x, o, post, self.eps, self.residual_scale, post[:0] if w is None else w, self.xn)
        if self.trace is not None:
            self._seen(name, il, x)
            self._seen(next_name, next_il, self.xn)
        return x, self.xn

    def per_layer_inputs(self, x: np.ndarray) -> None:
        """Gemma 4's per-layer inputs of the batch (ws.ple, (T, n_layer * P)), from x the scaled token
        embeddings: (RMSNorm(per_layer_model_proj · x / sqrt(D)) per layer + the token's own
        per_layer_token_embd rows * sqrt(P)) / sqrt(2), as llama.cpp's project_per_layer_inputs."""
        cfg, ws, T, r = self.cfg, self.ws, self.T, self.runner
        P, f32 = cfg.n_embd_per_layer, np.float32
        proj, ple = ws.ple_proj[:T], ws.ple[:T]
        r.ple_rows.gather(self.batch.tokens, ws.ple_rows)
        # the scales as llama.cpp's float arithmetic forms them: sqrtf(P), 1.0f / sqrtf(n_embd), 1.0f / sqrtf(2)
        embed(static_type(r.ple_embd.type_id), ws.ple_rows, ws.rows[:T], np.sqrt(f32(P)), ple)
        for w, col in r.ple_model_proj:
            qmatmul(w, x, proj, ws.mm, col)
        proj *= f32(1.0) / np.sqrt(f32(cfg.n_embd))
        normed = proj.reshape(T * cfg.n_layer, P)
        rmsnorm(normed, r.ple_proj_norm, self.eps, normed)
        ple += proj
        ple *= f32(1.0) / np.sqrt(f32(2.0))
        if self.trace is not None:
            self._seen("inp_per_layer", -1, ple)

    def per_layer_gate(self, x: np.ndarray, ly: Any, il: int) -> np.ndarray:
        """GELU(inp_gate · x) times the layer's per-layer input (T, P)."""
        cfg, ws, T = self.cfg, self.ws, self.T
        g = ws.ple_g[:T]
        for w, col in ly.ple_gate:
            qmatmul(w, x, g, ws.mm, col)
        P = cfg.n_embd_per_layer
        gelu_mul(g, ws.ple[:T, il * P:(il + 1) * P])
        return g

    def add_scale_norm(self, x: np.ndarray, o: np.ndarray, post: np.ndarray, s: np.ndarray, w: np.ndarray, il: int,
                       next_name: str, next_il: int) -> tuple[np.ndarray, np.ndarray]:
        if not s.shape[0]:
            return self.add_norm(x, o, post, w, il, "l_out", next_name, next_il)
        residual_norm(x, o, post, self.eps, self.residual_scale, s[:0], self.xn)
        x *= s[0]  # float32 times float32, as ggml_mul by the (1,) tensor
        if self.trace is not None:
            self._seen("l_out", il, x)
        return x, self.norm(x, w, next_name, next_il)

    def glu(self, gu: np.ndarray, il: int) -> np.ndarray:
        F = self.cfg.layer_n_ff(il)
        act = self.ws.act.reshape(-1)[:self.T * F].reshape(self.T, F)
        (glu_rows if self.T > 1 else glu)(gu, F, self.glu_act, act)
        if self.trace is not None:
            self._seen("ffn_act", il, act)  # llama.cpp: ffn_geglu / ffn_swiglu
        return act

    def logits(self, h: np.ndarray) -> np.ndarray:
        """The logits of batch.logit_rows, (R, V): a view of the runner's buffer."""
        cfg, runner, rows_wanted = self.cfg, self.runner, self.batch.logit_rows
        if self.batch.hidden_rows is not None:  # embeddings: before x (spent) is reused below
            np.take(h, self.batch.hidden_rows, axis=0, out=self.batch.hidden)
        R = len(rows_wanted)
        if R == 0 or runner.output is None:  # only prefill chunks that end mid-prompt (their K/V were
            return runner.logits[:0]  # the point), or an encoder's pass (no logits: its hidden rows)
        if R == self.T:  # every token's logits (rows are ascending, so in order)
            rows = h
        else:
            rows = self.ws.x[:R]  # x is spent: gather the wanted rows into it
            np.take(h, rows_wanted, axis=0, out=rows)
        logits = runner.logits[:R]
        qmatmul(runner.output, rows, logits, self.ws.mm)
        if cfg.logit_scale != 1.0:
            logits *= np.float32(cfg.logit_scale)
        if cfg.final_logit_softcap > 0:
            softcap(logits, np.float32(cfg.final_logit_softcap))
        return logits

