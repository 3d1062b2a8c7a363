"""The cpu backend's Mamba-2 kernel (backends/cpu/mamba.py) against a float64 numpy reference
written from llama.cpp's definition (build_mamba2_layer and ggml's ssm_conv / ssm_scan): several
sequences in one batch in uneven chunks, each continuing from its own state slots (conv tail and
scan state), garbage in every slot at the start (position 0 ignores it); heads of a group share
its B and C (h // (H / G), ggml's repeat_interleave)."""
from __future__ import annotations

import numpy as np

from infer.backends.cpu.mamba import mamba2

H, P, N, G, L = 4, 8, 16, 2, 4  # heads, head size, state size, groups, convolution width
INNER = H * P
C = INNER + 2 * G * N
WIDTH = INNER + C + H
EPS = 1e-5


def silu(x):
    return x / (1 + np.exp(-x))


def reference(proj, conv_w, conv_b, dt_bias, a, d, norm_w):
    """One sequence's whole history (proj: (n, WIDTH)): its outputs (n, INNER), the last L - 1
    xBC inputs and the scan states [h, i, j] after it."""
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


def _params(rng):
    conv_w = rng.uniform(-0.5, 0.5, (C, L)).astype(np.float32)
    conv_b = rng.uniform(-0.2, 0.2, C).astype(np.float32)
    dt_bias = rng.uniform(-1.0, 1.0, H).astype(np.float32)
    a = -rng.uniform(0.05, 1.0, H).astype(np.float32)
    d = rng.uniform(0.5, 1.5, H).astype(np.float32)
    norm_w = rng.uniform(0.8, 1.2, INNER).astype(np.float32)
    return conv_w, conv_b, dt_bias, a, d, norm_w


def _run(proj, params, conv_state, state, slots, tok_seq, positions):
    conv_w, conv_b, dt_bias, a, d, norm_w = params
    T = len(proj)
    y = np.zeros((T, INNER), np.float32)
    mamba2(proj, np.ascontiguousarray(conv_w.T), conv_b, dt_bias, a, d, norm_w, np.float32(EPS), G, conv_state,
           state, slots, tok_seq, positions, np.zeros(T, np.int32), np.zeros(T, np.int32),
           np.zeros((T, C), np.float32), np.zeros((T, C), np.float32), y)
    return y


def test_sequences_continue_from_their_slots():
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
        y = _run(proj, params, conv_state, state, slots[seqs], tok_seq, positions)
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
