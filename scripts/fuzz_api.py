"""The long API fuzz: `infer serve` (one model, then several-models mode) fuzzed from its own
OpenAPI document with schemathesis, as tests/test_openapi.py does with a small budget
(tests/helpers/api_fuzz.py): for every operation, requests that fit the document and requests that break
it, each of which must get a 2xx or a documented 4xx in the route's error shape (no 5xx, no dropped
connection, no hang).

    python scripts/fuzz_api.py [--examples 2000] [--seed N] [--only one|several] [--keep DIR]

Prints, per server, the requests sent, the statuses per operation, the failures (each with a
curl command that repeats it) and the tracebacks in the server's log; exits 1 if there was any.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import api_fuzz  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=2000, help="requests per operation and kind (fitting, breaking)")
    ap.add_argument("--seed", type=int, default=None, help="the same requests as an earlier run (default: new ones)")
    ap.add_argument("--only", choices=("one", "several"), help="fuzz one server (default: both)")
    ap.add_argument("--keep", help="folder for the servers' sandboxes and logs (default: a temporary one)")
    a = ap.parse_args(argv)
    folder = Path(a.keep or tempfile.mkdtemp(prefix="infer-api-fuzz-"))
    bad = False
    for several in (False, True):
        if a.only and a.only != ("several" if several else "one"):
            continue
        label = "several-models server" if several else "one-model server"
        server, name = api_fuzz.serve(folder / ("several" if several else "one"), several)
        t0 = time.time()
        try:
            base = f"http://127.0.0.1:{server.port}"
            report = api_fuzz.fuzz(api_fuzz.load(base), base, a.examples, model=name, seed=a.seed)
        finally:
            code = server.stop()
        tracebacks = server.output().count("Traceback")
        print(f"== {label} ({time.time() - t0:.0f} s; exit code {code}, {tracebacks} tracebacks in its log)")
        print(report.summary(), flush=True)
        bad = bad or bool(report.failures) or tracebacks > 0 or code != 0
    print(f"logs and sandboxes: {folder}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
