"""An LLM ready to generate: model weights on a backend, its tokenizer and chat template."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from infer.backends.base import BackendError, RunnerOptions
from infer.backends.registry import choose_backend, create_runner, probe_all

from infer.models.loader import load_model
from infer.models.weights import Model

from .chat_template import load_chat_template
from .engine import Engine, EngineConfig, Event
from .hf_tokenizer import HFTokenizer
from .sampler import SamplingParams
from .tokenizer import Tokenizer

__all__ = ["LLM", "BackendError", "choose_backend", "probe_all"]  # the CLI reaches backends through here


class LLM:
    def __init__(self, model: Model, config: EngineConfig = EngineConfig()):
        model = model.for_context(min(config.n_ctx, model.config.n_ctx_train))
        self.model = model
        self.config = config
        self.tokenizer = _tokenizer(model)
        self.backend = choose_backend(config.backend, model.format)
        options = RunnerOptions(n_threads=config.n_threads or os.cpu_count() or 1,
                                max_tokens=min(config.max_batch_tokens, 512), gpu_layers=config.gpu_layers,
                                max_seqs=config.max_seqs, mmap=config.mmap, mlock=config.mlock,
                                cache_type_k=config.cache_type_k, cache_type_v=config.cache_type_v)
        self.runner = create_runner(self.backend, model, options)
        self.engine = Engine(self.runner, self.tokenizer, model.config, config, model_key=str(model.path).encode())
        tok = self.tokenizer
        # The model's own template (GGUF metadata, or the folder's tokenizer_config.json /
        # chat_template.jinja), else infer's built-in one for the architecture.
        self.template = load_chat_template(
            tok.chat_template,
            model.config.arch,
            tok.model_type,
            tok.pre,
            tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
            tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
        )

    @classmethod
    def load(cls, path: str | Path, config: EngineConfig = EngineConfig()) -> "LLM":
        return cls(load_model(path), config)

    def encode_chat(self, messages: list[dict], **variables) -> list[int]:
        """Render messages with the chat template and tokenize, special tokens parsed; variables
        (tools=..., enable_thinking=...) go to the template."""
        text = self.template.render(messages, add_generation_prompt=True, **variables)
        tok = self.tokenizer
        ids = tok.encode(text, add_special=True, parse_special=True)
        # Templates usually write BOS themselves; llama.cpp would then have two.
        if tok.bos_id is not None and len(ids) > 1 and ids[0] == ids[1] == tok.bos_id:
            ids = ids[1:]
        return ids

    def encode_raw(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True, parse_special=False)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Event]:
        """Stream one request through the engine (other requests may share its steps)."""
        return self.engine.generate(prompt_ids, params)


def _tokenizer(model: Model) -> Tokenizer | HFTokenizer:
    """A GGUF's vocabulary from its metadata; a model folder's tokenizer.json (MLX format)."""
    if model.format == "mlx":
        return HFTokenizer.from_folder(model.path, n_vocab=model.config.n_vocab, architecture=model.config.arch)
    return Tokenizer.from_metadata(model.metadata)
