"""The cpu backend's mixture-of-experts primitives (the decoder's `moe` and `shared_expert`) on
moe.py's kernels. Apart from primitives.py, whose CpuPrimitives takes them as a base class: they
read the state CpuPrimitives keeps (cfg, the Workspace ws, the batch's T, the activations, the
gating, eps, ones, the tracer)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .elementwise import rmsnorm
from .glu import glu, glu_rows
from .matmul import qmatmul
from .moe import (
    add_gated,
    add_row,
    combine,
    experts_ffn,
    gather_tokens,
    group,
    route,
    scatter_slots,
    weigh_inputs,
)


class ExpertPrimitives:
    """The primitives of a mixture of experts, over the state of the CpuPrimitives they are part of."""

    def moe(self, h: np.ndarray, ly: Any, il: int, r: np.ndarray | None = None) -> np.ndarray:
        """The mixture of experts (moe.py): each expert the batch uses runs once, on its tokens."""
        cfg, ws, T, mm = self.cfg, self.ws, self.T, self.ws.mm
        k = cfg.n_expert_used
        logits, sel, wts = ws.router[:T], ws.sel[:T], ws.wts[:T]
        if r is not None:  # Gemma 4: RMSNorm(r) times 1 / sqrt(n_embd), times ffn_gate_inp.scale, as gemma4.cpp
            rin = ws.rin[:T]
            rmsnorm(r, self.ones, self.eps, rin)
            rin *= np.float32(1.0) / np.sqrt(np.float32(cfg.n_embd))
            rin *= ly.router_scale
            h_router = rin
        else:
            h_router = h
        for w, col in ly.router:
            qmatmul(w, h_router, logits, mm, col)
        add_row(logits, ly.router_bias)
        route(logits, k, cfg.moe_norm_weights, cfg.moe_weights_scale, self.gating, ly.exp_probs_b, sel, wts, ws.probs)
        group(sel, ws.starts, ws.order[:T * k], ws.fill)
        x, per = h, k  # the experts' inputs: slot t * k + j reads row (t * k + j) // per
        if cfg.architecture.moe_weight_before:  # llama4: each slot's own weighted input, outputs added as they are
            x, per = ws.weighed[:T * k], 1
            weigh_inputs(h, wts, x)
            wts = ws.ones[:T]
        if ly.grouped is not None:  # one compiled loop over the used experts
            g, d = ly.grouped
            xq = mm.xi if g.weights[0].int_kernel else mm.xq
            experts_ffn(x, ws.order[:T * k], ws.starts, per, self.exp_act, g.planes, g.info, d.planes, d.info,
                        ly.gu_bias, ly.down_bias, xq, mm.dxb, mm.bsum, mm.acc, mm.expanded, ws.ex, ws.egu, ws.eact, ws.ey, ws.slots)
        else:
            self._each_expert(x, per, ly)
        if ly.expert_scale.shape[0]:  # each expert's output times its scale (Gemma 4's ffn_down_exps.scale)
            scale = ws.escale[:T * k]
            np.take(ly.expert_scale, sel.reshape(-1), out=scale[:, 0], mode="clip")  # clip: no buffer
            ws.slots[:T * k] *= scale
        out = ws.o[:T]
        combine(ws.slots[:T * k], wts, out)
        if self.trace is not None:
            self._seen("ffn_moe_out", il, out)
        return out

    def shared_expert(self, h: np.ndarray, o: np.ndarray, ly: Any, il: int) -> np.ndarray:
        ws, T, mm = self.ws, self.T, self.ws.mm
        gu, act, y, g = ws.sgu[:T], ws.sact[:T], ws.sy[:T], ws.sg[:T]
        for w, col in ly.shexp:
            qmatmul(w, h, gu, mm, col)
        if self.trace is not None:  # llama.cpp's build_ffn names the shared expert's as a dense FFN's
            self._seen("ffn_gate_up", il, gu)
        (glu_rows if T > 1 else glu)(gu, self.cfg.n_ff_shexp, self.glu_act, act)
        if self.trace is not None:
            self._seen("ffn_act", il, act)
        for w, col in ly.shexp_down:
            qmatmul(w, act, y, mm, col)
        if self.trace is not None:
            self._seen("ffn_shexp", il, y)
        if ly.shexp_gate:  # qwen35moe, qwen3next: times the sigmoid of its gate's logit
            for w, col in ly.shexp_gate:
                qmatmul(w, h, g, mm, col)
            add_gated(o, y, g)
        else:  # granitehybrid: added as it is (ggml_add, one float32 sum per element)
            o += y
        if self.trace is not None:
            self._seen("ffn_out", il, o)
        return o

    def _each_expert(self, h: np.ndarray, k: int, ly: Any) -> None:
        """experts_ffn's work expert by expert, for experts whose products are not packed alike
        (types kept as they are, gate and up of different types); slot s reads row s // k of h."""
        ws, mm, starts = self.ws, self.ws.mm, self.ws.starts
        for e in np.flatnonzero(starts[1:] - starts[:-1]).tolist():
            slots = ws.order[starts[e]:starts[e + 1]]
            n = slots.shape[0]
            x = ws.ex[:n]
            gather_tokens(h, slots, k, x)
            gate_up, down = ly.experts[e]
            gu, act, y = ws.egu[:n], ws.eact[:n], ws.ey[:n]
            for w, col in gate_up:
                qmatmul(w, x, gu, mm, col)
            if ly.gu_bias.shape[0]:
                add_row(gu, ly.gu_bias[e])
            glu(gu, self.cfg.n_ff_exp, self.exp_act, act)
            for w, col in down:
                qmatmul(w, act, y, mm, col)
            if ly.down_bias.shape[0]:
                add_row(y, ly.down_bias[e])
            scatter_slots(y, slots, ws.slots)
