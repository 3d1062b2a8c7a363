"""`infer embed MODEL TEXT...` and `infer rerank MODEL QUERY DOC...`: embeddings and relevance
scores for scripts, computed as the server's /api/embed and /v1/rerank compute them."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from . import options as opt
from .app import app
from .errors import reported
from .load import load_llm

POOLING = typer.Option("", "--pooling", show_default=False,
                       help="mean, cls, last or rank (default: the model file's pooling_type, else mean).")


@app.command(help="Print the embedding of each TEXT (or of each line of --file / stdin), one line of numbers per "
                  "text, unit length unless --no-normalize.")
def embed(
    model: str = typer.Argument(..., help="Pulled name or .gguf path."),
    texts: Optional[List[str]] = typer.Argument(None, help="Texts to embed (none: --file, else stdin, a text a line)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Embed each line of this file ('-': stdin)."),
    pooling: str = POOLING,
    normalize: bool = typer.Option(True, "--normalize/--no-normalize",
                                   help="Scale each vector to unit length (ollama's and llama-embedding's default)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: {\"model\", \"embeddings\": [[...]]}, "
                                                       "as ollama's /api/embed."),
    ctx: int = opt.CTX,
    threads: int = opt.THREADS,
    backend: str = opt.BACKEND,
    mmap: bool = opt.MMAP,
    ubatch_size: int = opt.UBATCH,
) -> None:
    load = opt.LoadOptions.of(locals())
    if texts and file is not None:
        raise typer.BadParameter("give texts or --file, not both")
    with reported():
        from infer.engine.pooling import normalize as unit

        items = list(texts) if texts else _lines(file)
        llm = load_llm(model, load.engine_config(pooling=pooling), quiet=True)
        if llm.engine.pooling == "rank":
            from infer.engine.pooling import PoolingError

            raise PoolingError(f"{llm.model.path.stem} is a reranker (rank pooling): its outputs are scores, not "
                               "embeddings; use `infer rerank` (or --pooling mean, cls or last)")
        vectors = _pooled(llm, [llm.encode_raw(t) for t in items])
        if normalize:
            vectors = [unit(v) for v in vectors]
    out = sys.stdout
    if as_json:
        json.dump({"model": llm.model.path.stem, "embeddings": [v.tolist() for v in vectors]}, out)
        out.write("\n")
        return
    for v in vectors:
        out.write(" ".join(f"{x:.9g}" for x in v.tolist()) + "\n")


@app.command(help="Score each DOC's relevance to QUERY with a reranker (a model whose file says pooling_type rank): "
                  "one line per document, best first: its score, a tab, the document.")
def rerank(
    model: str = typer.Argument(..., help="Pulled name or .gguf path of a reranker."),
    query: str = typer.Argument(..., help="The query."),
    docs: List[str] = typer.Argument(..., help="The documents."),
    top_n: int = typer.Option(0, "--top-n", help="Print only the best N (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object, /v1/rerank's: {\"model\", \"results\": "
                                                       "[{\"index\", \"relevance_score\", \"document\"}]}."),
    ctx: int = opt.CTX,
    threads: int = opt.THREADS,
    backend: str = opt.BACKEND,
    mmap: bool = opt.MMAP,
    ubatch_size: int = opt.UBATCH,
) -> None:
    load = opt.LoadOptions.of(locals())
    if top_n < 0:
        raise typer.BadParameter(f"--top-n must be >= 0, got {top_n}")
    with reported():
        from infer.engine.pooling import PoolingError

        llm = load_llm(model, load.engine_config(), quiet=True)
        if llm.engine.pooling != "rank":
            raise PoolingError(f"{llm.model.path.stem} is not a reranker (it pools by {llm.engine.pooling}, not "
                               "rank): rerank with a model whose file says pooling_type rank")
        scores = [float(v[0]) for v in _pooled(llm, [llm.encode_rerank(query, d) for d in docs])]
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n or len(docs)]
    out = sys.stdout
    if as_json:
        json.dump({"model": llm.model.path.stem, "results": [
            {"index": i, "relevance_score": scores[i], "document": {"text": docs[i]}} for i in order]}, out)
        out.write("\n")
        return
    for i in order:
        out.write(f"{scores[i]:.6f}\t{docs[i]}\n")


def _lines(file: Path | None) -> list[str]:
    """The texts of --file (or stdin): one a line, blank lines skipped."""
    from infer.engine.pooling import PoolingError

    text = sys.stdin.read() if file is None or str(file) == "-" else file.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise PoolingError("nothing to embed: give texts as arguments, with --file, or on stdin (one a line)")
    return lines


def _pooled(llm, prompts: list[list[int]]):
    """Each prompt's vector as the engine pools it, all submitted at once (prefilled together)."""
    from infer.engine.engine import ModelRunError

    eng = llm.engine
    rids = [eng.add_embedding(p) for p in prompts]
    out = []
    for rid in rids:
        ev = list(eng.stream(rid))[-1]
        if ev.embedding is None:
            raise ModelRunError(f"the embedding failed: {eng.last_error}")
        out.append(ev.embedding)
    return out
