"""Token log-probabilities in OpenAI's two shapes: chat (per token, with bytes) and completions."""
from __future__ import annotations

from infer.engine.sampler import TokenLogprob

from .openai_request import MIN_LOGPROB


def _piece(tokenizer, tid: int) -> tuple[str, list[int]]:
    b = tokenizer.token_to_piece(tid, special=True)
    return b.decode("utf-8", errors="replace"), list(b)


def chat_logprobs(tokenizer, lps: list[TokenLogprob]) -> list[dict]:
    out = []
    for lp in lps:
        text, raw = _piece(tokenizer, lp.token_id)
        top = []
        for tid, v in lp.top:
            t, b = _piece(tokenizer, tid)
            top.append({"token": t, "logprob": max(v, MIN_LOGPROB), "bytes": b})
        out.append({"token": text, "logprob": max(lp.logprob, MIN_LOGPROB), "bytes": raw, "top_logprobs": top})
    return out


def completion_logprobs(tokenizer, lps: list[TokenLogprob], offset: int) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        text, _ = _piece(tokenizer, lp.token_id)
        tokens.append(text)
        values.append(max(lp.logprob, MIN_LOGPROB))
        tops.append({_piece(tokenizer, tid)[0]: max(v, MIN_LOGPROB) for tid, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
