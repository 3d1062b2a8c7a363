"""The README stays true: its generated tables are what the code holds (scripts/readme_tables.py),
every `infer` command it shows names a real command and real flags, and the lines that CI, the
tests and the scripts read from it are still there."""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["architectures", "backends", "routes"])
def test_readme_tables_are_current(name):
    tables = _script("readme_tables")
    assert tables.block(name) in README.read_text(encoding="utf-8"), "run scripts/readme_tables.py"


def _shell_lines() -> list[str]:
    """The lines of the README's bash blocks."""
    lines, inside = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            continue
        if inside:
            lines.append(line)
    return lines


def _inline_commands() -> list[str]:
    """The `infer ...` commands quoted in the README's prose (a placeholder such as COMMAND aside)."""
    text = README.read_text(encoding="utf-8")
    return [m for m in re.findall(r"`((?:echo [^`|]*\| )?infer [^`]*)`", text) if not re.search(r"infer [A-Z]", m)]


def _infer_calls() -> list[list[str]]:
    """Each `infer ...` command of the bash blocks and the prose as words, comments and environment
    settings left out, pipes and && split apart."""
    calls = []
    for line in _shell_lines() + _inline_commands():
        words = shlex.split(line, comments=True)
        part: list[str] = []
        for w in words + ["|"]:
            if w in ("|", "&&"):
                while part and re.fullmatch(r"[A-Z_]+=.*", part[0]):
                    part.pop(0)
                if part and part[0] == "infer":
                    calls.append(part)
                part = []
            else:
                part.append(w)
    return calls


def _commands() -> dict:
    """The `infer` commands by name, as click sees them (what `infer COMMAND --help` prints)."""
    import typer

    from infer.cli.main import register_commands

    register_commands()
    from infer.cli.app import app

    return typer.main.get_command(app).commands


def test_readme_commands_are_real():
    commands = _commands()
    calls = _infer_calls()
    assert len(calls) > 20, calls
    bad = []
    for words in calls:
        name = words[1]
        if name not in commands:
            bad.append(f"{' '.join(words)}: no command {name!r}")
            continue
        flags = {o for p in commands[name].params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        ours = words[2:words.index("--")] if "--" in words else words[2:]  # after --: another program's words
        bad += [f"{' '.join(words)}: no flag {w}" for w in ours
                if w.startswith("-") and w != "-" and w.split("=")[0] not in flags]
    assert not bad, bad


def test_readme_flags_are_real():
    """Every flag the README's prose names (`--spec ngram`, `-ctk/-ctv`) is some command's flag."""
    flags = {o for c in _commands().values() for p in c.params for o in (*p.opts, *p.secondary_opts)}
    others = {"--help", "-e", "--no-deps", "-m"}  # click's own, pip's and pytest's
    named = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", README.read_text(encoding="utf-8")))
    assert not named - flags - others, sorted(named - flags - others)


def test_readme_keeps_what_others_read():
    """.ci/run runs "the README's test command"; tests/test_default_model.py asks the README's
    first question; scripts/bench_spec.py quotes 1200 characters from the serving passage."""
    text = README.read_text(encoding="utf-8")
    lines = _shell_lines()
    assert "pip install -e '.[test]' && python -m pytest" in lines
    assert 'pip install . && infer run "Why is the sky blue?"' in lines[0]
    assert len(text) - text.index("An OpenAI-compatible endpoint") >= 1200
    assert 'python -m pytest -m "not slow"' in text
