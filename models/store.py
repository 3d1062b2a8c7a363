"""The local model store: one JSON manifest per pulled model, the files themselves in the Hugging Face cache.

Manifests live under `infer_home() / "store"`; the weights stay where huggingface_hub put them
(`HF_HOME` / `HF_HUB_CACHE`), so a model pulled here is also usable by other HF tools, and removing
it deletes only the snapshot links and blobs that nothing else still uses.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from infer.quant.errors import InferError

from .default import infer_home

DEFAULT_QUANT = "Q4_K_M"
FORMATS = ("gguf", "mlx", "safetensors")
# Hugging Face repo ids: owner/name of letters, digits, '-', '_', '.'; an optional ':QUANT' tag.
_NAME = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?", re.ASCII)


class ModelNotFoundError(InferError, ValueError):
    """No model by that name or path."""


@dataclass(frozen=True)
class StoredModel:
    name: str  # canonical: "owner/repo:Q4_K_M" for GGUF, "owner/repo" for MLX / safetensors
    repo: str
    quant: str | None  # GGUF quant tag upper-case, e.g. "Q4_K_M"; None otherwise
    revision: str  # the commit sha the files came from
    format: str  # "gguf" | "mlx" | "safetensors"
    path: str  # absolute path: the GGUF file (first shard of a split GGUF) or the snapshot folder
    files: tuple[str, ...]  # repo-relative file names pulled
    size: int  # bytes
    pulled_at: str  # ISO-8601 UTC

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = list(self.files)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StoredModel":
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not names <= set(d):
            raise ValueError("manifest lacks fields")
        kw = {k: d[k] for k in names}
        kw["files"] = tuple(str(f) for f in kw["files"])
        kw["size"] = int(kw["size"])
        return cls(**kw)


def parse_name(name: str) -> tuple[str, str | None]:
    """'owner/repo:q4_k_m' -> ('owner/repo', 'Q4_K_M'); 'owner/repo' -> ('owner/repo', None)."""
    m = _NAME.fullmatch(name.strip())
    if not m:
        raise ModelNotFoundError(f"{name!r} is not a model name (names look like owner/repo or owner/repo:Q4_K_M)")
    quant = m.group("quant")
    return m.group("repo"), quant.upper() if quant else None


def looks_like_name(name: str) -> bool:
    return _NAME.fullmatch(name.strip()) is not None and not name.lower().endswith(".gguf")


def canonical_name(repo: str, quant: str | None) -> str:
    return f"{repo}:{quant.upper()}" if quant else repo


class ModelStore:
    def __init__(self, home: Path | None = None):
        self.dir = Path(home if home is not None else infer_home()) / "store"

    def _manifest(self, name: str) -> Path:
        repo, quant = parse_name(name)
        # HF forbids '--' in owner and repo names, so this file name is unambiguous (as in the HF cache).
        stem = repo.replace("/", "--") + (f"--{quant}" if quant else "")
        return self.dir / f"{stem}.json"

    def _read(self, path: Path) -> StoredModel | None:
        """A manifest, or None for a file that is missing or not one of ours (never half-written: see add)."""
        try:
            return StoredModel.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def add(self, m: StoredModel) -> None:
        """Record m, replacing an entry of the same name; written to a temp file and renamed into place."""
        if m.format not in FORMATS:
            raise ValueError(f"unknown model format {m.format!r} (expected one of {', '.join(FORMATS)})")
        target = self._manifest(m.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(m.to_json(), indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, name: str) -> StoredModel | None:
        """The entry for "owner/repo:quant" (quant case-insensitive), or for a bare "owner/repo": its
        MLX/safetensors entry, else its only GGUF quant, else its Q4_K_M one; None when none fits."""
        try:
            repo, quant = parse_name(name)
        except ModelNotFoundError:
            return None
        m = self._read(self._manifest(canonical_name(repo, quant)))
        if m is not None or quant is not None:
            return m
        quants = [e for e in self.list() if e.repo == repo]
        if len(quants) == 1:
            return quants[0]
        return next((e for e in quants if e.quant == DEFAULT_QUANT), None)

    def list(self) -> list[StoredModel]:
        """Every readable manifest, sorted by name (leftover temp files and foreign files are skipped)."""
        if not self.dir.is_dir():
            return []
        found = (self._read(p) for p in self.dir.glob("*.json"))
        return sorted((m for m in found if m is not None), key=lambda m: m.name)

    def remove(self, name: str) -> StoredModel:
        """Forget a model and delete its files from the HF cache, keeping what other entries still use."""
        m = self.get(name)
        if m is None:
            raise ModelNotFoundError(self.unknown_message(name))
        others = [e for e in self.list() if e.name != m.name]
        _delete_files(m, others)
        # Files first, manifest last: an interrupted rm can simply be run again.
        self._manifest(m.name).unlink(missing_ok=True)
        return m

    def unknown_message(self, name: str) -> str:
        """Why `name` matched no entry: not pulled, or a repo with several quants and none chosen."""
        try:
            repo, quant = parse_name(name)
        except ModelNotFoundError as e:
            return str(e)
        same_repo = [e for e in self.list() if e.repo == repo]
        if quant is None and len(same_repo) > 1:
            tags = ", ".join(e.quant or "(no quant)" for e in same_repo)
            return f"{repo} has several pulled quants ({tags}): name one, e.g. {same_repo[0].name}"
        return f"model {name!r} not found: not pulled yet (get it with: infer pull {name}; see infer list)"


def _snapshot_dir(m: StoredModel) -> Path | None:
    """The HF cache snapshot folder holding m's files, when m's path lies in one."""
    path = Path(m.path)
    if m.format != "gguf":
        snap = path
    else:
        rel = next((f for f in m.files if path.as_posix().endswith("/" + f)), None)
        if rel is None:
            return None
        snap = path.parents[len(Path(rel).parts) - 1]
    if snap.parent.name != "snapshots" or not snap.parent.parent.name.startswith("models--"):
        return None  # not an HF cache layout: never delete files we cannot account for
    return snap


def _delete_files(m: StoredModel, others: list[StoredModel]) -> None:
    snap = _snapshot_dir(m)
    if snap is None:
        return
    repo_dir = snap.parent.parent
    still_listed = {os.path.abspath(Path(_snapshot_dir(o) or "/nonexistent") / f) for o in others for f in o.files}
    candidates = set()
    for rel in m.files:
        link = snap / rel
        if os.path.abspath(link) in still_listed or not os.path.lexists(link):
            continue
        if link.is_symlink():
            candidates.add(os.path.realpath(link))
        link.unlink()
        _prune_empty(link.parent, stop=snap.parent)
    # A blob goes only when no link in this repo's snapshots (ours or anyone's) points at it any more.
    in_use = {os.path.realpath(p) for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink()}
    blobs = repo_dir / "blobs"
    for blob in candidates - in_use:
        if Path(blob).parent == blobs:
            Path(blob).unlink(missing_ok=True)
    snapshots = repo_dir / "snapshots"
    if snapshots.is_dir() and not any(snapshots.iterdir()):
        shutil.rmtree(repo_dir)  # no snapshot left: refs and orphan blobs describe nothing


def _prune_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
