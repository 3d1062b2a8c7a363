"""The one error every tokenizer raises (its own module, so that the vocabulary models can raise
it without importing the tokenizer that imports them)."""
from __future__ import annotations

from infer.quant.errors import InferError


class TokenizerError(InferError, ValueError):
    """A vocabulary this tokenizer cannot build, or input it cannot encode or decode."""
