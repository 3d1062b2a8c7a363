"""Stop matcher: find stop strings in streamed text without ever emitting part of one."""
from __future__ import annotations

from infer.quant.errors import InferError


class StopStringError(InferError, ValueError):
    """The stop strings are malformed."""


class StopMatcher:
    """Feed generated text deltas; get back what is safe to show and whether a stop string was hit.

    Generation halts at the first stop string to *complete*, so that is the one that wins; among
    stops completing at the same character the longest (earliest-starting) wins. This makes the
    result independent of how the text is split into deltas.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        if isinstance(stops, str):
            raise StopStringError(f"stops must be a sequence of strings, not a single string {stops!r}")
        stops = tuple(stops)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise StopStringError(f"stop strings must be non-empty strings, got {s!r}")
        self.stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self._stopped = False
        self.word: str | None = None  # the stop string that ended the text, once one has

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, delta: str) -> tuple[str, bool]:
        """(text safe to emit now, stopped). After a stop, further deltas are ignored."""
        if self._stopped:
            return "", True
        if not self.stops:
            return delta, False
        text = self._held + delta
        hit = self._first_completed(text)
        if hit is not None:
            self._held = ""
            self._stopped = True
            return text[:hit], True
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """At the end of generation, release the text held back as a possible stop prefix."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _first_completed(self, text: str) -> int | None:
        """Start of the stop occurrence that ends first in text (longest on a tie), or None."""
        best: tuple[int, int] | None = None  # (end, -length)
        start = None
        for s in self.stops:
            i = text.find(s)
            if i >= 0:
                key = (i + len(s), -len(s))
                if best is None or key < best:
                    best, start, self.word = key, i, s
        return start

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
