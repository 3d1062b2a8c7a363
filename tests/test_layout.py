"""The package's import rules, read from the source: parts import one way (cli -> engine -> models,
backends -> quant), no module imports another that imports it back, and no private name is
imported across modules."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("cli", "engine", "models", "backends", "quant")
ALLOWED = {  # part -> the other parts it may import
    "cli": {"engine", "models", "backends", "quant"},
    "engine": {"models", "backends", "quant"},
    "models": {"quant"},
    "backends": {"quant"},
    "quant": set(),
}


def _modules() -> dict[str, Path]:
    out = {}
    for part in PARTS:
        for f in (ROOT / part).rglob("*.py"):
            rel = f.relative_to(ROOT / part).with_suffix("")
            out[".".join(["infer", part, *rel.parts]).removesuffix(".__init__")] = f
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import in the file, at any depth
    (imports inside functions count: they make cycles all the same)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in known else (target, alias.name))
        elif isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
    return [(m, n) for m, n in out if m in known and m != name]


def _graph():
    known = _modules()
    return known, {m: _imports(m, f, known) for m, f in known.items()}


def test_parts_import_one_way():
    _, graph = _graph()
    bad = sorted({f"{m} -> {t}" for m, deps in graph.items() for t, _ in deps
                  if t.split(".")[1] != m.split(".")[1] and t.split(".")[1] not in ALLOWED[m.split(".")[1]]})
    assert not bad, bad


def test_no_import_cycles():
    _, graph = _graph()
    edges = {m: {t for t, _ in deps} for m, deps in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_no_private_names_across_modules():
    _, graph = _graph()
    bad = sorted(f"{m} imports {t}.{n}" for m, deps in graph.items() for t, n in deps
                 if n is not None and n.startswith("_") and not n.startswith("__"))
    assert not bad, bad
