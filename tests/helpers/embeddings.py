"""Embeddings on both sides of a comparison: ours through the engine, llama.cpp's through
llama-cpp-python, and the cosine distance between them."""
from __future__ import annotations

import numpy as np

from infer.engine.llm import LLM

POOLING_IDS = {"mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama.cpp's enum llama_pooling_type


def cos_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(1 - a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def llama_cpp_embed(path, pooling: str, inputs: list, flash_attn: bool = False, n_ctx: int = 1024,
                    n: int = 0) -> list[np.ndarray]:
    """llama.cpp's pooled embeddings (not normalized) of texts (Llama.embed) or of token lists; n:
    the floats of each (0: n_embd; rank pooling's: the head's outputs)."""
    import llama_cpp

    ref = llama_cpp.Llama(str(path), embedding=True, pooling_type=POOLING_IDS[pooling], n_ctx=n_ctx, n_threads=2,
                          flash_attn=flash_attn, verbose=False)
    try:
        if isinstance(inputs[0], str):
            return [np.array(e) for e in ref.embed(inputs)]
        out = []
        for tokens in inputs:
            ref.reset()
            if ref._ctx.memory is None:  # an encoder keeps no cache (eval needs one): a batch of its own
                ref._batch.reset()
                ref._batch.add_sequence(tokens, 0, True)
                ref._ctx.decode(ref._batch)
            else:
                ref.eval(tokens)  # one llama_decode: these prompts fit one batch, as pooling needs
            out.append(np.array(llama_cpp.llama_get_embeddings_seq(ref.ctx, 0)[:n or ref.n_embd()]))
        return out
    finally:
        ref.close()


def check_against_llama_cpp(ours: list[np.ndarray], ref: list[np.ndarray], ref_fa: list[np.ndarray], what: str):
    """Within 1e-3 cosine of llama.cpp's default path, or of its own spread (default vs flash
    attention) where that is wider: on the embedded model's last token, llama.cpp's two paths
    differ by up to ~3e-3."""
    for i, (o, r, f) in enumerate(zip(ours, ref, ref_fa)):
        d, spread = cos_distance(o, r), cos_distance(f, r)
        print(f"{what} input {i}: ours {d:.2e}, llama.cpp fa on/off {spread:.2e}")
        assert d <= max(1e-3, spread), f"{what} input {i}: cosine distance {d:.2e} (llama.cpp's spread {spread:.2e})"


def embed(llm: LLM, prompts: list[list[int]]) -> list[np.ndarray]:
    """Our embeddings of prompts, submitted together (they share the engine's steps)."""
    eng = llm.engine
    rids = [eng.add_embedding(p) for p in prompts]
    return [list(eng.stream(r))[-1].embedding for r in rids]
