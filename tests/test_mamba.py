"""The cpu backend's Mamba-2 kernel (backends/cpu/mamba.py) against a float64 numpy reference
written from llama.cpp's definition (build_mamba2_layer and ggml's ssm_conv / ssm_scan): several
sequences in one batch in uneven chunks, each continuing from its own state slots (conv tail and
scan state), garbage in every slot at the start (position 0 ignores it); heads of a group share
its B and C (h // (H / G), ggml's repeat_interleave); and the scan is ggml's ssm_scan (llama-cpp-
python's own libggml, through ctypes) bit for bit. The mlx backend's mamba2 (backends/mlx/mamba.py)
against the same reference, where MLX is installed."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from helpers.ggml_ops import GGML_I32, run_op
from infer.backends.cpu.mamba import mamba2, ssm_scan

H, P, N, G, L = 4, 8, 16, 2, 4  # heads, head size, state size, groups, convolution width
INNER = H * P
C = INNER + 2 * G * N
WIDTH = INNER + C + H
EPS = 1e-5


def silu(x):
    return x / (1 + np.exp(-x))


def reference(proj, conv_w, conv_b, dt_bias, a, d, norm_w):
    """One sequence's whole history (proj: (n, WIDTH)): its outputs (n, INNER), the last L - 1
    xBC inputs and the scan states [h, i, j] after it. N from the convolution's channels."""
    C = conv_w.shape[0]
    N = (C - INNER) // (2 * G)
    p = proj.astype(np.float64)
    z, xbc, dt = p[:, :INNER], p[:, INNER:INNER + C], p[:, INNER + C:]
    padded = np.concatenate([np.zeros((L - 1, C)), xbc])
    xc = silu(np.stack([(padded[t:t + L] * conv_w.T).sum(0) for t in range(len(p))]) + conv_b)
    x = xc[:, :INNER].reshape(-1, H, P)
    B = xc[:, INNER:INNER + G * N].reshape(-1, G, N)
    Cm = xc[:, INNER + G * N:].reshape(-1, G, N)
    sp = np.log1p(np.exp(dt + dt_bias))
    s = np.zeros((H, P, N))
    out = np.zeros((len(p), H, P))
    for t in range(len(p)):
        for h in range(H):
            g = h // (H // G)
            s[h] = s[h] * np.exp(sp[t, h] * a[h]) + np.outer(x[t, h] * sp[t, h], B[t, g])
            out[t, h] = s[h] @ Cm[t, g] + x[t, h] * d[h]
    yz = (out.reshape(len(p), INNER) * silu(z)).reshape(len(p), G, INNER // G)
    rms = np.sqrt((yz * yz).mean(-1, keepdims=True) + EPS)
    y = (yz / rms).reshape(len(p), INNER) * norm_w
    return y, padded[-(L - 1):], s


def _params(rng, C=C):
    conv_w = rng.uniform(-0.5, 0.5, (C, L)).astype(np.float32)
    conv_b = rng.uniform(-0.2, 0.2, C).astype(np.float32)
    dt_bias = rng.uniform(-1.0, 1.0, H).astype(np.float32)
    a = -rng.uniform(0.05, 1.0, H).astype(np.float32)
    d = rng.uniform(0.5, 1.5, H).astype(np.float32)
    norm_w = rng.uniform(0.8, 1.2, INNER).astype(np.float32)
    return conv_w, conv_b, dt_bias, a, d, norm_w


def _run(proj, params, conv_state, state, slots, tok_seq, positions):
    conv_w, conv_b, dt_bias, a, d, norm_w = params
    T, C = len(proj), conv_w.shape[0]
    y = np.zeros((T, INNER), np.float32)
    mamba2(proj, np.ascontiguousarray(conv_w.T), conv_b, dt_bias, a, d, norm_w, np.float32(EPS), G, conv_state,
           state, slots, tok_seq, positions, np.zeros(T, np.int32), np.zeros(T, np.int32),
           np.zeros((T, C), np.float32), np.zeros((T, C), np.float32), y)
    return y


def _mlx_run(proj, params, conv_state, state, slots, tok_seq, positions):
    """The mlx backend's mamba2 the same way, over copies of the states in MlxStatePool's layout
    (conv rows flat), copied back into conv_state and state after the call."""
    mx = pytest.importorskip("mlx.core", reason="the mlx backend needs MLX (pip install infer[mlx])")
    from infer.backends.mlx.delta_net import DeltaPlan
    from infer.backends.mlx.mamba import mamba2 as mlx_mamba2
    from infer.backends.mlx.shortconv import ConvPlan

    conv_w, conv_b, dt_bias, a, d, norm_w = params
    n_slots, C = len(state), conv_w.shape[0]
    ly = SimpleNamespace(ssm_conv=mx.array(np.ascontiguousarray(conv_w.T)), ssm_conv_b=mx.array(conv_b),
                         ssm_dt=mx.array(dt_bias), ssm_a=mx.array(a), ssm_d=mx.array(d), ssm_norm=mx.array(norm_w))
    arrays = [mx.array(conv_state.reshape(n_slots * (L - 1), C)), mx.array(state)]
    batch = SimpleNamespace(tok_seq=tok_seq, positions=positions, state_slots=slots)
    y = mlx_mamba2(mx.array(proj), ly, G, EPS, arrays[0], arrays[1], ConvPlan(batch, L), DeltaPlan(batch))
    mx.eval(y, arrays)
    conv_state[:] = np.array(arrays[0]).reshape(n_slots, L - 1, C)
    state[:] = np.array(arrays[1])
    return np.array(y)


@pytest.mark.parametrize("run", [_run, _mlx_run], ids=["cpu", "mlx"])
def test_sequences_continue_from_their_slots(run):
    rng = np.random.default_rng(0)
    params = _params(rng)
    hist = {s: rng.normal(0, 1, (n, WIDTH)).astype(np.float32) for s, n in enumerate((9, 1, 6, 4))}
    # garbage: every sequence starts at position 0, which must ignore what its slots hold
    conv_state = rng.normal(0, 1, (5, L - 1, C)).astype(np.float32)
    state = rng.normal(0, 1, (5, H, P, N)).astype(np.float32)
    slots = np.array([3, 0, 4, 1], np.int32)
    done = {s: 0 for s in hist}
    for chunk in ((4, 1, 2, 0), (1, 0, 3, 4), (4, 0, 1, 0)):
        seqs = [s for s in hist if chunk[s]]
        tok_seq = np.concatenate([np.full(chunk[s], i, np.int32) for i, s in enumerate(seqs)])
        positions = np.concatenate([np.arange(done[s], done[s] + chunk[s], dtype=np.int32) for s in seqs])
        proj = np.concatenate([hist[s][done[s]:done[s] + chunk[s]] for s in seqs])
        y = run(proj, params, conv_state, state, slots[seqs], tok_seq, positions)
        at = 0
        for s in seqs:
            want, tail, st = reference(hist[s][:done[s] + chunk[s]], *params)
            np.testing.assert_allclose(y[at:at + chunk[s]], want[done[s]:], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(conv_state[slots[s]], tail, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(state[slots[s]], st, rtol=1e-4, atol=1e-6)
            at += chunk[s]
            done[s] += chunk[s]
    assert done == {s: len(h) for s, h in hist.items()}


def test_heads_of_a_group_share_b_and_c():
    # heads 0 and 1 are group 0's (h // (H / G)), 2 and 3 group 1's: with x, dt, z and the
    # parameters equal across heads, heads 0 and 1 give the same output, heads 0 and 2 do not
    rng = np.random.default_rng(1)
    T = 5
    proj = rng.normal(0, 1, (T, WIDTH)).astype(np.float32)
    x = proj[:, INNER:2 * INNER].reshape(T, H, P)
    x[:] = x[:, :1]
    proj[:, :INNER] = 1.0  # z
    proj[:, INNER + C:] = 0.3  # dt
    conv_w = np.zeros((C, L), np.float32)
    conv_w[:, -1] = 1.0  # the identity convolution
    params = (conv_w, np.zeros(C, np.float32), np.zeros(H, np.float32), -np.ones(H, np.float32),
              np.ones(H, np.float32), np.ones(INNER, np.float32))
    y = _run(proj, params, np.zeros((1, L - 1, C), np.float32), np.zeros((1, H, P, N), np.float32),
             np.zeros(1, np.int32), np.zeros(T, np.int32), np.arange(T, dtype=np.int32))
    # the grouped norm mixes heads 0 and 1 (group 0), so compare before it: equal heads, equal rows
    heads = y.reshape(T, G, 2, P)
    np.testing.assert_allclose(heads[:, 0, 0], heads[:, 0, 1], rtol=1e-6)
    assert np.abs(heads[:, 0, 0] - heads[:, 1, 0]).max() > 1e-3


def test_wide_state_sums_in_vector_lanes():
    # N = 144: two whole steps of 64 summed in ggml's vector lanes, then 16 one at a time; two
    # batches, the second continuing from the state the first left
    N2 = 144
    C2 = INNER + 2 * G * N2
    rng = np.random.default_rng(2)
    params = _params(rng, C2)
    hist = rng.normal(0, 1, (7, INNER + C2 + H)).astype(np.float32)
    conv_state, state = np.zeros((1, L - 1, C2), np.float32), np.zeros((1, H, P, N2), np.float32)
    for lo, hi in ((0, 4), (4, 7)):
        y = _run(hist[lo:hi], params, conv_state, state, np.zeros(1, np.int32), np.zeros(hi - lo, np.int32),
                 np.arange(lo, hi, dtype=np.int32))
        want, tail, st = reference(hist[:hi], *params)
        np.testing.assert_allclose(y, want[lo:], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state[0], st, rtol=1e-4, atol=1e-6)


def _ggml_ssm_scan(s0, x, dt, a, B, C):
    """ggml_ssm_scan of llama-cpp-python's own libggml: (y, the new state).
    s0: (H, P, N); x: (T, H, P); dt: (T, H); a: (H,); B, C: (T, G, N), all float32."""
    res = run_op("ssm_scan", lambda tensor: ([tensor(s0[None]), tensor(x[None]), tensor(dt[None]), tensor(a[:, None]),
                                              tensor(B[None]), tensor(C[None]), tensor(np.zeros(1, np.int32), GGML_I32)],
                                             []), x.size + s0.size)
    return res[:x.size].reshape(x.shape), res[x.size:].reshape(s0.shape)


@pytest.mark.reference
@pytest.mark.parametrize("n", [16, 64, 144])  # the scalar path; whole vector steps; both
@pytest.mark.parametrize("p", [64, 6])  # head sizes: rows four at a time; and two left for the one-row path
def test_scan_is_ggml_ssm_scan_bit_for_bit(n, p):
    # from a nonzero state (position 1 on), 5 tokens, 2 groups of 4 heads; dt's bias and D zero, as
    # ggml's op has neither (llama.cpp adds them around it)
    Hh, Pp, G2, T = 8, p, 2, 5
    rng = np.random.default_rng(n)
    s0 = rng.normal(0, 1, (Hh, Pp, n)).astype(np.float32)
    x = rng.normal(0, 1, (T, Hh, Pp)).astype(np.float32)
    dt = rng.normal(0, 1, (T, Hh)).astype(np.float32)
    a = -rng.uniform(0.1, 1.0, Hh).astype(np.float32)
    B, C2 = (rng.normal(0, 1, (T, G2, n)).astype(np.float32) for _ in range(2))
    want_y, want_s = _ggml_ssm_scan(s0, x, dt, a, B, C2)
    xc = np.concatenate([x.reshape(T, -1), B.reshape(T, -1), C2.reshape(T, -1)], axis=1)
    state, y = s0[None].copy(), np.zeros((T, Hh * Pp), np.float32)
    zeros = np.zeros(Hh, np.float32)
    ssm_scan(xc, dt, zeros, a, zeros, G2, state, np.zeros(1, np.int32), np.arange(1, T + 1, dtype=np.int32),
             np.zeros(1, np.int32), np.array([T], np.int32), y)
    np.testing.assert_array_equal(state[0], want_s)
    np.testing.assert_array_equal(y.reshape(T, Hh, Pp), want_y)
