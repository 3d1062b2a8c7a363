"""An LLM ready to generate: model weights on a backend, its tokenizer and chat template."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from infer.backends.base import BackendError, RunnerOptions
from infer.backends.registry import choose_backend, create_runner, probe_all
from infer.models.loader import load_model
from infer.models.weights import Model

from .chat_template import ChatTemplate, load_chat_template
from .engine import Engine, EngineConfig, Event
from .hf_tokenizer import HFTokenizer
from .rerank import rerank_prompt, rerank_template
from .sampler import SamplingParams
from .tokenizer import Tokenizer

__all__ = ["LLM", "BackendError", "choose_backend", "load_warm", "probe_all"]  # the CLI reaches backends through here


class LLM:
    def __init__(self, model: Model, config: EngineConfig = EngineConfig()):
        model = model.for_context(min(config.n_ctx, model.config.n_ctx_train))
        self.model = model
        self.config = config
        self.tokenizer = _tokenizer(model)
        self.backend = choose_backend(config.backend, model.format, model.config.state_shapes)
        options = _runner_options(config, model.config.causal)
        self.runner = create_runner(self.backend, model, options)
        drafter = _drafter(config, self.tokenizer, self.backend, options) if config.spec.kind == "draft" else None
        self.engine = Engine(self.runner, self.tokenizer, model.config, config, model_key=str(model.path).encode(),
                             drafter=drafter, head=model.weights.head)
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

    def override_template(self, source: str) -> None:
        """Render chats with source, not the model's template (serve's --chat-template); one that
        does not compile, or fails on a one-message chat, is a ChatTemplateError and changes nothing."""
        template = ChatTemplate(source, self.template.bos_token, self.template.eos_token)
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        self.template = template

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

    def encode_rerank(self, query: str, document: str) -> list[int]:
        """The prompt a reranker scores `document` by (engine/rerank.py)."""
        return rerank_prompt(self.tokenizer, rerank_template(self.model.metadata), query, document)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Event]:
        """Stream one request through the engine (other requests may share its steps)."""
        return self.engine.generate(prompt_ids, params)


def _runner_options(config: EngineConfig, causal: bool = True) -> RunnerOptions:
    """The runner's options; a pass takes up to 512 tokens (a longer prompt is fed in chunks), or a
    non-causal model's (an encoder's, whose input is one pass) up to max_batch_tokens."""
    return RunnerOptions(n_threads=config.n_threads or os.cpu_count() or 1,
                         max_tokens=min(config.max_batch_tokens, 512) if causal else config.max_batch_tokens,
                         gpu_layers=config.gpu_layers,
                         max_seqs=config.max_seqs, mmap=config.mmap, mlock=config.mlock,
                         cache_type_k=config.cache_type_k, cache_type_v=config.cache_type_v)


def load_warm(path: str | Path, config: EngineConfig = EngineConfig(),
              on_start: Callable[[int, int], None] = lambda n_kernels, n_processes: None,
              on_done: Callable[[int], None] = lambda n: None) -> LLM:
    """LLM.load(path, config) and its runner's warmup, so that the first request compiles nothing.

    On the cpu backend, with cores to spare, a load that would compile a kernel (a first run, a
    new quant type) stops there; the kernels the load and warmup need that numba's cache lacks
    then compile ahead in worker processes (backends/cpu/compiling.py: on_start(kernels,
    processes), on_done(n finished)), and the load starts again.  A load that finds them all
    cached pays nothing for this."""
    from infer.backends.cpu.compiling import MAX_WORKERS, WouldCompile, compile_ahead, stop_before_compiling

    options = _runner_options(config)
    workers = min(options.n_threads, os.cpu_count() or 1, MAX_WORKERS)
    if workers >= 2:
        try:
            with stop_before_compiling():
                llm = LLM.load(path, config)
                llm.runner.warmup()
            return llm
        except WouldCompile:
            pass
        # the dry run loads the model for itself: uploading to the cpu backend releases the raw
        # weights of the model it is given as it repacks them
        model = load_model(path)
        if choose_backend(config.backend, model.format, model.config.state_shapes) == "cpu":
            own = _runner_options(config, model.config.causal)
            compile_ahead((lambda: _tokenizer(model), lambda: create_runner("cpu", model, own).warmup()), workers,
                          on_start, lambda job, n: on_done(n))
    llm = LLM.load(path, config)
    llm.runner.warmup()
    return llm


def _drafter(config: EngineConfig, tokenizer, backend: str, options: RunnerOptions):
    """The draft model of --spec draft, on the target's backend, if its vocabulary is the target's."""
    from .draft import DraftModel
    from .speculative import SpeculationError

    draft = load_model(config.spec.draft)
    draft = draft.for_context(min(config.n_ctx, draft.config.n_ctx_train))
    _same_vocabulary(tokenizer, _tokenizer(draft), SpeculationError)
    runner = create_runner(choose_backend(backend, draft.format), draft, options)
    return DraftModel(runner, draft.config, min(config.n_ctx, draft.config.n_ctx_train), config.max_seqs,
                      config.block_size, config.spec.draft_max, config.spec.draft_min, config.spec.draft_p_min,
                      target_vocab=tokenizer.vocab_size)


def _same_vocabulary(target, draft, error: type[Exception]) -> None:
    """llama.cpp's rule (common_speculative_are_compatible): the same special tokens, sizes within
    128, the same text for every token id both have (from 5 on)."""
    if (target.bos_id, target.eos_id, target.add_bos, target.add_eos) != (draft.bos_id, draft.eos_id, draft.add_bos,
                                                                          draft.add_eos):
        raise error(f"the draft model's BOS/EOS and whether it adds them ({draft.bos_id}/{draft.eos_id}) are not the "
                    f"target's ({target.bos_id}/{target.eos_id}): --draft needs a model of the same vocabulary")
    if abs(target.vocab_size - draft.vocab_size) > 128:
        raise error(f"the draft model's vocabulary has {draft.vocab_size} tokens, the target's {target.vocab_size}: "
                    "--draft needs a model of the same vocabulary")
    for i in range(5, min(target.vocab_size, draft.vocab_size)):
        if target.token_text(i) != draft.token_text(i):
            raise error(f"token {i} is {draft.token_text(i)!r} in the draft model but {target.token_text(i)!r} in the "
                        "target: --draft needs a model of the same vocabulary")


def _tokenizer(model: Model) -> Tokenizer | HFTokenizer:
    """A GGUF's vocabulary from its metadata; a model folder's tokenizer.json (MLX format)."""
    if model.format == "mlx":
        return HFTokenizer.from_folder(model.path, n_vocab=model.config.n_vocab, architecture=model.config.arch)
    return Tokenizer.from_metadata(model.metadata)
