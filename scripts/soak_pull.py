"""Soak `infer pull` against a hostile Hub: many rounds, each with a fault drawn at random, and after every
round a check that nothing was lost and nothing half-written.

The Hub is tests/helpers/fake_hub.py, started in this process (HF_ENDPOINT points at it), serving one split GGUF
of random bytes: a first shard over huggingface_hub's 10 MB chunk (so a retry resumes with a Range from
the last whole chunk) and a small second one. Each round pulls it into a fresh HF_HOME and infer home
with one fault on a random shard:

  none          nothing goes wrong
  cut           1 to 5 connections closed at random offsets (huggingface_hub retries 5 times: must succeed)
  cut-many      8 cuts (may fail once the retries run out, with a one-line error)
  corrupt       one byte flipped (must fail: checksum mismatch, the bad copy deleted)
  stall         the body stops halfway, the connection open, once (the read timeout ends it; must succeed)
  stall-always  every try stalls (must fail: "stalled")
  sigint        Ctrl-C at a random moment (exit 130 and "interrupted", or 0 if it came too late)
  sigkill       SIGKILL at a random moment (the body is throttled so it lands mid-download as often as not)
  corrupt+kill  one byte flipped, SIGKILL around the end of the download (when the bad copy is checked)

After every round: a pull that exited 0 printed the model and is in the store; one that failed printed
one `error:` line, last, and wrote nothing to the store; Ctrl-C exits 130; no traceback ever (but for a
Ctrl-C inside Python's own start-up, before any infer code runs, counted apart). The cache holds each
shard either complete, with the right sha256, under its snapshot name, or not at all: a partial download
only as a `*.incomplete` blob, no blob that does not hash to its name. The one exception, counted apart:
a SIGKILL after huggingface_hub put a corrupt download in place and before the pull could hash it leaves
those bytes there (the next pull must fetch them again). Whatever the store records must be the exact
bytes. Then a pull without faults must exit 0 and yield the exact bytes. Reported: rounds and outcomes
per fault, failures, leftover `.incomplete` files (from SIGKILL), seconds per round.

    python scripts/soak_pull.py [--rounds 200] [--seed 0] [--size-mb 14] [--timeout 2] [--rate-mb 12]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "acme/soak-GGUF"
SHARDS = ("soak-Q4_K_M-00001-of-00002.gguf", "soak-Q4_K_M-00002-of-00002.gguf")
# how often each fault is drawn
WEIGHTS = {"none": 12, "cut": 20, "cut-many": 6, "corrupt": 10, "stall": 10, "stall-always": 3, "sigint": 15,
           "sigkill": 15, "corrupt+kill": 9}


def _as_at_a_terminal() -> None:
    # a script started as a background job has SIGINT ignored, and children inherit that: the
    # pull would never see its Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Pull:
    rc: int
    out: str
    err: str
    seconds: float
    signalled: bool  # the signal was sent while the pull still ran


def pull(env: dict, hub, sig: int | None, kill_after: float | None) -> Pull:
    """One `infer pull`; with sig, the signal is sent kill_after seconds after the first blob GET
    (or after the start, when kill_after is negative: its absolute value)."""
    t = time.time()
    p = subprocess.Popen([sys.executable, "-m", "infer.cli", "pull", REPO], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_as_at_a_terminal)
    signalled = False
    if sig is not None:
        seen = len(hub.requests)
        at = t - kill_after if kill_after < 0 else None
        while p.poll() is None:
            if at is None and any(path.startswith("/blobs/") for _, path, _ in hub.requests[seen:]):
                at = time.time() + kill_after
            if at is not None and time.time() >= at:
                p.send_signal(sig)
                signalled = True
                break
            time.sleep(0.005)
    try:
        out, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += "\n(soak: the pull hung for 600 s and was killed)"
    return Pull(p.returncode, out, err, time.time() - t, signalled)


def clear_faults(hub) -> None:
    hub.faults.clear()
    hub.corrupt.clear()
    hub.stall.clear()
    hub.rate = None


def check_output(r: Pull) -> tuple[str, list[str]]:
    """The round's outcome in a few words, and what was wrong with how the pull ended."""
    problems = []
    if "Traceback" in r.err:
        problems.append("traceback: " + r.err.strip()[-1500:])
    last = r.err.strip().splitlines()[-1] if r.err.strip() else ""
    if r.rc == 0:
        if len(r.out.splitlines()) != 3 or not r.out.startswith(f"{REPO}:Q4_K_M\n"):
            problems.append(f"exit 0 but stdout {r.out!r}")
        return ("ok, the signal too late" if r.signalled else "ok"), problems
    if r.rc == -signal.SIGKILL:
        return "killed", problems
    if r.rc == 130:
        # typer ends a command that Ctrl-C stops with 130 and says nothing; cli/main.py says "interrupted"
        # when the Ctrl-C comes outside the command (start-up, argument parsing)
        if last not in ("", "interrupted"):
            problems.append(f"exit 130, last line {last!r}")
        return f"interrupted (130{', silent' if not last else ''})", problems
    if r.rc in (-signal.SIGINT, 1) and "/cli/" not in r.err and last in ("", "KeyboardInterrupt"):
        # Ctrl-C in Python's own start-up, before any infer code runs: Python's default handling, which no
        # program can change (nothing, or a KeyboardInterrupt traceback that names no infer file; exit 1
        # with "Fatal Python error: init_import_site" when it lands in the site module)
        problems.clear()
        return "interrupted in Python's start-up", problems
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    if r.rc != 1 or len(errors) != 1 or last != errors[0]:
        problems.append(f"exit {r.rc}, not one error line last: {r.err.strip()[-1500:]!r}")
        return f"exit {r.rc}", problems
    for words in ("checksum mismatch", "stalled", "connection kept dropping", "cannot reach"):
        if words in errors[0]:
            return f"error: {words}", problems
    return f"error: {errors[0][7:60]}", problems


