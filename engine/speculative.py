"""Speculative decoding by prompt lookup: drafts from the sequence's own tokens (llama.cpp's
ngram-simple), verified by the target model in one forward pass.

A decoding sequence whose last n tokens (the one just sampled included) appeared before in its
prompt or output gets, as its draft, the tokens that followed that earlier occurrence (the most
recent one).  The next step computes the sampled token and the draft together; the engine then
samples each position with the request's own sampler and keeps the draft while it agrees, plus
the first token that does not (or one past the whole draft).  Every kept token is what plain
decoding would have sampled from the same logits (the cpu backend's rows do not depend on the
batch), so greedy output is token for token the same and a seeded sampler draws the same
sequence; K/V written for rejected draft tokens are dropped (Scheduler.commit).

Verifying a token costs compute but no extra weight reads while a step is bandwidth-bound, so
drafts are capped: at `draft_max` tokens, and by the step's share when many sequences decode
together (STEP_TOKENS among them), which turns drafting off for large batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infer.quant.errors import InferError

SPEC_TYPES = ("ngram", "draft")
STEP_TOKENS = 32  # drafted plus sampled tokens a step may verify across its decoding sequences


class SpeculationError(InferError, ValueError):
    """Speculation settings that cannot work."""


@dataclass(frozen=True)
class SpecConfig:
    kind: str = ""  # "" (off), "ngram" (prompt lookup) or "draft" (a draft model)
    ngram_n: int = 6  # --spec-ngram-n: tokens of the lookup n-gram (llama.cpp's --spec-ngram-simple-size-n, there 12)
    draft_max: int = 8  # --draft-max: most tokens drafted per step (llama.cpp's m-gram size, there 48)
    draft: str = ""  # --draft MODEL: the draft model's file (kind "draft"; draft.py)
    draft_min: int = 0  # --draft-min: a shorter draft is not verified
    draft_p_min: float = 0.0  # --draft-p-min: the draft model stops where its top token is less likely

    def __post_init__(self) -> None:
        if self.kind and self.kind not in SPEC_TYPES:
            raise SpeculationError(f"--spec takes {', '.join(SPEC_TYPES)}, got {self.kind!r}")
        if self.ngram_n < 1:
            raise SpeculationError(f"--spec-ngram-n must be at least 1, got {self.ngram_n}")
        if self.draft_max < 1:
            raise SpeculationError(f"--draft-max must be at least 1, got {self.draft_max}")
        if (self.kind == "draft") != bool(self.draft):
            raise SpeculationError("--spec draft needs --draft MODEL (and --draft needs --spec draft)")
        if not 0 <= self.draft_min <= self.draft_max:
            raise SpeculationError(f"--draft-min must be in 0..--draft-max, got {self.draft_min}")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise SpeculationError(f"--draft-p-min must be in [0, 1], got {self.draft_p_min}")

    def room(self, n_decoding: int) -> int:
        """Tokens each of n_decoding sequences may draft in one step."""
        return max(0, min(self.draft_max, STEP_TOKENS // max(n_decoding, 1) - 1))


def ngram_draft(tokens: np.ndarray, n: int, m: int) -> list[int]:
    """llama.cpp's common_ngram_simple_draft over tokens (int32; its last one is the token just
    sampled): the up to m tokens that followed the most recent earlier occurrence of the last n
    tokens, or [] when there is none or fewer than n tokens follow it (as llama.cpp)."""
    total = len(tokens)
    if m < 1 or total - 1 <= n + m + 1:  # llama.cpp: its history (all but the sampled one) must exceed n + m + 1
        return []
    pattern = tokens[total - n:]
    # candidate starts j in 1 .. total - n - 2 (llama.cpp skips 0 and the current occurrence)
    last = total - n - 2
    if last < 1:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(tokens[1:last + n], n)  # (last, n): starts 1..last
    hits = np.flatnonzero((windows == pattern).all(axis=1))
    if not len(hits):
        return []
    j = int(hits[-1]) + 1  # the most recent
    following = total - 1 - (j + n)  # history tokens after the earlier occurrence
    if following < n:
        return []
    return tokens[j + n:j + n + min(m, following)].tolist()
