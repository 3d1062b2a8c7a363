"""From what the user typed to a model file: a .gguf path, or nothing for the embedded default."""
from __future__ import annotations

from pathlib import Path

from .default import default_model_path


class ModelNotFoundError(ValueError):
    """No model by that name or path."""


def resolve_model(name: str | None) -> Path:
    if not name:
        return default_model_path()
    path = Path(name).expanduser()
    if path.exists():
        return path
    raise ModelNotFoundError(f"model {name!r} not found: give the path of a .gguf file, or omit MODEL for the default")
