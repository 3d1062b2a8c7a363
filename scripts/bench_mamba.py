"""Time the cpu backend's Mamba-2 mixer (backends/cpu/mamba.py) for one layer of a real shape.

The shape defaults to Granite-4.0-H-Tiny's Mamba-2 layers as its Hugging Face config gives them
(hidden 1536, mamba_expand 2: d_inner 3072 = 48 heads of 64; d_state 128, n_groups 1, d_conv 4).
For each thread count it times a prompt of --prompt tokens from position 0 and one decode token
(from the state the prompt left), the scan alone (ssm_scan) and the whole mixer (mamba2:
convolution, scan, gate and grouped norm), each the best of --repeat runs (the machine may be
shared), and prints milliseconds per layer.

    python scripts/bench_mamba.py [--threads 1,2] [--prompt 512] [--repeat 5]
        [--heads 48] [--head-dim 64] [--state 128] [--groups 1]
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from infer.backends.cpu.mamba import mamba2, ssm_scan


def _best(fn, repeat):
    fn()  # compile / warm
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--state", type=int, default=128)
    ap.add_argument("--groups", type=int, default=1)
    a = ap.parse_args()
    H, P, N, G, L = a.heads, a.head_dim, a.state, a.groups, 4
    inner = H * P
    C = inner + 2 * G * N
    rng = np.random.default_rng(0)
    f32 = np.float32
    conv_w = rng.uniform(-0.5, 0.5, (L, C)).astype(f32)
    conv_b = rng.uniform(-0.2, 0.2, C).astype(f32)
    dt_bias = rng.uniform(-1, 1, H).astype(f32)
    ssm_a = -rng.uniform(0.05, 1, H).astype(f32)
    ssm_d = rng.uniform(0.5, 1.5, H).astype(f32)
    norm_w = rng.uniform(0.8, 1.2, inner).astype(f32)
    slots = np.zeros(1, np.int32)
    print(f"shape: {H} heads x {P} x d_state {N}, {G} group(s), conv {L}")
    for threads in (int(x) for x in a.threads.split(",")):
        numba.set_num_threads(threads)
        for T, p0 in ((a.prompt, 0), (1, a.prompt)):
            proj = rng.normal(0, 1, (T, inner + C + H)).astype(f32)
            xc = np.empty((T, C), f32)
            e = np.empty((T, C), f32)
            y = np.empty((T, inner), f32)
            first, count = np.zeros(1, np.int32), np.zeros(1, np.int32)
            tok_seq = np.zeros(T, np.int32)
            positions = np.arange(p0, p0 + T, dtype=np.int32)
            conv_state = rng.normal(0, 1, (1, L - 1, C)).astype(f32)
            state = rng.normal(0, 0.1, (1, H, P, N)).astype(f32)
            # the scan alone, on the mixer's own convolution output (filled by a first mixer run)
            mamba2(proj, conv_w, conv_b, dt_bias, ssm_a, ssm_d, norm_w, f32(1e-5), G, conv_state, state, slots,
                   tok_seq, positions, first, count, xc, e, y)
            dt = proj[:, inner + C:]
            scan = _best(lambda: ssm_scan(xc, dt, dt_bias, ssm_a, ssm_d, G, state, slots, positions, first, count,
                                          y), a.repeat)
            whole = _best(lambda: mamba2(proj, conv_w, conv_b, dt_bias, ssm_a, ssm_d, norm_w, f32(1e-5), G,
                                         conv_state, state, slots, tok_seq, positions, first, count, xc, e,
                                         y), a.repeat)
            what = f"prompt {T}" if T > 1 else "decode 1"
            print(f"threads {threads}  {what:>10}: scan {scan:9.3f} ms  mixer {whole:9.3f} ms")


if __name__ == "__main__":
    main()
