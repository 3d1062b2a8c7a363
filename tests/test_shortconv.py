"""The cpu backend's short-convolution kernel (backends/cpu/shortconv.py) against numpy: several
sequences in one batch, each continuing from its own state slot, and the state a slot holds
ignored where a sequence starts at position 0."""
from __future__ import annotations

import numpy as np
import pytest

from infer.backends.cpu.shortconv import shortconv

D, L = 16, 3


def reference(inputs: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's whole history: (C * conv(B * x) per position, its last L - 1 inputs B * x)."""
    b, c, x = np.split(inputs.astype(np.float64), 3, axis=1)
    bx = np.concatenate([np.zeros((L - 1, D)), b * x])
    y = np.stack([(bx[t:t + L] * kernel).sum(0) for t in range(len(inputs))]) * c
    return y, bx[-(L - 1):]


def run(bcx, kernel, state, slots, tok_seq, positions):
    T = len(bcx)
    y, bx = np.zeros((T, D), np.float32), np.zeros((T, D), np.float32)
    first, count = np.zeros(T, np.int32), np.zeros(T, np.int32)
    shortconv(bcx, kernel, state, slots, tok_seq, positions, first, count, bx, y)
    return y


def test_sequences_continue_from_their_slots():
    rng = np.random.default_rng(0)
    kernel = rng.uniform(-1, 1, (L, D)).astype(np.float32)
    hist = {s: rng.normal(0, 1, (n, 3 * D)).astype(np.float32) for s, n in enumerate((9, 1, 6, 4))}
    state = rng.normal(0, 1, (5, L - 1, D)).astype(np.float32)  # garbage: every sequence starts at 0
    slots = np.array([3, 0, 4, 1], np.int32)
    done = {s: 0 for s in hist}
    # three steps of uneven chunks (0: a sequence absent from the step; 1: a decode-sized one)
    for chunk in ((4, 1, 2, 0), (1, 0, 3, 4), (4, 0, 1, 0)):
        seqs = [s for s in hist if chunk[s]]
        tok_seq = np.concatenate([np.full(chunk[s], i, np.int32) for i, s in enumerate(seqs)])
        positions = np.concatenate([np.arange(done[s], done[s] + chunk[s], dtype=np.int32) for s in seqs])
        bcx = np.concatenate([hist[s][done[s]:done[s] + chunk[s]] for s in seqs])
        y = run(bcx, kernel, state, slots[seqs], tok_seq, positions)
        at = 0
        for s in seqs:
            want, tail = reference(hist[s][:done[s] + chunk[s]], kernel)
            np.testing.assert_allclose(y[at:at + chunk[s]], want[done[s]:], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(state[slots[s]], tail, rtol=1e-6, atol=1e-7)
            at += chunk[s]
            done[s] += chunk[s]
    assert done == {s: len(h) for s, h in hist.items()}


def test_tokens_of_a_sequence_must_be_consecutive():
    kernel = np.ones((L, D), np.float32)
    state = np.zeros((2, L - 1, D), np.float32)
    bcx = np.ones((3, 3 * D), np.float32)
    with pytest.raises(ValueError, match="consecutive"):
        run(bcx, kernel, state, np.array([0, 1], np.int32), np.array([0, 1, 0], np.int32),
            np.array([0, 0, 1], np.int32))
