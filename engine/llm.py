"""An LLM ready to generate: model weights on a backend, its tokenizer and chat template."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from infer.models.loader import Model, load_model

from .chat_template import load_chat_template
from .generate import Chunk, generate
from .sampler import SamplingParams
from .tokenizer import Tokenizer

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = DEFAULT_CTX  # capped at the model's training context
    n_threads: int = 0  # 0: every core
    backend: str = "cpu"

    def __post_init__(self) -> None:
        if self.n_ctx < 8:
            raise ValueError(f"--ctx must be at least 8, got {self.n_ctx}")
        if self.n_threads < 0:
            raise ValueError(f"--threads must be positive, got {self.n_threads}")
        if self.backend != "cpu":
            raise ValueError(f"unknown backend {self.backend!r} (available: cpu)")


class LLM:
    def __init__(self, model: Model, config: EngineConfig = EngineConfig()):
        from infer.backends.cpu.transformer import CpuTransformer

        self.model = model
        self.config = config
        self.n_ctx = min(config.n_ctx, model.config.n_ctx_train)
        self.tokenizer = Tokenizer.from_metadata(model.metadata)
        self.runner = CpuTransformer(model.config, model.weights, n_threads=config.n_threads or os.cpu_count())
        tok = self.tokenizer
        self.template = load_chat_template(
            model.metadata.get("tokenizer.chat_template"),
            model.config.arch,
            str(model.metadata.get("tokenizer.ggml.model", "")),
            model.metadata.get("tokenizer.ggml.pre"),
            tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
            tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
        )

    @classmethod
    def load(cls, path: str | Path, config: EngineConfig = EngineConfig()) -> "LLM":
        return cls(load_model(path), config)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Render messages with the chat template and tokenize, special tokens parsed."""
        text = self.template.render(messages, add_generation_prompt=True)
        tok = self.tokenizer
        ids = tok.encode(text, add_special=True, parse_special=True)
        # Templates usually write BOS themselves; llama.cpp would then have two.
        if tok.bos_id is not None and len(ids) > 1 and ids[0] == ids[1] == tok.bos_id:
            ids = ids[1:]
        return ids

    def encode_raw(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True, parse_special=False)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        return generate(self.runner, self.tokenizer, prompt_ids, params, self.n_ctx)
