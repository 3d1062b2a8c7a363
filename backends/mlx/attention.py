"""Attention of a batch's queries over the paged KV cache, in MLX.

A plan is made once per forward pass and KV group (numpy, from the block tables) and serves
every layer of the group.  Sequences with one query in the batch (decode steps) share one call:
their keys gathered into a padded (S, L) batch with a mask for the padding.  A sequence with
several queries (a prefill chunk) gets a call of its own over keys lo..hi, its first query's
window start to its last query's position, masked causally and by the window (or llama4's chunk).
A non-causal model's (an encoder's) queries see every key of their sequence written up to the end
of the step, within a symmetric window where there is one (|q - p| <= window // 2).

Masked keys add exact zeros to sums that MLX's CPU build accumulates in order, so a query's
result does not depend on what else is in the batch (tested); on a GPU that is not guaranteed.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from infer.backends.batch import Batch


def as_dtype(x: mx.array, dtype) -> mx.array:
    """x in dtype, without a copy when it already is."""
    return x if x.dtype == dtype else x.astype(dtype)


class AttentionPlan:
    """Which keys each query of a batch sees in one KV group, as gather indices and masks."""

    def __init__(self, batch: Batch, group: int, block_size: int, window: int, chunked: bool = False,
                 causal: bool = True):
        # window: 0, or the sliding window; chunked: the window is a chunk instead (llama4: a query
        # sees the keys from its chunk's start, q_pos // window * window, on); causal False: the
        # keys of the whole sequence in the batch, the window symmetric (ModelConfig.causal)
        tok_seq, pos = batch.tok_seq, batch.positions
        table = batch.tables[group]
        T = len(tok_seq)
        order = np.argsort(tok_seq, kind="stable")
        seqs, starts, counts = np.unique(tok_seq[order], return_index=True, return_counts=True)

        def key_rows(s: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
            p = np.arange(lo, hi + 1)
            blocks = table[s][p // block_size]
            held = blocks >= 0  # blocks that fell out of a sliding window are -1: masked below anyway
            return np.where(held, blocks * block_size + p % block_size, 0).astype(np.int32), held

        # parts: (token indices, key rows (B, L), mask (B, n, L)); decode tokens first, together; and
        # per part |p_q - p_k| (B, n, L) float32, ALiBi's distances (attend's slopes)
        self.parts: list[tuple[mx.array | None, mx.array, mx.array]] = []
        self.dists: list[mx.array] = []
        done: list[np.ndarray] = []
        single = [(int(s), int(order[i])) for s, i, c in zip(seqs, starts, counts) if c == 1]
        if single:
            spans = []
            for s, t in single:
                hi = int(pos[t])  # a non-causal sequence's one token is its last
                if not causal:
                    lo = max(0, hi - window // 2) if window else 0
                else:
                    lo = (hi // window * window if chunked else max(0, hi - window + 1)) if window else 0
                spans.append(key_rows(s, lo, hi))
            L = max(len(r) for r, _ in spans)
            rows = np.zeros((len(spans), L), np.int32)
            mask = np.zeros((len(spans), 1, L), bool)
            for i, (r, held) in enumerate(spans):
                rows[i, :len(r)] = r
                mask[i, 0, :len(r)] = held
            idx = np.array([t for _, t in single], np.int64)
            done.append(idx)
            self.parts.append((self._index(idx, T), mx.array(rows), mx.array(mask)))
            # each token's keys from its span's start on (padding: masked): the distances back from it
            first = np.array([int(pos[t]) - (len(r) - 1) for (r, _), (_, t) in zip(spans, single)])
            kp = first[:, None] + np.arange(L)[None, :]
            q = np.array([int(pos[t]) for _, t in single])
            self.dists.append(mx.array(np.abs(q[:, None] - kp).astype(np.float32)[:, None, :]))
        for s, i, c in zip(seqs, starts, counts):
            if c == 1:
                continue
            idx = np.sort(order[i:i + c])
            qp = pos[idx].astype(np.int64)
            hi = int(qp.max())
            lo = 0
            if not causal:
                lo = max(0, int(qp.min()) - window // 2) if window else 0
            elif window:
                lo = int(qp.min()) // window * window if chunked else max(0, int(qp.min()) - window + 1)
            r, held = key_rows(int(s), lo, hi)
            kp = np.arange(lo, hi + 1)
            m = ((kp[None, :] <= qp[:, None]) if causal else np.ones((len(qp), len(kp)), bool)) & held[None, :]
            if not causal:
                if window:
                    m &= np.abs(qp[:, None] - kp[None, :]) <= window // 2
            elif window and chunked:
                m &= kp[None, :] >= qp[:, None] // window * window
            elif window:
                m &= qp[:, None] - kp[None, :] < window
            done.append(idx)
            self.parts.append((self._index(idx, T), mx.array(r[None]), mx.array(m[None])))
            self.dists.append(mx.array(np.abs(qp[:, None] - kp[None, :]).astype(np.float32)[None]))
        cat = np.concatenate(done)
        # the outputs come out in the parts' order; this puts them back in token order
        self.perm = None if np.array_equal(cat, np.arange(T)) else mx.array(np.argsort(cat).astype(np.int32))

    @staticmethod
    def _index(idx: np.ndarray, T: int) -> mx.array | None:
        return None if np.array_equal(idx, np.arange(T)) else mx.array(idx.astype(np.int32))

    def attend(self, q: mx.array, k_rows: mx.array, v_rows: mx.array, scale: float, softcap: float,
               sinks: mx.array | None = None, alibi: mx.array | None = None) -> mx.array:
        """q (T, H, D) -> (T, H * Dv); k_rows (n_rows, Hkv, D), v_rows (n_rows, Hkv, Dv): a layer's cache,
        this batch's K/V already written; sinks (H,): gpt-oss's sink logits, or None; alibi (H,):
        ALiBi's slopes (each score plus -slope * |p_q - p_k|: jina-bert-v2), or None.  Computes in
        q's dtype."""
        outs = []
        for (idx, rows, mask), dist in zip(self.parts, self.dists):
            keys = mask[:, None]  # (B, 1, n, L): which keys each query sees
            if alibi is not None:  # an additive mask (B, H, n, L): the bias where a key is seen, -inf where not
                bias = (-alibi.astype(mx.float32)[None, :, None, None]) * dist[:, None]
                keys = mx.where(keys, bias, mx.array(-np.inf, mx.float32)).astype(q.dtype)
            qs = q if idx is None else q[idx]
            B, n = rows.shape[0], qs.shape[0] // rows.shape[0]
            qb = qs.reshape(B, n, *qs.shape[1:]).transpose(0, 2, 1, 3)  # (B, H, n, D)
            kb = as_dtype(k_rows[rows], q.dtype).transpose(0, 2, 1, 3)  # (B, Hkv, L, D)
            vb = as_dtype(v_rows[rows], q.dtype).transpose(0, 2, 1, 3)
            if softcap > 0:
                o = _softcapped(qb, kb, vb, scale, softcap, mask)
            else:
                o = mx.fast.scaled_dot_product_attention(qb, kb, vb, scale=scale, mask=keys,
                                                         sinks=None if sinks is None else as_dtype(sinks, q.dtype))
            outs.append(o.transpose(0, 2, 1, 3).reshape(B * n, -1))
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out if self.perm is None else out[self.perm]


def _softcapped(q, k, v, scale: float, cap: float, mask) -> mx.array:
    """Attention with the scores squashed by cap * tanh(s / cap) before the softmax (no fused kernel
    has that).  q (B, H, n, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv), mask (B, n, L)."""
    B, H, n, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    rep = H // Hkv
    s = (q.reshape(B, Hkv, rep * n, D) @ k.swapaxes(-1, -2)) * scale
    s = (cap * mx.tanh(s / cap)).reshape(B, Hkv, rep, n, L)
    s = mx.where(mask[:, None, None], s, mx.array(-np.inf, s.dtype))
    p = mx.softmax(s, axis=-1, precise=True).reshape(B, Hkv, rep * n, L)
    return (p @ v).reshape(B, H, n, v.shape[-1])