def check_cache(hf_home: Path, infer_home: Path, commit: str, expect: dict[str, str],
                rc: int) -> tuple[list[str], list[str], int]:
    """Problems with the cache and the store after a pull that exited with rc; files in place with other
    bytes than the Hub's (listed apart: a pull killed before it checked a corrupt download leaves one);
    how many .incomplete files it left."""
    from infer.models.store import ModelStore

    problems, bad = [], []
    repo_dir = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    partials = 0
    blobs = repo_dir / "blobs"
    for b in sorted(blobs.iterdir()) if blobs.is_dir() else []:
        if b.name.endswith(".incomplete"):
            partials += 1
        elif b.name not in expect.values():
            problems.append(f"unexpected blob {b.name}")
        elif sha256(b) != b.name:
            bad.append(f"blob {b.name[:12]}… holds other bytes ({b.stat().st_size} bytes)")
    snapshots = repo_dir / "snapshots"
    for f in sorted(snapshots.rglob("*")) if snapshots.is_dir() else []:
        rel = f.relative_to(snapshots / commit).as_posix() if f.is_relative_to(snapshots / commit) else None
        if f.is_dir() and rel is not None:
            continue
        if rel not in expect:
            problems.append(f"unexpected snapshot entry {f.relative_to(snapshots)}")
        elif f.is_symlink() and not f.exists():
            pass  # a link whose blob was deleted (the bad copy): huggingface_hub downloads again
        elif sha256(f) != expect[rel]:
            bad.append(f"{rel} is in the snapshot with other bytes ({f.stat().st_size} bytes)")
    # The store: the model once every file is in place and checked, and only then. A pull killed after
    # it recorded the model (as it exits) may have it; one that failed on its own must not.
    models = ModelStore(infer_home).list()
    if rc == 0 and [m.name for m in models] != [f"{REPO}:Q4_K_M"]:
        problems.append(f"exit 0 but the store holds {[m.name for m in models]}")
    elif rc not in (0, -signal.SIGKILL, -signal.SIGINT, 130) and models:
        problems.append(f"a failed pull wrote {[m.name for m in models]} to the store")
    for m in models:
        if [sha256(Path(m.path).parent / n) for n in m.files] != list(expect.values()):
            problems.append(f"the store records {m.name}, but its files are not the exact bytes")
    return problems, bad, partials


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size-mb", type=float, default=14, help="the first shard (the second is a fifth of it)")
    ap.add_argument("--timeout", type=int, default=2, help="HF_HUB_DOWNLOAD_TIMEOUT, seconds (a stall lasts longer)")
    ap.add_argument("--rate-mb", type=float, default=12, help="MB/s the Hub sends at in kill rounds")
    a = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.fake_hub import FakeHub, FakeRepo

    rng = random.Random(a.seed)
    size = int(a.size_mb * 1e6) + rng.randint(0, 4095)
    data = {SHARDS[0]: rng.randbytes(size), SHARDS[1]: rng.randbytes(size // 5 + rng.randint(0, 4095))}
    expect = {n: hashlib.sha256(b).hexdigest() for n, b in data.items()}
    repo = FakeRepo(dict(data))
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    failures: list[str] = []
    leftover = 0  # .incomplete files left by killed pulls
    unchecked = 0  # rounds that left a corrupt download in place, unchecked, when killed
    t0 = time.time()
    with FakeHub({REPO: repo}) as hub, tempfile.TemporaryDirectory(prefix="soak_pull_") as tmp:
        hub.stall_seconds = a.timeout * 3 + 5  # longer than the client waits
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        base.update(HF_ENDPOINT=hub.endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DOWNLOAD_TIMEOUT=str(a.timeout))
        for i in range(a.rounds):
            kind = rng.choices(kinds, weights)[0]
            target = (REPO, rng.choice(SHARDS))
            flen = len(data[target[1]])
            clear_faults(hub)
            sig, kill_after = None, None
            if kind in ("cut", "cut-many"):
                n = rng.randint(1, 5) if kind == "cut" else 8
                hub.faults[target] = [("cut", rng.randrange(flen)) for _ in range(n)]
            elif kind.startswith("corrupt"):
                hub.corrupt.add(target)
            elif kind == "stall":
                hub.faults[target] = [("stall", rng.randrange(flen))]
            elif kind == "stall-always":
                hub.stall.add(target)
            if kind in ("sigint", "sigkill", "corrupt+kill"):
                hub.rate = a.rate_mb * 1e6
                sig = signal.SIGINT if kind == "sigint" else signal.SIGKILL
                transfer = sum(map(len, data.values())) / hub.rate
                if kind == "corrupt+kill":  # around the end of the corrupt shard's download, when it is checked
                    end = (flen if target[1] == SHARDS[0] else sum(map(len, data.values()))) / hub.rate
                    kill_after = end + rng.uniform(-0.05, 0.25)
                elif rng.random() < 0.25:  # from the start: start-up, the Hub's metadata
                    kill_after = -rng.uniform(0.0, 1.0)
                else:
                    kill_after = rng.uniform(0.0, transfer + 0.3)
            home = Path(tmp) / f"round{i}"
            env = dict(base, HF_HOME=str(home / "hf"), INFER_HOME=str(home / "infer"))
            r = pull(env, hub, sig, kill_after)
            outcome, problems = check_output(r)
            cache_problems, bad, partials = check_cache(home / "hf", home / "infer", repo.commit, expect, r.rc)
            problems += cache_problems
            if bad and kind == "corrupt+kill" and r.rc == -signal.SIGKILL:
                unchecked += 1  # the kill came before the pull could check the Hub's bad bytes: the re-run must
            else:
                problems += bad
            expected = {"none": ("ok",), "cut": ("ok",), "stall": ("ok",), "corrupt": ("error: checksum mismatch",),
                        "cut-many": ("ok", "error: connection kept dropping"), "stall-always": ("error: stalled",)}
            if kind in expected and outcome not in expected[kind]:
                problems.append(f"outcome {outcome!r}, expected {' or '.join(expected[kind])}: {r.err.strip()[-500:]}")
            leftover += partials
            # then without faults: it must complete, with the exact bytes
            clear_faults(hub)
            again = pull(env, hub, None, None)
            again_outcome, again_problems = check_output(again)
            if again_outcome != "ok":
                again_problems.append(f"the re-run without faults: {again_outcome}: {again.err.strip()[-500:]}")
            again_cache, again_bad, _ = check_cache(home / "hf", home / "infer", repo.commit, expect, again.rc)
            again_problems += again_cache + again_bad
            problems += [f"re-run: {p}" for p in again_problems]
            outcomes[kind][outcome] += 1
            seconds[kind].append(r.seconds)
            status = "ok" if not problems else "FAIL"
            print(f"round {i + 1:3d} {kind:13s} {outcome:32s} {r.seconds:5.1f} s  re-run {again.seconds:4.1f} s"
                  f"{f'  {partials} .incomplete left' if partials else ''}  {status}", flush=True)
            for p in problems:
                failures.append(f"round {i + 1} ({kind}): {p}")
                print(f"    {p}", flush=True)
            shutil.rmtree(home, ignore_errors=True)
    elapsed = time.time() - t0
    print(f"\ninfer pull soak: {a.rounds} rounds in {elapsed:.0f} s ({elapsed / a.rounds:.1f} s per round with its "
          f"re-run), seed {a.seed}, shards {len(data[SHARDS[0]]) / 1e6:.1f} + {len(data[SHARDS[1]]) / 1e6:.1f} MB, "
          f"HF_HUB_DOWNLOAD_TIMEOUT={a.timeout}, kill rounds at {a.rate_mb:g} MB/s")
    print("| fault | rounds | outcomes | median s |")
    print("|---|---:|---|---:|")
    for kind in kinds:
        if outcomes[kind]:
            print(f"| {kind} | {sum(outcomes[kind].values())} | "
                  f"{', '.join(f'{o} {n}' for o, n in outcomes[kind].most_common())} | "
                  f"{statistics.median(seconds[kind]):.1f} |")
    print(f".incomplete files left behind (SIGKILL mid-download; huggingface_hub never reuses them): {leftover}")
    print(f"corrupt downloads left in place unchecked by a SIGKILL (each fetched again by the re-run): {unchecked}")
    print(f"failures: {len(failures)}")
    for f in failures:
        print(f"  {f}")
    print("OK" if not failures else "FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
