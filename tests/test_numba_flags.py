"""No compiled kernel takes another's fastmath, read from the source.

numba compiles a function that does not set fastmath itself with the flags of the caller that
compiles it first (numba's Flags.inherit_if_not_set), and its on-disk cache keeps that variant
for every later caller. A kernel reached from a fastmath function would then compute with or
without reassociation and fused multiply-adds depending on which code ran first in the process
that filled the cache: infer's numbers would change between a fresh install and a warm cache.
(The RoPE of ops.heads_post did, and the per-head norm it calls could have: issue 41.)  So every
njit function a fastmath function reaches, directly or through functions inlined into it, must
set fastmath explicitly.  Functions inlined by numba (inline="always") take their caller's flags
at each call site, the same every time: they are followed, not required to set the flag.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIRS = ("backends", "quant")


@dataclass
class Kernel:
    where: str
    fastmath: bool | None  # None: not set by the decorator
    inline: bool
    calls: set[str] = field(default_factory=set)


def _kwargs(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _decorated(fn: ast.FunctionDef) -> tuple[bool, bool | None, bool] | None:
    """(compiled, fastmath or None, inline) from fn's numba decorator, or None if it has none."""
    for d in fn.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        name = (call.func if call else d)
        name = name.id if isinstance(name, ast.Name) else getattr(name, "attr", "")
        kw = _kwargs(call) if call else {}
        if name == "njit":
            fm = kw.get("fastmath")
            inline = isinstance(kw.get("inline"), ast.Constant) and kw["inline"].value == "always"
            return True, (bool(fm.value) if isinstance(fm, ast.Constant) else None), inline
        if name == "overload":  # an implementation compiled with jit_options, and inlined nowhere
            opts = kw.get("jit_options")
            fm = None
            if isinstance(opts, ast.Dict):
                for k, v in zip(opts.keys, opts.values):
                    if isinstance(k, ast.Constant) and k.value == "fastmath" and isinstance(v, ast.Constant):
                        fm = bool(v.value)
            return True, fm, False
    return None


def _kernels() -> dict[str, list[Kernel]]:
    out: dict[str, list[Kernel]] = {}
    for part in KERNEL_DIRS:
        for path in sorted((ROOT / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef) or (info := _decorated(node)) is None:
                    continue
                _, fm, inline = info
                calls = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                         for c in ast.walk(node) if isinstance(c, ast.Call)
                         and isinstance(c.func, (ast.Name, ast.Attribute))}
                out.setdefault(node.name, []).append(
                    Kernel(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", fm, inline, calls))
    return out


def test_no_kernel_inherits_fastmath():
    kernels = _kernels()
    assert any(k.fastmath for ks in kernels.values() for k in ks), "no fastmath kernel found: is the scan broken?"
    bad = set()
    for ks in kernels.values():
        for root in (k for k in ks if k.fastmath):
            todo, seen = [root], set()
            while todo:
                k = todo.pop()
                for name in k.calls:
                    for callee in kernels.get(name, []):
                        if callee.where in seen or callee is root:
                            continue
                        seen.add(callee.where)
                        if callee.inline:
                            todo.append(callee)  # compiled into the caller: its calls are the caller's
                        elif callee.fastmath is None:
                            bad.add(f"{callee.where} (reached from the fastmath {root.where}) does not set fastmath")
    assert not bad, sorted(bad)


def test_the_scan_finds_an_inheriting_kernel(tmp_path, monkeypatch):
    """The check can fail: a fastmath kernel calling one that sets nothing is reported."""
    pkg = tmp_path / "quant"
    pkg.mkdir()
    (pkg / "k.py").write_text(
        "from numba import njit\n\n"
        "@njit(cache=True)\ndef plain(x):\n    return x * 2.0 + 1.0\n\n"
        "@njit(cache=True, inline='always')\ndef via(x):\n    return plain(x)\n\n"
        "@njit(cache=True, fastmath=True)\ndef fast(x):\n    return via(x)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "KERNEL_DIRS", ("quant",))
    kernels = _kernels()
    assert kernels["fast"][0].fastmath and kernels["plain"][0].fastmath is None and kernels["via"][0].inline
    try:
        test_no_kernel_inherits_fastmath()
    except AssertionError as e:
        assert "plain" in str(e)
    else:
        raise AssertionError("the inheriting kernel was not reported")
