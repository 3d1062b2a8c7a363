"""`infer` as a user runs it: the CLI in a subprocess (offline), and the shape every user-facing
error must have: exit code 1, one line on stderr, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys


def infer(*args: str, input: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True,
                          input=input, timeout=timeout, env=env)


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
