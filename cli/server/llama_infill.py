"""/infill's fields and prompt: llama-server's fill-in-the-middle (format_prompt_infill in its
server-common.cpp) over the FIM tokens the model's GGUF names (Tokenizer.special)."""
from __future__ import annotations

from typing import Any

from .openai_request import APIError


def is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


# llama-server's default --batch-size, by which it sizes the FIM prompt's parts (infer batches by --ubatch-size)
FIM_BATCH = 2048


def infill_fields(body: dict) -> tuple[Any, Any, list[dict], str]:
    """/infill's fields, checked as llama-server checks them: (input_prefix, input_suffix,
    input_extra, prompt)."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise APIError(400, '"prompt" must be a string', "prompt", "invalid_type")
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise APIError(400, f'"{name}" is required', name, "invalid_value")
        v = body[name]
        if not (isinstance(v, str) or isinstance(v, list) and all(isinstance(x, str) or is_id(x) for x in v)):
            raise APIError(400, f'"{name}" must be a string (or mixed strings and token ids)', name, "invalid_type")
    extra = body.get("input_extra")
    extra = [] if extra is None else extra
    if not isinstance(extra, list):
        raise APIError(400, '"input_extra" must be an array of {"filename": string, "text": string}', "input_extra",
                       "invalid_type")
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise APIError(400, 'extra_context chunk must contain a "text" field with a string value', "input_extra",
                           "invalid_value")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise APIError(400, "extra_context chunk's \"filename\" field must be a string", "input_extra",
                           "invalid_type")
    return body["input_prefix"], body["input_suffix"], extra, prompt


CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks, for a model without a file separator token


def infill_prompt(tok, prefix: Any, suffix: Any, extra: list[dict], prompt: str, n_batch: int, n_ctx: int,
                  n_predict: int = -1) -> list[int]:
    """The fill-in-the-middle prompt as llama-server builds it (format_prompt_infill, repo-level
    pattern): [FIM_REP]myproject\\n [FIM_SEP]filename\\n text ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID], the prefix cut to 3/4 of a batch from its start,
    the suffix to what is left of a quarter, and the extra chunks to the context a batch and two
    replies leave (n_predict is the server's default, -1: llama-server's)."""
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False)

    def mixed(v: Any) -> list[int]:
        if isinstance(v, list) and not all(isinstance(x, str) or 0 <= x < tok.vocab_size for x in v):
            raise APIError(400, f"token ids in the input must be in [0, {tok.vocab_size})", None, "invalid_value")
        return enc(v) if isinstance(v, str) else [t for x in v for t in (enc(x) if isinstance(x, str) else [x])]

    rep, sep = tok.special("fim_rep"), tok.special("fim_sep")
    extra_ids: list[int] = []
    if rep is not None:
        extra_ids += [rep, *enc("myproject\n")]
    for chunk in extra:
        if sep is not None:
            extra_ids += [sep, *enc(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_ids += enc(CHUNK_SEPARATOR)
        extra_ids += enc(chunk["text"])
    if sep is not None:
        extra_ids += [sep, *enc("filename\n")]
    pre, suf = mixed(prefix), mixed(suffix)
    prompt_ids = tok.encode(prompt, add_special=False, parse_special=True)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [tok.special("fim_pre"), *pre[len(pre) - n_pre:], *prompt_ids]
    tail = [tok.special("fim_suf"), *suf[:n_suf]]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return [*extra_ids[len(extra_ids) - n_extra:], *bos, *head, *tail, tok.special("fim_mid")]
