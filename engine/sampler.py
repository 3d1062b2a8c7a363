"""Token sampler: llama.cpp's default chain as small pure stages over (ids, logits) candidates.

Chain order (as llama.cpp's common sampler): penalties -> top_k -> top_p -> min_p ->
temperature -> draw from the softmax. Temperature <= 0 is argmax after penalties.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from infer.quant.errors import InferError

from .grammar import Grammar

# A candidate set: parallel arrays of token ids and their logits.
Candidates = tuple[np.ndarray, np.ndarray]
Stage = Callable[[np.ndarray, np.ndarray], Candidates]
# sample(logits (V,), history (n,) of previous token ids, rng[, allowed (n,) int64 ascending ids]) -> token id
Sampler = Callable[..., int]


MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


class InvalidSamplingParams(InferError, ValueError):
    """A sampling parameter is out of range or of the wrong type."""


F32_MAX = float(np.finfo(np.float32).max)


def _number(name: str, value: object) -> float:
    # bool is an int subclass; rejecting it catches swapped keyword arguments.
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidSamplingParams(f"{name} must be a number, got {value!r}", field=name)
    try:
        x = float(value)
    except OverflowError:  # an integer past float's range: JSON numbers may have any number of digits
        raise InvalidSamplingParams(f"{name} must be finite, got an integer of {len(str(abs(value)))} digits", field=name) from None
    if not math.isfinite(x):
        raise InvalidSamplingParams(f"{name} must be finite, got {value!r}", field=name)
    if abs(x) > F32_MAX:  # would be infinite in the float32 arithmetic of the stages
        raise InvalidSamplingParams(f"{name} must be within ±3.4e38 (a 32-bit float, as llama.cpp reads it), got {x:g}", field=name)
    return x


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidSamplingParams(f"{name} must be an integer, got {value!r}", field=name)
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off; llama.cpp: divide positive logits, multiply the rest
    repeat_last_n: int = 64  # window for all three penalties; 0 = off, -1 = whole history
    frequency_penalty: float = 0.0  # logit -= count * frequency_penalty
    presence_penalty: float = 0.0  # logit -= presence_penalty if count > 0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past end-of-generation tokens (benchmarks)
    logprobs: int | None = None  # None: off; k: each token's logprob and the k likeliest alternatives
    grammar: Grammar | None = None  # constrained output (grammar.py): masks the logits before every stage
    special: bool = False  # spell special tokens out in the text (tool-call markers that are control tokens)
    # lazy grammar: free until the reply shows one of these texts ("^text": only at its start, after
    # whitespace); from there on the grammar holds, starting at that text
    grammar_triggers: tuple[str, ...] = ()
    thinking: bool = False  # the reply starts inside a <think> the prompt opened (lazy grammars wait past it)
    # (token id, bias) pairs added to the raw logits before every stage (OpenAI's and llama.cpp's
    # logit_bias); -inf bans the token.  An id repeated adds up, as llama.cpp's sampler does.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if _number("temperature", self.temperature) < 0:
            raise InvalidSamplingParams(f"temperature must be >= 0 (0 = greedy), got {self.temperature}", field="temperature")
        if _integer("top_k", self.top_k) < 0:
            raise InvalidSamplingParams(f"top_k must be >= 0 (0 = off), got {self.top_k}", field="top_k")
        if not 0.0 < _number("top_p", self.top_p) <= 1.0:
            raise InvalidSamplingParams(f"top_p must be in (0, 1] (1 = off), got {self.top_p}", field="top_p")
        if not 0.0 <= _number("min_p", self.min_p) <= 1.0:
            raise InvalidSamplingParams(f"min_p must be in [0, 1] (0 = off), got {self.min_p}", field="min_p")
        if _number("repeat_penalty", self.repeat_penalty) <= 0:
            raise InvalidSamplingParams(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}", field="repeat_penalty")
        if _integer("repeat_last_n", self.repeat_last_n) < -1:
            raise InvalidSamplingParams(
                f"repeat_last_n must be >= -1 (0 = off, -1 = whole history), got {self.repeat_last_n}",
                field="repeat_last_n")
        _number("frequency_penalty", self.frequency_penalty)
        _number("presence_penalty", self.presence_penalty)
        if self.seed is not None and _integer("seed", self.seed) < 0:
            raise InvalidSamplingParams(f"seed must be a non-negative integer or None, got {self.seed}", field="seed")
        if _integer("max_tokens", self.max_tokens) < 1:
            raise InvalidSamplingParams(f"max_tokens must be >= 1, got {self.max_tokens}", field="max_tokens")
        if self.logprobs is not None and not 0 <= _integer("logprobs", self.logprobs) <= MAX_LOGPROBS:
            raise InvalidSamplingParams(
                f"logprobs must be between 0 and {MAX_LOGPROBS} (or None = off), got {self.logprobs}",
                field="logprobs")
        stop = self.stop
        if isinstance(stop, str):
            raise InvalidSamplingParams(f"stop must be a sequence of strings, not a single string {stop!r}", field="stop")
        try:
            stop = tuple(stop)
        except TypeError:
            raise InvalidSamplingParams(f"stop must be a sequence of strings, got {self.stop!r}", field="stop") from None
        for s in stop:
            if not isinstance(s, str) or not s:
                raise InvalidSamplingParams(f"stop strings must be non-empty strings, got {s!r}", field="stop")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidSamplingParams(f"grammar must be a Grammar, got {type(self.grammar).__name__}", field="grammar")
        if self.grammar_triggers and (self.grammar is None or not all(
                isinstance(t, str) and t.lstrip("^") for t in self.grammar_triggers)):
            raise InvalidSamplingParams("grammar_triggers need a grammar and non-empty texts", field="grammar_triggers")
        object.__setattr__(self, "grammar_triggers", tuple(self.grammar_triggers))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        # Lists are accepted for convenience but stored as a tuple so the params stay hashable.
        object.__setattr__(self, "stop", stop)


def _logit_bias(pairs: object) -> tuple[tuple[int, float], ...]:
    try:
        items = list(pairs)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidSamplingParams(f"logit_bias must be a sequence of (token id, bias) pairs, got {pairs!r}"[:200],
                                    field="logit_bias") from None
    out = []
    for pair in items:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidSamplingParams(f"logit_bias items must be (token id, bias) pairs, got {pair!r}"[:200],
                                        field="logit_bias")
        tok = _integer("logit_bias", pair[0])
        if tok < 0:
            raise InvalidSamplingParams(f"logit_bias token ids must be >= 0, got {tok}", field="logit_bias")
        never = isinstance(pair[1], (float, np.floating)) and pair[1] == -math.inf
        out.append((tok, -math.inf if never else _number("logit_bias", pair[1])))
    return tuple(out)


def make_rng(seed: int | None) -> np.random.Generator:
    """A PCG64 generator; None draws fresh OS entropy."""
    if seed is not None and (_integer("seed", seed) < 0):
        raise InvalidSamplingParams(f"seed must be a non-negative integer or None, got {seed}", field="seed")
    return np.random.Generator(np.random.PCG64(seed))


# ---------------------------------------------------------------- stages


def apply_penalties(
    ids: np.ndarray,
    logits: np.ndarray,
    history: np.ndarray,
    *,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = 64,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> Candidates:
    """llama.cpp's penalties over the last repeat_last_n tokens of history (-1 = all of it)."""
    if repeat_last_n == 0 or (repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0):
        return ids, logits
    window = np.asarray(history, dtype=np.int64).reshape(-1)
    if repeat_last_n > 0:
        window = window[-repeat_last_n:]
    if window.size == 0:
        return ids, logits
    seen, counts = np.unique(window, return_counts=True)
    if ids.size and bool(np.all(ids[:-1] < ids[1:])):
        # Candidates are id-sorted (the whole vocab, as the chain's first stage): look up the
        # few seen ids by bisection instead of scanning the vocab for them.
        pos = np.minimum(np.searchsorted(ids, seen), ids.size - 1)
        found = ids[pos] == seen
        hit, count = pos[found], counts[found]
    else:
        hit = np.flatnonzero(np.isin(ids, seen))
        count = counts[np.searchsorted(seen, ids[hit])]
    if hit.size == 0:
        return ids, logits
    count = count.astype(np.float32)
    out = logits.copy()
    x = out[hit]
    # llama.cpp tests `<= 0` for the multiply branch; at exactly 0 both branches agree.
    with np.errstate(over="ignore", invalid="ignore"):  # extreme penalties: infinities, handled below
        x = np.where(x <= 0, x * np.float32(repeat_penalty), x / np.float32(repeat_penalty))
        x -= count * np.float32(frequency_penalty) + np.float32(presence_penalty)
    out[hit] = np.where(np.isnan(x), -np.inf, x)  # inf - inf: as good as forbidden
    return ids, out


