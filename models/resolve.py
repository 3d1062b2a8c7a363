"""From what the user typed to a model: a .gguf path, a model folder, a pulled name, or nothing (the default).

An existing path wins over a pulled name of the same spelling; names are looked up in the store
(`owner/repo:QUANT`, or `owner/repo`: see ModelStore.get).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .default import DefaultModelUnavailable, default_chat_model_path, default_model_path
from .store import ModelNotFoundError, ModelStore, StoredModel, looks_like_name

__all__ = ["LocatedModel", "ModelNotFoundError", "default_model", "locate_model", "resolve_model"]


@dataclass(frozen=True)
class LocatedModel:
    path: Path  # the GGUF file, or the MLX / safetensors folder
    format: str  # "gguf" | "mlx" | "safetensors"
    stored: StoredModel | None = None  # the store entry, when MODEL was a pulled name
    note: str = ""  # what the user should hear about this choice (the default could not be had)

    @property
    def name(self) -> str:
        return self.stored.name if self.stored else self.path.name


def default_model() -> LocatedModel:
    """The default chat model, or where it cannot be had (offline on first use) the embedded
    Gemma base model, with a note saying so and how to get the default."""
    try:
        return LocatedModel(default_chat_model_path(), "gguf")
    except DefaultModelUnavailable as e:
        return LocatedModel(default_model_path(), "gguf",
                            note=f"{e}; using the embedded Gemma 3 270M base model, which continues text "
                                 f"rather than answering")


def locate_model(name: str | None, store: ModelStore | None = None) -> LocatedModel:
    if not name:
        return default_model()
    path = Path(name).expanduser()
    if path.is_dir():
        return _locate_folder(path)
    if path.exists():
        return LocatedModel(path, "gguf")
    if looks_like_name(name):
        store = store if store is not None else ModelStore()
        m = store.get(name)
        if m is not None:
            return LocatedModel(Path(m.path), m.format, m)
        raise ModelNotFoundError(store.unknown_message(name))
    raise ModelNotFoundError(f"model {name!r} not found: no such file, and not a pulled model name "
                             f"(owner/repo or owner/repo:Q4_K_M; see infer list)")


def resolve_model(name: str | None, store: ModelStore | None = None) -> Path:
    """What to load for MODEL: a GGUF file, or an MLX / safetensors model folder (load_model reads
    both; a folder runs on the MLX backend)."""
    found = locate_model(name, store)
    if not found.path.exists():
        raise ModelNotFoundError(f"{found.name}: its file {found.path} is gone (infer rm it, then pull it again)")
    return found.path


def _locate_folder(folder: Path) -> LocatedModel:
    ggufs = sorted(folder.glob("*.gguf"))
    # A split GGUF is named by its first shard (…-00001-of-0000N.gguf), which sorts first.
    firsts = [p for p in ggufs if "-of-" not in p.name or "-00001-of-" in p.name]
    if len(firsts) == 1:
        return LocatedModel(firsts[0], "gguf")
    if len(firsts) > 1:
        raise ModelNotFoundError(f"{folder}: holds {len(firsts)} GGUF files; name the one to use")
    config = folder / "config.json"
    if config.is_file():
        try:
            quantized = "quantization" in json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            quantized = False
        # MLX's quantized checkpoints carry a "quantization" section; otherwise it is plain safetensors.
        return LocatedModel(folder, "mlx" if quantized else "safetensors")
    raise ModelNotFoundError(f"{folder}: no .gguf file and no config.json in this folder")
