"""SentencePiece ('llama' GGUF vocab) encoding, reproducing llama.cpp's SPM tokenizer.

llama.cpp does not run SentencePiece's own unigram/BPE model: it merges adjacent
symbols greedily by the *score* of the merged piece in the vocabulary, so this
module follows that algorithm (not the sentencepiece library) to get identical ids.
"""
from __future__ import annotations

from heapq import heapify, heappop, heappush

import numpy as np

from infer.engine.tokenizer_error import TokenizerError

ESCAPED_SPACE = "\u2581"  # '▁', SentencePiece's visible space


class SentencePieceModel:
    """Score-driven bigram merging over one text fragment (special tokens already split out).

    `token_to_id` is the vocabulary's only per-token Python structure; scores stay a
    float32 array and are read only for pieces that actually occur in the text.
    """

    def __init__(self, token_to_id: dict[str, int], scores: np.ndarray, add_space_prefix: bool):
        self._vocab = token_to_id
        self._scores = scores
        self.add_space_prefix = add_space_prefix
        self._byte_ids: list[int | None] = [self._byte_token(b) for b in range(256)]

    def _byte_token(self, b: int) -> int | None:
        # llama.cpp tries '<0xXX>' first, then the byte itself as a one-character token.
        tid = self._vocab.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self._vocab.get(chr(b))
        return tid

    def encode(self, fragment: str, after_special: bool) -> list[int]:
        """Token ids of one raw-text fragment; `after_special` is true at the start of the
        text and right after a special token, where llama.cpp adds the space prefix."""
        text = " " + fragment if (self.add_space_prefix and after_special) else fragment
        text = text.replace(" ", ESCAPED_SPACE)
        if not text:
            return []
        return self._merge(text)

    def _merge(self, text: str) -> list[int]:
        n = len(text)
        vocab_get = self._vocab.get
        scores = self._scores
        # Symbol i covers text[i:i + size[i]]; merged-away symbols have size 0.
        # Python str indexes code points, which are exactly llama.cpp's UTF-8 symbols.
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1

        # Heap entries: (-score, left, right, merged length). Highest score first and,
        # on equal scores, the leftmost pair, as llama.cpp's priority queue orders them.
        heap = []
        for i in range(n - 1):
            tid = vocab_get(text[i:i + 2])
            if tid is not None:
                heap.append((-float(scores[tid]), i, i + 1, 2))
        heapify(heap)

        while heap:
            _, left, right, merged = heappop(heap)
            a, b = size[left], size[right]
            # Stale entry: one side was merged into something else since it was queued.
            if a == 0 or b == 0 or a + b != merged:
                continue
            size[left] = merged
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                span = size[before] + merged
                tid = vocab_get(text[before:before + span])
                if tid is not None:
                    heappush(heap, (-float(scores[tid]), before, left, span))
            if after >= 0:
                span = merged + size[after]
                tid = vocab_get(text[left:left + span])
                if tid is not None:
                    heappush(heap, (-float(scores[tid]), left, after, span))

        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tid = vocab_get(piece)
            if tid is not None:
                out.append(tid)
            else:
                # Only single characters can miss the vocabulary (every merge made a
                # vocabulary piece), so llama.cpp's re-segmentation reduces to byte fallback.
                out.extend(self._bytes_of(piece))
            i = nxt[i]
        return out

    def _bytes_of(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            tid = self._byte_ids[b]
            if tid is None:
                raise TokenizerError(
                    f"cannot encode {piece!r}: vocabulary has no byte-fallback token <0x{b:02X}>"
                )
            ids.append(tid)
        return ids

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL vocabulary token: '▁' shown as a space."""
        return text.replace(ESCAPED_SPACE, " ").encode("utf-8")