_BLOCK = 256


def _head_pool(logits: np.ndarray, k: int) -> np.ndarray | None:
    """Indices of a small superset of the k largest logits, or None if it would not pay off.

    The k-th largest of the block maxima is a lower bound for the k-th largest logit (each of
    those k blocks holds a distinct element at least that large), so everything below it can go.
    """
    nb = logits.size // _BLOCK
    if nb < 4 * k:
        return None
    maxima = logits[: nb * _BLOCK].reshape(nb, _BLOCK).max(axis=1)
    if logits.size % _BLOCK:
        maxima = np.append(maxima, logits[nb * _BLOCK :].max())
    bound = np.partition(maxima, maxima.size - k)[maxima.size - k]
    return np.flatnonzero(logits >= bound)


def _top_sorted(ids: np.ndarray, logits: np.ndarray, k: int) -> Candidates:
    """The k highest candidates, sorted by logit descending; ties go to the lower token id."""
    n = logits.size
    if k >= n:
        order = np.lexsort((ids, -logits))
        return ids[order], logits[order]
    pool = _head_pool(logits, k)
    if pool is not None and pool.size < n:
        # Every logit >= the k-th largest is in the pool, ties included, so work there only.
        return _top_sorted(ids[pool], logits[pool], k)
    part = np.argpartition(logits, n - k)
    thresh = logits[part[n - k]]
    top = part[n - k :]
    above = top[logits[top] > thresh]
    ties = np.flatnonzero(logits == thresh)
    ties = ties[np.argsort(ids[ties], kind="stable")][: k - above.size]
    sel = np.concatenate([above, ties])
    order = np.lexsort((ids[sel], -logits[sel]))
    sel = sel[order]
    return ids[sel], logits[sel]


