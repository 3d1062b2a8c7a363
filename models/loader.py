"""Loading a model: GGUF metadata to config, tensors checked against what the architecture needs."""
from __future__ import annotations

from pathlib import Path

from .config import ModelConfig, ModelConfigError
from .gguf_file import GGUFError, GGUFFile, read_gguf
from .mlx_folder import load_mlx_folder
from .weights import Model, ModelLoadError, collect_weights


def load_model(path: str | Path) -> Model:
    """A GGUF file, or a model folder (MLX / HF safetensors: see mlx_folder.py)."""
    if Path(path).is_dir():
        return load_mlx_folder(path)
    try:
        gguf = read_gguf(path)
        config = ModelConfig.from_metadata(gguf.metadata, n_vocab=_vocab_size(gguf))
        weights = collect_weights(gguf.tensors, gguf.path, config)
    except (GGUFError, ModelLoadError) as e:
        raise ModelLoadError(str(e)) from None
    except (ModelConfigError, ValueError) as e:
        raise ModelLoadError(f"{path}: {e}") from None
    return Model(Path(path), config, gguf.metadata, weights)


def _vocab_size(gguf: GGUFFile) -> int:
    t = gguf.tensors.get("token_embd.weight")
    if t is None:
        raise ModelLoadError(f"{gguf.path}: missing tensor 'token_embd.weight'")
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != t.shape[0]:  # llama.cpp sizes the embedding by the vocabulary
        raise ModelLoadError(f"{gguf.path}: tensor 'token_embd.weight' has {t.shape[0]} rows but the vocabulary "
                             f"has {len(tokens)} tokens")
    return t.shape[0]
