"""Reranking over HTTP: POST /v1/rerank, /rerank, /v1/reranking and /reranking, as llama-server
answers them.

A request is Jina's and Cohere's {"model", "query", "documents": strings or {"text": ...},
"top_n", "return_documents"} -> {"model", "object": "list", "usage", "results": [{"index",
"relevance_score", "document": {"text"}}]}, or TEI's {"query", "texts", "return_text"} -> a list
of {"index", "score", "text"} (a body with "texts" is TEI's, as llama-server's is_tei_format);
results best first, the first top_n.  Each document is one prompt (engine/rerank.py: the file's
rerank template, else query and document between the vocabulary's special tokens), and all of a
request's prompts run side by side as embedding requests of the engine (embeddings_api.py's
vectors); a document's score is the first element of the model's rank pooling output (its
classification head's: Qwen3-Reranker's P(yes)).  A model whose pooling is not rank is refused
with a 400 that names it.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .embeddings_api import MAX_INPUTS, EmbeddingsAPI
from .openai_request import APIError, ClientGone, bool_field, int_field, kind, text_field
from .service import Service

ROUTES = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")


class RerankAPI:
    def __init__(self, service: Service, embeddings: EmbeddingsAPI):
        self.service, self.embeddings = service, embeddings

    async def rerank(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            engine = self.service.llm.engine
            if engine.pooling != "rank":
                raise APIError(400, f"the model {model!r} is not a reranker (it pools by {engine.pooling}, not rank): "
                               "rerank with a model whose file says pooling_type rank (Qwen3-Reranker, a BERT "
                               "reranker)", "model", "model_not_supported")
            tei = "texts" in body
            query = body.get("query")
            if query is None:
                raise APIError(400, "'query' is required", "query", "missing_required_parameter")
            if not isinstance(query, str):
                raise APIError(400, f"'query' must be a string, got {kind(query)}", "query", "invalid_type")
            texts = self._documents(body, "texts" if tei else "documents")
            top_n = int_field(body, "top_n")
            if top_n is not None and top_n < 1:
                raise APIError(400, f"'top_n' must be at least 1, got {top_n}", "top_n", "invalid_value")
            give_text = bool_field(body, "return_text" if tei else "return_documents")
            q = text_field(query, "query")
            llm = self.service.llm
            prompts = [self.embeddings.fit(await self.service.encode(lambda d: llm.encode_rerank(q, d), t), False)
                       for t in texts]
            events = await self.embeddings.vectors(request, prompts)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        scores = [float(ev.embedding[0]) for ev in events]
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[:top_n or len(texts)]
        if tei:
            return JSONResponse([{"index": i, "score": scores[i], **({"text": texts[i]} if give_text else {})}
                                 for i in order])
        n = sum(len(p) for p in prompts)
        return JSONResponse({"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                             "results": [{"index": i, "relevance_score": scores[i],
                                          **({"document": {"text": texts[i]}} if give_text else {})} for i in order]})

    @staticmethod
    def _documents(body: dict, name: str) -> list[str]:
        """The documents: a non-empty array of strings or of {"text": string} (Jina's and Cohere's form)."""
        docs = body.get(name)
        if docs is None:
            raise APIError(400, f"'{name}' is required", name, "missing_required_parameter")
        if not isinstance(docs, list) or not docs:
            raise APIError(400, f"'{name}' must be a non-empty array of strings, got "
                           f"{'an empty array' if docs == [] else kind(docs)}", name, "invalid_value")
        if len(docs) > MAX_INPUTS:
            raise APIError(400, f"'{name}' has {len(docs)} items; at most {MAX_INPUTS}", name, "invalid_value")
        out = []
        for d in docs:
            text = d.get("text") if isinstance(d, dict) else d
            if not isinstance(text, str):
                raise APIError(400, f"'{name}' must hold strings or {{\"text\": string}} objects, got {kind(d)}",
                               name, "invalid_type")
            out.append(text_field(text, name))
        return out
