"""The long hostile-GGUF run: mutated tiny models of every architecture (tests/gguf_fuzz.py) loaded
and run by a worker process, counting clean errors, tracebacks that would reach the user,
crashes (the worker killed by a signal) and hangs.

    python scripts/fuzz_gguf.py [--cases 20000] [--seed 0] [--timeout 60] [--keep DIR]

Prints the counts, and every case that was not OK or a clean one-line error; those files are
kept in DIR (default: a temporary folder) to reproduce them.
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gguf_fuzz import mutate, run_cases, seeds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take before it is a hang")
    ap.add_argument("--batch", type=int, default=500, help="cases written and run at a time")
    ap.add_argument("--keep", help="folder for the seeds and the failing cases")
    a = ap.parse_args(argv)
    folder = Path(a.keep or tempfile.mkdtemp(prefix="infer-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    originals = [(p, p.read_bytes()) for p in seeds(folder)]
    counts: collections.Counter = collections.Counter()
    bad = []
    t0 = time.time()
    for first in range(a.seed, a.seed + a.cases, a.batch):
        batch = []
        for i in range(first, min(first + a.batch, a.seed + a.cases)):
            src, data = originals[i % len(originals)]
            p = folder / f"case-{i:06d}-{src.stem.removeprefix('seed-')}.gguf"
            p.write_bytes(mutate(data, random.Random(i)))
            batch.append(p)
        for p, answer in run_cases(batch, a.timeout):
            kind = answer.split(" ", 1)[0]
            counts[kind] += 1
            if kind in ("OK", "ERR"):  # RUN cases are kept: a kernel met what the loader should have refused
                p.unlink()
            else:
                bad.append((p, answer))
        print(f"{sum(counts.values())} cases, {time.time() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)
    print(f"{sum(counts.values())} cases in {time.time() - t0:.0f} s: "
          + ", ".join(f"{k} {counts[k]}" for k in ("OK", "ERR", "RUN", "TB", "CRASH", "HANG")))
    for p, answer in bad:
        print(f"{p}: {re.sub(r'0x[0-9a-f]+', '0x…', answer)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
