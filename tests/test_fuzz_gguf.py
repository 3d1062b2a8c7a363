"""Hostile GGUF files (tests/gguf_fuzz.py): valid tiny models of every architecture with mutated
counts, lengths, types, dimensions, offsets, alignments and token ids, bit flips, truncations and
appended bytes, each loaded and run by a worker process. Every one must end as a clean run or a
one-line error: no traceback reaching the user, no crash, no hang. A bounded budget here;
scripts/fuzz_gguf.py runs tens of thousands."""
from __future__ import annotations

import random

from gguf_fuzz import mutate, run_cases, seeds

CASES = 300


def test_mutated_models_fail_cleanly(tmp_path):
    originals = [p.read_bytes() for p in seeds(tmp_path)]
    cases = []
    for i in range(CASES):
        p = tmp_path / f"case-{i:04d}.gguf"
        p.write_bytes(mutate(originals[i % len(originals)], random.Random(f"ci-{i}")))
        cases.append(p)
    results = run_cases(cases, timeout=120)
    bad = [(p.name, answer) for p, answer in results if not answer.startswith(("OK", "ERR "))]
    assert not bad, bad  # RUN too: a forward pass failing means the loader let a bad file through
    kinds = {answer.split(" ", 1)[0] for _, answer in results}
    assert kinds == {"OK", "ERR"}  # the mutations both break files and leave some loadable


def test_the_harness_tells_crashes_hangs_and_tracebacks(tmp_path):
    """The harness itself, so that a clean fuzz run means something: a worker killed by a signal,
    one that stops answering, an unexpected exception, a clean error, in one run."""
    paths = [tmp_path / n for n in ("a.selftest-crash", "b.selftest-hang", "c.selftest-tb", "missing.gguf")]
    answers = [a for _, a in run_cases(paths, timeout=5)]
    assert answers[0] == "CRASH -11" and answers[1] == "HANG" and answers[2].startswith("TB ")
    assert answers[3].startswith("ERR ")