def apply_top_k(ids: np.ndarray, logits: np.ndarray, k: int) -> Candidates:
    """Keep the k highest logits (k <= 0 = off); the result is sorted descending."""
    if k <= 0:
        return ids, logits
    return _top_sorted(ids, logits, k)


def _exp_shifted(logits: np.ndarray, mx: float) -> np.ndarray:
    # exp in float32 is ~10x faster than float64 over a whole vocab; sums are done in float64.
    return np.exp(np.asarray(logits, dtype=np.float32) - np.float32(mx))


def apply_top_p(ids: np.ndarray, logits: np.ndarray, p: float, min_keep: int = 1) -> Candidates:
    """Keep the smallest prefix, by probability descending, whose cumulative probability >= p."""
    n = logits.size
    if p >= 1.0 or n <= min_keep:
        return ids, logits
    mx = float(logits.max())
    total = _exp_shifted(logits, mx).sum(dtype=np.float64)
    # The nucleus is usually tiny: sort a growing head of the distribution instead of the whole vocab.
    k = min(n, 256)
    while True:
        top_ids, top_logits = _top_sorted(ids, logits, k)
        cum = np.cumsum(_exp_shifted(top_logits, mx), dtype=np.float64) / total
        reached = np.flatnonzero(cum >= p)
        if reached.size:
            keep = max(int(reached[0]) + 1, min_keep)
            return top_ids[:keep], top_logits[:keep]
        if k == n:  # rounding left the total just under p: keep everything, as llama.cpp does
            return top_ids, top_logits
        k = min(n, k * 4)


