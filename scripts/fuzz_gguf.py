"""The long hostile-input run: mutated tiny models of every architecture (tests/helpers/gguf_fuzz.py), or
mutated MLX / HF model folders or importance-matrix files (tests/helpers/mlx_fuzz.py, imatrix_fuzz.py), loaded and run
(imatrix files: given to `infer quantize --imatrix`; hf-convert: HF folders given to `infer
quantize`) by a worker process, counting clean errors, tracebacks that would reach the user,
crashes (the worker killed by a signal) and hangs.

    python scripts/fuzz_gguf.py [--format gguf|mlx|imatrix|hf-convert] [--cases 20000] [--seed 0] [--timeout 60]
                                [--keep DIR]

Prints the counts, and every case that was not OK or a clean one-line error (with what was
mutated, for folders); those cases are kept in DIR (default: a temporary folder) to reproduce them.
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import (
    gguf_fuzz,  # noqa: E402
    imatrix_fuzz,  # noqa: E402
    mlx_fuzz,  # noqa: E402
)

# make(i, folder) -> (the case's path, what was mutated): each format's seeds are made once, lazily.
CaseMaker = Callable[[int, Path], tuple[Path, str]]


def gguf_cases(folder: Path) -> tuple[CaseMaker, list[str] | None]:
    originals = [(p, p.read_bytes()) for p in gguf_fuzz.seeds(folder)]

    def make(i: int, out: Path) -> tuple[Path, str]:
        src, data = originals[i % len(originals)]
        p = out / f"case-{i:06d}-{src.stem.removeprefix('seed-')}.gguf"
        p.write_bytes(gguf_fuzz.mutate(data, random.Random(i)))
        return p, ""

    return make, None


def _folder_cases(originals: list[Path]) -> CaseMaker:
    def make(i: int, out: Path) -> tuple[Path, str]:
        src = originals[i % len(originals)]
        p = out / f"case-{i:06d}-{src.name.removeprefix('seed-')}"
        shutil.rmtree(p, ignore_errors=True)
        return p, mlx_fuzz.mutate(src, p, random.Random(i))

    return make


def mlx_cases(folder: Path) -> tuple[CaseMaker, list[str] | None]:
    return _folder_cases(mlx_fuzz.seeds(folder)), None


def hf_convert_cases(folder: Path) -> tuple[CaseMaker, list[str] | None]:
    """The HF float folders only, through `infer quantize` (the converter refuses quantized folders)."""
    originals = [p for p in mlx_fuzz.seeds(folder) if p.name.startswith("seed-hf-")]
    return _folder_cases(originals), [mlx_fuzz.__file__, "convert"]


def imatrix_cases(folder: Path) -> tuple[CaseMaker, list[str] | None]:
    model, originals = imatrix_fuzz.imatrix_seeds(folder)
    data = [p.read_bytes() for p in originals]
    types = imatrix_fuzz.IMATRIX_TYPES

    def make(i: int, out: Path) -> tuple[Path, str]:
        src = originals[i % len(originals)]
        # the quantization type rides in the name (imatrix_fuzz.imatrix_worker reads it back)
        p = out / f"case-{i:06d}--{types[i // len(originals) % len(types)]}{''.join(src.suffixes)}"
        p.write_bytes(imatrix_fuzz.mutate_imatrix(data[i % len(data)], random.Random(i)))
        return p, ""

    return make, [imatrix_fuzz.__file__, str(model)]


FORMATS = {"gguf": gguf_cases, "mlx": mlx_cases, "imatrix": imatrix_cases, "hf-convert": hf_convert_cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", choices=FORMATS, default="gguf", help="what to mutate (default: gguf)")
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take before it is a hang")
    ap.add_argument("--batch", type=int, default=500, help="cases written and run at a time")
    ap.add_argument("--keep", help="folder for the seeds and the failing cases")
    a = ap.parse_args(argv)
    folder = Path(a.keep or tempfile.mkdtemp(prefix="infer-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    make, worker_argv = FORMATS[a.format](folder)
    counts: collections.Counter = collections.Counter()
    bad = []
    t0 = time.time()
    for first in range(a.seed, a.seed + a.cases, a.batch):
        what = dict(make(i, folder) for i in range(first, min(first + a.batch, a.seed + a.cases)))
        for p, answer in gguf_fuzz.run_cases(list(what), a.timeout, worker_argv):
            kind = answer.split(" ", 1)[0]
            counts[kind] += 1
            if kind not in ("OK", "ERR"):  # RUN cases are kept: a kernel met what the loader should have refused
                bad.append((p, answer, what[p]))
            elif p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        print(f"{sum(counts.values())} cases, {time.time() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)
    print(f"{a.format}: {sum(counts.values())} cases in {time.time() - t0:.0f} s: "
          + ", ".join(f"{k} {counts[k]}" for k in ("OK", "ERR", "RUN", "TB", "CRASH", "HANG")))
    for p, answer, mutated in bad:
        print(f"{p}: {re.sub(r'0x[0-9a-f]+', '0x…', answer)}" + (f"  [{mutated}]" if mutated else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
