"""Embeddings on both sides of a comparison: ours through the engine, llama.cpp's through
llama-cpp-python, and the cosine distance between them."""
from __future__ import annotations

import numpy as np

from infer.engine.llm import LLM

POOLING_IDS = {"mean": 1, "cls": 2, "last": 3}  # llama.cpp's enum llama_pooling_type


def cos_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(1 - a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def llama_cpp_embed(path, pooling: str, inputs: list, flash_attn: bool = False, n_ctx: int = 1024) -> list[np.ndarray]:
    """llama.cpp's pooled embeddings (not normalized) of texts (Llama.embed) or of token lists."""
    import llama_cpp

    ref = llama_cpp.Llama(str(path), embedding=True, pooling_type=POOLING_IDS[pooling], n_ctx=n_ctx, n_threads=2,
                          flash_attn=flash_attn, verbose=False)
    try:
        if isinstance(inputs[0], str):
            return [np.array(e) for e in ref.embed(inputs)]
        out = []
        for tokens in inputs:
            ref.reset()
            ref.eval(tokens)  # one llama_decode: these prompts fit one batch, as pooling needs
            out.append(np.array(llama_cpp.llama_get_embeddings_seq(ref.ctx, 0)[:ref.n_embd()]))
        return out
    finally:
        ref.close()


def embed(llm: LLM, prompts: list[list[int]]) -> list[np.ndarray]:
    """Our embeddings of prompts, submitted together (they share the engine's steps)."""
    eng = llm.engine
    rids = [eng.add_embedding(p) for p in prompts]
    return [list(eng.stream(r))[-1].embedding for r in rids]