def apply_min_p(ids: np.ndarray, logits: np.ndarray, p: float, min_keep: int = 1) -> Candidates:
    """Keep tokens with prob >= p * max_prob, tested in logit space as llama.cpp does."""
    if p <= 0.0 or logits.size == 0:
        return ids, logits
    # A float64 bound keeps the boundary exact-ish; llama.cpp itself compares in float32.
    keep = logits >= np.float64(float(logits.max()) + math.log(p))
    if int(keep.sum()) < min_keep:
        return _top_sorted(ids, logits, min_keep)
    return ids[keep], logits[keep]


def apply_temperature(ids: np.ndarray, logits: np.ndarray, t: float) -> Candidates:
    """Divide logits by t (t must be > 0; greedy decoding never reaches this stage)."""
    if t == 1.0:
        return ids, logits
    with np.errstate(over="ignore"):
        scaled = logits / np.float32(t)
    if scaled.size and not math.isfinite(float(scaled.max())):
        # so small a t that the top logits overflow: the softmax's limit, the highest of them (the
        # overflow itself would have made every positive logit tie at inf)
        top = logits == logits.max()
        return ids[top], np.zeros(int(top.sum()), np.float32)
    return ids, scaled


def sample_softmax(ids: np.ndarray, logits: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one id from softmax(logits) using a single uniform draw from rng."""
    mx = float(logits.max())
    if not math.isfinite(mx):  # +inf (an extreme temperature or penalty): the softmax's limit is the argmax
        return greedy(ids, logits)
    cum = np.cumsum(_exp_shifted(logits, mx), dtype=np.float64)
    # side="right" skips zero-probability entries (-inf logits), which form flat runs in cum.
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[min(i, ids.size - 1)])


def greedy(ids: np.ndarray, logits: np.ndarray) -> int:
    """The highest-logit id; the first one wins ties."""
    return int(ids[int(np.argmax(logits))])


# ---------------------------------------------------------------- logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob) of the likeliest tokens, most likely first


def token_logprob(logits: np.ndarray, token_id: int, k: int) -> TokenLogprob:
    """The log-softmax of the raw logits (before penalties and filters) at token_id, and the top k."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    mx = float(x.max())
    lse = mx + math.log(float(np.exp(x - mx).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        ids, vals = _top_sorted(np.arange(x.size, dtype=np.int64), x, min(k, x.size))
        top = tuple((int(i), float(v) - lse) for i, v in zip(ids, vals))
    return TokenLogprob(int(token_id), float(x[token_id]) - lse, top)


# ---------------------------------------------------------------- composition


def make_sampler(params: SamplingParams) -> Sampler:
    """Compose the enabled stages of params into sample(logits, history, rng) -> token id."""
    if not isinstance(params, SamplingParams):
        raise InvalidSamplingParams(f"make_sampler needs SamplingParams, got {type(params).__name__}")

    def penalize(ids: np.ndarray, logits: np.ndarray, history: np.ndarray) -> Candidates:
        return apply_penalties(
            ids,
            logits,
            history,
            repeat_penalty=params.repeat_penalty,
            repeat_last_n=params.repeat_last_n,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
        )

    stages: list[Stage] = []
    if params.top_k > 0:
        stages.append(lambda i, x: apply_top_k(i, x, params.top_k))
    if params.top_p < 1.0:
        stages.append(lambda i, x: apply_top_p(i, x, params.top_p))
    if params.min_p > 0.0:
        stages.append(lambda i, x: apply_min_p(i, x, params.min_p))
    stages.append(lambda i, x: apply_temperature(i, x, params.temperature))

    def sample(logits: np.ndarray, history: np.ndarray, rng: np.random.Generator | None,
               allowed: np.ndarray | None = None) -> int:
        logits = np.asarray(logits).reshape(-1)
        if logits.size == 0:
            raise InvalidSamplingParams("cannot sample from an empty logits vector")
        if allowed is not None:  # a grammar's allowed ids, ascending: the others have probability 0
            ids = allowed
            logits = logits[ids]
        else:
            ids = np.arange(logits.size, dtype=np.int64)
        ids, logits = penalize(ids, logits, history)
        if params.temperature <= 0.0:
            return greedy(ids, logits)
        if rng is None:
            raise InvalidSamplingParams("sampling at temperature > 0 needs an rng (see make_rng)")
        for stage in stages:
            ids, logits = stage(ids, logits)
        return sample_softmax(ids, logits, rng)

    return sample
