"""Embeddings over HTTP: OpenAI's /v1/embeddings, ollama's /api/embed and its older /api/embeddings.

Every input becomes one embedding request of the engine (engine/pooling.py: the model's final
hidden states pooled as llama.cpp pools them), prefilled in the same steps as the generation
requests; the inputs of one HTTP request run side by side.  OpenAI's and /api/embed's vectors are
normalized to unit length (OpenAI's are; ollama normalizes /api/embed); /api/embeddings returns
the pooled vector as it is, as ollama's does.  A client that goes away cancels its inputs.  A
reranker's outputs are scores, not embeddings: these routes refuse it (as llama-server's
/v1/embeddings refuses rank pooling) and send its clients to /v1/rerank (rerank_api.py).
"""
from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infer.engine.engine import PromptError
from infer.engine.pooling import PoolingError, normalize
from infer.engine.request import Event

from .ollama_api import OllamaAPI
from .openai_request import APIError, ClientGone, disconnected, kind
from .service import Service

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingsAPI:
    def __init__(self, service: Service, ollama: OllamaAPI):
        self.service, self.ollama = service, ollama  # ollama: its model names (resolve)
        # the inputs of the requests in flight beyond one each: the queue counts requests, and an
        # input running already is counted too (at most max_seqs more admitted, never fewer)
        self.extra_inputs = 0

    @property
    def llm(self):
        return self.service.llm

    def embeds(self, model: str) -> None:
        """A 400 for a reranker: its pooling gives scores, not an embedding."""
        if self.llm.engine.pooling == "rank":
            raise APIError(400, f"the model {model!r} is a reranker (rank pooling): its outputs are relevance scores, "
                           "not embeddings; use /v1/rerank", "model", "model_not_supported")

    async def vectors(self, request: Request, prompts: list[list[int]]) -> list[Event]:
        """The finish event of each prompt's embedding, in order; all run at once."""
        if not prompts:
            return []
        self.service.admit(self.extra_inputs)
        self.extra_inputs += len(prompts) - 1
        try:
            return await self._run(request, prompts)
        finally:
            self.extra_inputs -= len(prompts) - 1

    async def _run(self, request: Request, prompts: list[list[int]]) -> list[Event]:
        engine = self.llm.engine
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in prompts]

        def settle(f: asyncio.Future, ev: Event) -> None:
            if not f.done() and ev.finish_reason is not None:
                f.set_result(ev)

        rids = []
        try:
            for p, f in zip(prompts, futures):
                rids.append(engine.add_embedding(p, sink=lambda ev, f=f: loop.call_soon_threadsafe(settle, f, ev)))
        except (PromptError, PoolingError) as e:
            for rid in rids:
                engine.cancel(rid)
            raise APIError(400, str(e), "input", "invalid_value") from None

        watcher = asyncio.ensure_future(disconnected(request.receive))
        everything = asyncio.gather(*futures)
        try:
            await asyncio.wait([watcher, everything], return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():
                raise ClientGone
            events = everything.result()
        finally:
            watcher.cancel()
            for rid, f in zip(rids, futures):
                if not f.done():
                    engine.cancel(rid)
            everything.cancel()
        if any(ev.finish_reason == "error" for ev in events):
            err = engine.last_error
            raise APIError(500, f"embedding failed: {type(err).__name__}: {err}".splitlines()[0][:300], None,
                           "engine_error", "server_error")
        return list(events)

    def fit(self, ids: list[int], truncate: bool) -> list[int]:
        """A prompt the context holds: cut to it (truncate) or refused."""
        n_ctx = self.llm.engine.n_ctx
        if len(ids) < n_ctx:
            return ids
        if truncate:  # keeping the end-of-text token the tokenizer adds: "last" pooling models read it
            tok = self.llm.tokenizer
            eos = tok.eos_id if getattr(tok, "add_eos", False) and ids and ids[-1] == tok.eos_id else None
            return ids[:n_ctx - 1] if eos is None else ids[:n_ctx - 2] + [eos]
        raise APIError(400, f"an input has {len(ids)} tokens but the context holds {n_ctx - 1}; shorten it",
                       "input", "context_length_exceeded")

    async def _encode(self, texts: list[str]) -> list[list[int]]:
        return [await self.service.encode(self.llm.encode_raw, t) for t in texts]

    # -- OpenAI ------------------------------------------------------------------------------------

    async def openai(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            self.embeds(model)
            fmt = body.get("encoding_format") or "float"
            if fmt not in ("float", "base64"):
                raise APIError(400, f"'encoding_format' must be 'float' or 'base64', got {str(fmt)[:50]!r}",
                               "encoding_format", "invalid_value")
            if body.get("dimensions") is not None:
                raise APIError(400, f"'dimensions' is not supported: this model's embeddings have "
                               f"{self.llm.engine.n_out} dimensions", "dimensions", "unsupported_parameter")
            prompts = [self.fit(p, truncate=False) for p in await self._openai_inputs(body.get("input"))]
            events = await self.vectors(request, prompts)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        data = []
        for i, ev in enumerate(events):
            v = normalize(ev.embedding)
            emb = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(len(p) for p in prompts)
        return JSONResponse({"object": "list", "data": data, "model": model,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def _openai_inputs(self, x) -> list[list[int]]:
        """OpenAI's input: a string, an array of strings, an array of token ids, or an array of those."""
        vocab = self.llm.tokenizer.vocab_size

        def ids(v) -> list[int] | None:
            if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
                if not all(0 <= t < vocab for t in v):
                    raise APIError(400, f"'input' token ids must be in [0, {vocab})", "input", "invalid_value")
                return v
            return None

        if isinstance(x, str):
            x = [x]
        if not isinstance(x, list) or not x:
            raise APIError(400, "'input' must be a non-empty string or array (of strings or token ids)", "input",
                           "invalid_type" if not isinstance(x, list) else "invalid_value")
        one = ids(x)
        if one is not None:
            return [one]
        if len(x) > MAX_INPUTS:
            raise APIError(400, f"'input' has {len(x)} items; at most {MAX_INPUTS}", "input", "invalid_value")
        if all(isinstance(s, str) for s in x):
            return await self._encode(x)
        out = [ids(v) for v in x]
        if any(v is None for v in out):
            raise APIError(400, "'input' must be a string, an array of strings, an array of token ids or an "
                           "array of arrays of token ids", "input", "invalid_type")
        return out

    # -- ollama ------------------------------------------------------------------------------------

    async def ollama_embed(self, request: Request) -> Response:
        """/api/embed: {"model", "input": a string or strings, "truncate": true} -> unit vectors."""
        t0 = time.perf_counter_ns()
        try:
            body = await self.service.body(request)
            model = await self.ollama.resolve(body)
            self.embeds(model)
            x = body.get("input", [])
            texts = [x] if isinstance(x, str) else x
            if not isinstance(texts, list) or not all(isinstance(s, str) for s in texts):
                raise APIError(400, f"'input' must be a string or an array of strings, got {kind(x)}")
            if len(texts) > MAX_INPUTS:
                raise APIError(400, f"'input' has {len(texts)} items; at most {MAX_INPUTS}")
            truncate = body.get("truncate", True)
            if not isinstance(truncate, bool):
                raise APIError(400, f"'truncate' must be true or false, got {kind(truncate)}")
            if body.get("dimensions"):
                raise APIError(400, f"'dimensions' is not supported: this model's embeddings have "
                               f"{self.llm.engine.n_out} dimensions")
            prompts = [self.fit(p, truncate) for p in await self._encode(texts)]
            events = await self.vectors(request, prompts)
        except APIError as e:
            return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse({"model": model, "embeddings": [normalize(ev.embedding).tolist() for ev in events],
                             "total_duration": time.perf_counter_ns() - t0, "load_duration": 0,
                             "prompt_eval_count": sum(len(p) for p in prompts)})

    async def ollama_embeddings(self, request: Request) -> Response:
        """/api/embeddings (ollama's older route): {"model", "prompt"} -> the vector, not normalized."""
        try:
            body = await self.service.body(request)
            self.embeds(await self.ollama.resolve(body))
            prompt = body.get("prompt", "")
            if not isinstance(prompt, str):
                raise APIError(400, f"'prompt' must be a string, got {kind(prompt)}")
            if not prompt:  # as ollama: nothing to embed
                return JSONResponse({"embedding": []})
            events = await self.vectors(request, [self.fit(p, True) for p in await self._encode([prompt])])
        except APIError as e:
            return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse({"embedding": np.asarray(events[0].embedding, np.float64).tolist()})
