"""The cpu backend's gated delta net kernel (backends/cpu/delta_net.py), and the mlx backend's
(backends/mlx/delta_net.py) where MLX is installed, against a float64 numpy
reference written from llama.cpp's definition (build_layer_attn_linear and ggml's
gated_delta_net): several sequences in one batch in uneven chunks, each continuing from its own
state slots (conv tail and delta matrices), garbage in every slot at the start (position 0
ignores it); and a value head's key head is h % key heads, as ggml tiles them (Qwen3.5), or
h // (value heads / key heads) where they are grouped (Qwen3-Next). And the delta rule is ggml's
gated_delta_net (llama-cpp-python's own libggml, through ctypes) bit for bit."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from helpers.ggml_ops import run_op
from infer.backends.cpu.delta_net import delta_net, delta_rule

S, HK, HV, L = 16, 2, 4, 4  # head size, key heads, value heads, convolution width
KEY, INNER = HK * S, HV * S
C = 2 * KEY + INNER
EPS = 1e-6


def silu(x):
    return x / (1 + np.exp(-x))


def reference(proj, conv_w, dt, a, norm_w):
    """One sequence's whole history (proj: (n, C + INNER + 2 HV)): its outputs (n, INNER), the last
    L - 1 Q|K|V inputs and the delta matrices [h, j, i] after it."""
    p = proj.astype(np.float64)
    qkv, z = p[:, :C], p[:, C:C + INNER]
    beta = 1 / (1 + np.exp(-p[:, C + INNER:C + INNER + HV]))
    g = np.log1p(np.exp(p[:, C + INNER + HV:] + dt)) * a
    padded = np.concatenate([np.zeros((L - 1, C)), qkv])
    xc = silu(np.stack([(padded[t:t + L] * conv_w.T).sum(0) for t in range(len(p))]))
    q = xc[:, :KEY].reshape(-1, HK, S)
    k = xc[:, KEY:2 * KEY].reshape(-1, HK, S)
    v = xc[:, 2 * KEY:].reshape(-1, HV, S)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + EPS)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + EPS)
    M = np.zeros((HV, S, S))  # [h, j (value), i (key)]
    out = np.zeros((len(p), HV, S))
    for t in range(len(p)):
        for h in range(HV):
            kh = h % HK
            M[h] *= np.exp(g[t, h])
            d = (v[t, h] - M[h] @ k[t, kh]) * beta[t, h]
            M[h] += np.outer(d, k[t, kh])
            out[t, h] = M[h] @ q[t, kh] / np.sqrt(S)
    rms = np.sqrt((out * out).mean(-1, keepdims=True) + EPS)
    y = out / rms * norm_w * silu(z.reshape(-1, HV, S))
    return y.reshape(len(p), INNER), padded[-(L - 1):], M


def _cpu_kernel(kernel, dt, a, norm_w, conv_state, state):
    """The cpu kernel as fn(proj, slots, tok_seq, positions) -> y, over the given states in place."""
    def run(proj, slots, tok_seq, positions):
        T = len(proj)
        xc, e, y = np.zeros((T, C), np.float32), np.zeros((T, C), np.float32), np.zeros((T, INNER), np.float32)
        first, count = np.zeros(T, np.int32), np.zeros(T, np.int32)
        delta_net(proj, kernel, dt, a, norm_w, np.float32(EPS), HK, 1, conv_state, state, slots, tok_seq,
                  positions, first, count, xc, e, y)
        return y
    return run, lambda: (conv_state, state)


def _mlx_kernel(kernel, dt, a, norm_w, conv_state, state):
    """The mlx backend's delta_net the same way, its states in MlxStatePool's layout (conv rows flat)."""
    mx = pytest.importorskip("mlx.core", reason="the mlx backend needs MLX (pip install infer[mlx])")
    from infer.backends.mlx.delta_net import DeltaPlan
    from infer.backends.mlx.delta_net import delta_net as mlx_delta_net
    from infer.backends.mlx.shortconv import ConvPlan

    n_slots = len(state)
    ly = SimpleNamespace(ssm_conv=mx.array(kernel), ssm_dt=mx.array(dt), ssm_a=mx.array(a), ssm_norm=mx.array(norm_w))
    arrays = [mx.array(conv_state.reshape(n_slots * (L - 1), C)), mx.array(state)]

    def run(proj, slots, tok_seq, positions):
        batch = SimpleNamespace(tok_seq=tok_seq, positions=positions, state_slots=slots)
        y = mlx_delta_net(mx.array(proj), ly, HK, False, EPS, arrays[0], arrays[1], ConvPlan(batch, L), DeltaPlan(batch))
        mx.eval(y, arrays)
        return np.array(y)
    return run, lambda: (np.array(arrays[0]).reshape(n_slots, L - 1, C), np.array(arrays[1]))


@pytest.mark.parametrize("make", [_cpu_kernel, _mlx_kernel], ids=["cpu", "mlx"])
def test_sequences_continue_from_their_slots(make):
    rng = np.random.default_rng(0)
    conv_w = rng.uniform(-0.5, 0.5, (C, L)).astype(np.float32)
    dt = rng.uniform(0.5, 1.5, HV).astype(np.float32)
    a = -rng.uniform(0.05, 1.0, HV).astype(np.float32)
    norm_w = rng.uniform(0.8, 1.2, S).astype(np.float32)
    hist = {s: rng.normal(0, 1, (n, C + INNER + 2 * HV)).astype(np.float32) for s, n in enumerate((9, 1, 6, 4))}
    # garbage: every sequence starts at position 0, which must ignore what its slots hold
    conv_state = rng.normal(0, 1, (5, L - 1, C)).astype(np.float32)
    state = rng.normal(0, 1, (5, HV, S, S)).astype(np.float32)
    slots = np.array([3, 0, 4, 1], np.int32)
    done = {s: 0 for s in hist}
    run, states = make(np.ascontiguousarray(conv_w.T), dt, a, norm_w, conv_state, state)
    for chunk in ((4, 1, 2, 0), (1, 0, 3, 4), (4, 0, 1, 0)):
        seqs = [s for s in hist if chunk[s]]
        tok_seq = np.concatenate([np.full(chunk[s], i, np.int32) for i, s in enumerate(seqs)])
        positions = np.concatenate([np.arange(done[s], done[s] + chunk[s], dtype=np.int32) for s in seqs])
        proj = np.concatenate([hist[s][done[s]:done[s] + chunk[s]] for s in seqs])
        y = run(proj, slots[seqs], tok_seq, positions)
        conv_now, state_now = states()
        at = 0
        for s in seqs:
            want, tail, M = reference(hist[s][:done[s] + chunk[s]], conv_w, dt, a, norm_w)
            np.testing.assert_allclose(y[at:at + chunk[s]], want[done[s]:], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(conv_now[slots[s]], tail, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(state_now[slots[s]], M, rtol=1e-4, atol=1e-6)
            at += chunk[s]
            done[s] += chunk[s]
    assert done == {s: len(h) for s, h in hist.items()}


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
@pytest.mark.parametrize("k_repeat", [1, HV // HK], ids=["tiled", "grouped"])
def test_value_heads_share_key_heads(k_repeat, backend):
    # tiled (Qwen3.5, k_repeat 1): value heads 0 and 2 share key head 0 (h % HK); grouped
    # (Qwen3-Next, k_repeat HV / HK): heads 0 and 1 do (h // (HV / HK)). With v, beta, g equal
    # across value heads, the heads that share a key head give the same output, the others do not
    rng = np.random.default_rng(1)
    T = 5
    proj = rng.normal(0, 1, (T, C + INNER + 2 * HV)).astype(np.float32)
    v = proj[:, 2 * KEY:C].reshape(T, HV, S)
    v[:] = v[:, :1]
    proj[:, C:C + INNER] = 1.0  # z
    proj[:, C + INNER:] = 0.3  # beta's and alpha's logits
    conv_w = np.ascontiguousarray(np.zeros((L, C), np.float32))
    conv_w[-1] = 1.0  # the identity convolution
    dt, a, norm_w = np.zeros(HV, np.float32), -np.ones(HV, np.float32), np.ones(S, np.float32)
    if backend == "cpu":
        y = np.zeros((T, INNER), np.float32)
        delta_net(proj, conv_w, dt, a, norm_w, np.float32(EPS), HK, k_repeat, np.zeros((1, L - 1, C), np.float32),
                  np.zeros((1, HV, S, S), np.float32), np.zeros(1, np.int32), np.zeros(T, np.int32),
                  np.arange(T, dtype=np.int32), np.zeros(T, np.int32), np.zeros(T, np.int32),
                  np.zeros((T, C), np.float32), np.zeros((T, C), np.float32), y)
    else:
        mx = pytest.importorskip("mlx.core", reason="the mlx backend needs MLX (pip install infer[mlx])")
        from infer.backends.mlx.delta_net import DeltaPlan
        from infer.backends.mlx.delta_net import delta_net as mlx_delta_net
        from infer.backends.mlx.shortconv import ConvPlan

        ly = SimpleNamespace(ssm_conv=mx.array(conv_w), ssm_dt=mx.array(dt), ssm_a=mx.array(a),
                             ssm_norm=mx.array(norm_w))
        batch = SimpleNamespace(tok_seq=np.zeros(T, np.int32), positions=np.arange(T, dtype=np.int32),
                                state_slots=np.zeros(1, np.int32))
        states = [mx.zeros((L - 1, C)), mx.zeros((1, HV, S, S))]
        y = np.array(mlx_delta_net(mx.array(proj), ly, HK, k_repeat > 1, EPS, states[0], states[1],
                                   ConvPlan(batch, L), DeltaPlan(batch)))
    heads = y.reshape(T, HV, S)
    same, other = (2, 1) if k_repeat == 1 else (1, 2)
    np.testing.assert_array_equal(heads[:, 0], heads[:, same])
    assert np.abs(heads[:, 0] - heads[:, other]).max() > 1e-3


@pytest.mark.reference
@pytest.mark.parametrize("s", [6, 64, 130])  # the scalar path (and rows left over); whole vector steps; both
def test_delta_rule_is_ggml_gated_delta_net_bit_for_bit(s):
    # from a nonzero state (position 1 on), 5 tokens, 8 value heads tiled over 4 key heads
    hv, hk, T = 8, 4, 5
    rng = np.random.default_rng(s)
    q, k = (rng.normal(0, 0.3, (T, hk, s)).astype(np.float32) for _ in range(2))
    v = rng.normal(0, 1, (T, hv, s)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, (T, hv)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (T, hv)).astype(np.float32)
    s0 = rng.normal(0, 1, (hv, s, s)).astype(np.float32)
    res = run_op("gated_delta_net", lambda tensor: ([tensor(q[None]), tensor(k[None]), tensor(v[None]),
                                                     tensor(g[None, :, :, None]), tensor(beta[None, :, :, None]),
                                                     tensor(s0[None])], [1]), v.size + s0.size)
    xc = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
    state, y = s0[None].copy(), np.zeros((T, hv * s), np.float32)
    delta_rule(xc, np.concatenate([beta, g], axis=1), hk, 1, state, np.zeros(1, np.int32),
               np.arange(1, T + 1, dtype=np.int32), np.zeros(1, np.int32), np.array([T], np.int32), y)
    np.testing.assert_array_equal(state[0], res[v.size:].reshape(s0.shape))
    np.testing.assert_array_equal(y, res[:v.size].reshape(T, hv * s))
