"""Turning the engine's expected errors into one-line messages and exit code 1."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import typer


def user_errors() -> tuple[type[BaseException], ...]:
    from infer.engine.chat_template import ChatTemplateError
    from infer.engine.engine import EngineConfigError, ModelRunError, PromptError
    from infer.engine.grammar import GrammarError
    from infer.engine.llm import BackendError
    from infer.engine.sampler import InvalidSamplingParams
    from infer.engine.speculative import SpeculationError
    from infer.engine.tokenizer import TokenizerError
    from infer.models.config import ModelConfigError
    from infer.models.gguf_file import GGUFError
    from infer.models.hub import PullError
    from infer.models.imatrix import ImatrixError
    from infer.models.weights import ModelLoadError
    from infer.models.convert_hf import ConvertError
    from infer.models.quantize import QuantizeError
    from infer.models.resolve import ModelNotFoundError
    from infer.quant.recipe import RecipeError
    from infer.quant.types import UnsupportedQuantType

    return (BackendError, ChatTemplateError, GrammarError, PromptError, EngineConfigError, InvalidSamplingParams, TokenizerError, ModelConfigError,
            SpeculationError, ModelRunError,
            GGUFError, ModelLoadError, ModelNotFoundError, PullError, UnsupportedQuantType, QuantizeError, ImatrixError,
            RecipeError, ConvertError, OSError)


@contextmanager
def reported() -> Iterator[None]:
    """Report expected failures as `error: ...` on stderr and exit 1; let real bugs show their traceback."""
    try:
        yield
    except Exception as e:
        # Exception, not user_errors() in the except clause: that would import the engine's error classes
        # while a Ctrl-C unwinds, and a module whose import the Ctrl-C cut short fails again (a traceback)
        if not isinstance(e, user_errors()):
            raise
        msg = str(e) or type(e).__name__
        if isinstance(e, OSError) and e.filename:
            msg = f"{e.filename}: {e.strerror}"
        sys.stderr.write(f"error: {msg.splitlines()[0]}\n")
        raise typer.Exit(1) from None
