"""The registry: the only list of the architectures infer runs. Everything about one architecture
lives in its module (llama.py, ...); consumers look it up here by its GGUF name or, for Hugging
Face folders, by config.json's model_type."""
from __future__ import annotations

from types import MappingProxyType

from infer.quant.errors import InferError

from ..hf_files import ConvertError
from . import gemma2, gemma3, gpt_oss, granite, llama, olmo2, phi3, qwen2, qwen3, qwen3moe
from .spec import Architecture

__all__ = ["Architecture", "UnknownArchitecture", "architecture", "names", "for_hf_model_type", "hf_model_types"]

_MODULES = (llama, qwen2, qwen3, gemma3, gemma2, olmo2, granite, phi3, qwen3moe, gpt_oss)
_BY_NAME = MappingProxyType({m.ARCHITECTURE.name: m.ARCHITECTURE for m in _MODULES})


class UnknownArchitecture(InferError, ValueError):
    """An architecture (GGUF general.architecture) infer does not run."""


def names() -> tuple[str, ...]:
    """The supported architectures' GGUF names."""
    return tuple(_BY_NAME)


def architecture(name: str) -> Architecture:
    """The architecture of that GGUF name; UnknownArchitecture (one line naming the supported ones) if none."""
    arch = _BY_NAME.get(name)
    if arch is None:
        raise UnknownArchitecture(f"unsupported architecture {name!r} (supported: {', '.join(names())})")
    return arch


def hf_model_types() -> tuple[str, ...]:
    """The config.json model_type values the HF converter takes."""
    return tuple(t for a in _BY_NAME.values() for t in a.hf_model_types)


def for_hf_model_type(model_type: object, where: object) -> Architecture:
    """The architecture a Hugging Face config.json's model_type converts to; ConvertError if none."""
    for a in _BY_NAME.values():
        if model_type in a.hf_model_types:
            return a
    classes = ", ".join(a.hf_class for a in _BY_NAME.values() if a.hf_model_types)
    raise ConvertError(f"{where}: unsupported model_type {model_type!r} "
                       f"(supported: {', '.join(hf_model_types())}; architectures {classes})")
