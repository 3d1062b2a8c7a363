"""Reranking's prompt: a (query, document) pair as one token sequence, as llama-server's
format_prompt_rerank builds it.

A reranker (a model with rank pooling: engine/pooling.py) scores one prompt per document; the
first element of its pooled head's output is the document's relevance score.  The prompt is the
file's rerank template (tokenizer.chat_template.rerank, with {query} and {document} replaced in
that order; Qwen3-Reranker's converter writes one) tokenized with special tokens parsed and none
added; without one, [BOS] query [EOS] [SEP] document [EOS], each special token where the
vocabulary's add_bos / add_eos / add_sep flags ask for it (EOS falling back on SEP), the texts
tokenized without special tokens.
"""
from __future__ import annotations

from typing import Any

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def rerank_template(metadata: dict[str, Any]) -> str | None:
    """The file's rerank template, if it has one."""
    t = metadata.get(RERANK_TEMPLATE_KEY)
    return t if isinstance(t, str) and t else None


def rerank_prompt(tokenizer, template: str | None, query: str, document: str) -> list[int]:
    """The token ids that score `document` against `query`."""
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(text, add_special=False, parse_special=True)
    q = tokenizer.encode(query, add_special=False, parse_special=False)
    d = tokenizer.encode(document, add_special=False, parse_special=False)
    sep = getattr(tokenizer, "sep_id", None)
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else sep
    add_eos = getattr(tokenizer, "add_eos", False) and eos is not None
    out: list[int] = []
    if getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None:
        out.append(tokenizer.bos_id)
    out += q
    if add_eos:
        out.append(eos)
    if getattr(tokenizer, "add_sep", False) and sep is not None:
        out.append(sep)
    out += d
    if add_eos:
        out.append(eos)
    return out
