"""OpenAI's API over the service (service.py): /v1/chat/completions and /v1/completions, whole or
as SSE streams, /v1/models, /health, /metrics; and create_app, the app of one model with every
route of the package.

The routes check OpenAI's fields (openai_request.py), hand the service a Generation and render the
Stream it returns in OpenAI's shapes.  A request whose client goes away is cancelled at once,
which frees its KV blocks.
"""
from __future__ import annotations

import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.engine.request import Event
from infer.engine.sampler import MAX_LOGPROBS, TokenLogprob

from . import openai_chat, openapi
from .embeddings_api import EmbeddingsAPI
from .llama_paths import UnversionedPaths
from .ollama_api import OllamaAPI
from .ollama_api import routes as ollama_routes
from .openai_logprobs import chat_logprobs, completion_logprobs
from .openai_request import APIError, ClientGone, bool_field, chat_messages, int_field, parse_job, text_field
from .rerank_api import ROUTES as RERANK_ROUTES
from .rerank_api import RerankAPI
from .server_metrics import Metrics
from .service import ChatPrompt, EngineService, Generation, ServerConfig, Service, Stream, TextPrompt, TokenPrompt
from .tokenize_api import TokenizeAPI
from .webui import page_routes

__all__ = ["FrontDoor", "OpenAIAPI", "ServerConfig", "create_app"]


class FrontDoor:
    """ASGI middleware: the API key on the /v1, ollama /api, (de)tokenize and rerank routes, and a
    request count by route and status."""

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count_request(path, message["status"])
            await send(message)

        if self.api_key and path.startswith(("/v1", "/api/", "/tokenize", "/detokenize", "/rerank")) and not self._authorized(scope):
            err = APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            response = JSONResponse({"error": err.message}, status_code=401, headers=err.headers) \
                if path.startswith("/api/") else err.response()  # ollama's error shape, or OpenAI's
            return await response(scope, receive, counted)
        try:
            await self.app(scope, receive, counted)
        except ClientDisconnect:
            pass  # the client left (or hit --timeout) before its request body was whole: nobody to answer

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key.encode())
        return False


# ---------------------------------------------------------------- the server


class OpenAIAPI:
    """OpenAI's routes: their fields to a Generation, the service's Stream to their shapes."""

    def __init__(self, service: Service):
        self.service = service
        self.llm = service.llm
        self.tokenizer = service.llm.tokenizer
        self.created = int(time.time())
        self.fingerprint = "fp_infer"

    # -- routes -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        eng = self.llm.engine
        return JSONResponse({"status": "ok", "model": self.service.config.model_id,
                             "running": eng.num_running(), "waiting": eng.num_waiting(),
                             **({"spec_drafted": eng.drafted, "spec_accepted": eng.accepted,
                                 "spec_acceptance": round(eng.accepted / eng.drafted, 4) if eng.drafted else None}
                                if eng.spec.kind else {})})

    async def metrics_route(self, request: Request) -> Response:
        return PlainTextResponse(self.service.metrics.render([self.llm.engine]), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.service.config.model_id, "object": "model", "created": self.created, "owned_by": "infer",
             "context_length": self.llm.engine.n_ctx},
        ]})

    async def chat(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            messages = chat_messages(body)
            want = bool_field(body, "logprobs")
            top = int_field(body, "top_logprobs")
            if top is not None and not want:
                raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
            if top is not None and not 0 <= top <= MAX_LOGPROBS:
                raise APIError(400, f"'top_logprobs' must be between 0 and {MAX_LOGPROBS}, got {top}", "top_logprobs",
                               "invalid_value")
            if body.get("functions"):
                raise APIError(400, "'functions' is not supported: send 'tools'", "functions", "unsupported_parameter")
            job = parse_job(body, (top or 0) if want else None)
            stream = await self.service.start(request, Generation(ChatPrompt(messages, openai_chat.plan_fields(body)), job))
        except (APIError, ClientGone) as e:
            return _refused(e)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": self.fingerprint}
        if job.stream:
            return self._sse(self._chat_chunks(head, stream))
        try:
            text, lps, ev = await self.service.collect(stream)
        except (APIError, ClientGone) as e:
            return _refused(e)
        r1, c1 = stream.reply.feed(text)
        r2, c2, calls = stream.reply.finish()
        choice = {"index": 0, "message": openai_chat.message(r1 + r2, c1 + c2, calls),
                  "logprobs": {"content": chat_logprobs(self.tokenizer, lps), "refusal": None} if job.logprobs else None,
                  "finish_reason": "tool_calls" if calls else ev.finish_reason}
        return JSONResponse({**head, "choices": [choice], "usage": _usage(ev)})

    async def _chat_chunks(self, head: dict, stream: Stream):
        head = {**head, "object": "chat.completion.chunk"}
        job, reply, events = stream.job, stream.reply, stream.events
        tail = {"usage": None} if job.include_usage else {}  # OpenAI's chunks but the last have a null usage

        def chunk(delta: dict, finish: str | None = None, lps: list[TokenLogprob] | None = None) -> dict:
            logprobs = {"content": chat_logprobs(self.tokenizer, lps or []), "refusal": None} if job.logprobs and lps else None
            return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                    **tail}

        def deltas(reasoning: str, content: str, lps=None):
            if reasoning:
                yield chunk({"reasoning_content": reasoning}, lps=lps)
                lps = None
            if content or lps:
                yield chunk({"content": content}, lps=lps)

        try:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
            ev = stream.first
            while True:
                if ev.text or ev.logprobs:
                    for c in deltas(*reply.feed(ev.text), lps=ev.logprobs):
                        yield c
                if ev.finish_reason is not None:
                    break
                ev = await anext(events)
            reasoning, content, calls = reply.finish()
            for c in deltas(reasoning, content):
                yield c
            for d in openai_chat.call_deltas(calls):
                yield chunk(d)
            yield chunk({}, "tool_calls" if calls else ev.finish_reason)
            if job.include_usage:
                yield {**head, "choices": [], "usage": _usage(ev)}
        finally:
            await events.aclose()  # cancels the request if the stream stopped early

    async def completions(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            prompt = self._prompt(body.get("prompt"))
            k = int_field(body, "logprobs")
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise APIError(400, f"'logprobs' must be between 0 and {MAX_LOGPROBS}, got {k}", "logprobs",
                               "invalid_value")
            if bool_field(body, "echo"):
                raise APIError(400, "'echo' is not supported", "echo", "unsupported_parameter")
            best_of = int_field(body, "best_of")
            if best_of is not None and best_of != 1:
                raise APIError(400, f"'best_of' must be 1, got {best_of}", "best_of", "invalid_value")
            if body.get("suffix"):
                raise APIError(400, "'suffix' is not supported", "suffix", "unsupported_parameter")
            job = parse_job(body, k)
            stream = await self.service.start(request, Generation(prompt, job))
        except (APIError, ClientGone) as e:
            return _refused(e)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model, "system_fingerprint": self.fingerprint}
        if job.stream:
            return self._sse(self._completion_chunks(head, stream))
        try:
            text, lps, ev = await self.service.collect(stream)
        except (APIError, ClientGone) as e:
            return _refused(e)
        choice = {"text": text, "index": 0,
                  "logprobs": completion_logprobs(self.tokenizer, lps, 0) if job.logprobs else None,
                  "finish_reason": ev.finish_reason}
        return JSONResponse({**head, "choices": [choice], "usage": _usage(ev)})

    def _prompt(self, prompt_in) -> TextPrompt | TokenPrompt:
        """A completion's prompt: a string or token ids (a batch of one of either)."""
        if isinstance(prompt_in, list) and len(prompt_in) == 1 and isinstance(prompt_in[0], (str, list)):
            prompt_in = prompt_in[0]  # a batch of one
        if isinstance(prompt_in, str):
            return TextPrompt(text_field(prompt_in, "prompt"))
        if isinstance(prompt_in, list) and prompt_in and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt_in):
            if not all(0 <= t < self.tokenizer.vocab_size for t in prompt_in):
                raise APIError(400, f"'prompt' token ids must be in [0, {self.tokenizer.vocab_size})", "prompt",
                               "invalid_value")
            return TokenPrompt(prompt_in)
        raise APIError(400, "'prompt' must be a string or an array of token ids (one prompt per request)",
                       "prompt", "invalid_type" if not isinstance(prompt_in, list) else "invalid_value")

    async def _completion_chunks(self, head: dict, stream: Stream):
        job, events = stream.job, stream.events
        tail = {"usage": None} if job.include_usage else {}
        offset = 0
        try:
            ev = stream.first
            while True:
                if ev.text or ev.logprobs or ev.finish_reason is not None:
                    lps = completion_logprobs(self.tokenizer, ev.logprobs or [], offset) if job.logprobs else None
                    offset += len(ev.text)
                    yield {**head, "choices": [{"text": ev.text, "index": 0, "logprobs": lps,
                                                "finish_reason": ev.finish_reason}], **tail}
                if ev.finish_reason is not None:
                    break
                ev = await anext(events)
            if job.include_usage:
                yield {**head, "choices": [], "usage": _usage(ev)}
        finally:
            await events.aclose()  # cancels the request if the stream stopped early

    def _sse(self, chunks: AsyncIterator[dict]) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                async for c in chunks:
                    yield b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"
            except ClientGone:
                return  # the finally of _events has cancelled the request; nobody is listening
            except APIError as e:  # the headers are out: the error goes in the stream, as OpenAI's do
                err = {"message": e.message, "type": e.type, "param": e.param, "code": e.code}
                yield b"data: " + json.dumps({"error": err}).encode() + b"\n\n"
                return
            finally:
                # however the body ends (even dropped unfinished), close the chain down to
                # _events now, whose finally cancels the request and frees its blocks
                await chunks.aclose()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _usage(ev: Event) -> dict:
    u = ev.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    if request.url.path.startswith("/api/"):  # ollama's error shape
        return JSONResponse({"error": msg[:300]}, status_code=exc.status_code, headers=exc.headers)
    return APIError(exc.status_code, msg[:300], None, code, headers=exc.headers).response()


async def _server_error(request: Request, exc: Exception) -> Response:
    # A bug of ours: the client still gets its API's error shape, and the server keeps serving.
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)
    return APIError(500, f"internal error: {type(exc).__name__}", None, "internal_error", "server_error").response()


def create_app(llm, config: ServerConfig, metrics: Metrics | None = None, own_lifespan: bool = True) -> Starlette:
    """The server of one model. Behind model_router.py (own_lifespan False): the router starts and
    stops its engine, and its front door (API key, CORS, request counts) is the router's."""
    service = EngineService(llm, config, metrics)
    server = OpenAIAPI(service)
    tokens = TokenizeAPI(service)
    ollama = OllamaAPI(service)
    embeddings = EmbeddingsAPI(service, ollama)
    rerank = RerankAPI(service, embeddings)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        llm.engine.start()
        try:
            yield
        finally:
            llm.engine.stop()

    routes = [
        *page_routes(config.webui, ollama.root),
        *ollama_routes(ollama),
        Route("/api/embed", embeddings.ollama_embed, methods=["POST"]),
        Route("/api/embeddings", embeddings.ollama_embeddings, methods=["POST"]),
        Route("/v1/embeddings", embeddings.openai, methods=["POST"]),
        *(Route(path, rerank.rerank, methods=["POST"]) for path in RERANK_ROUTES),
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
        Route("/openapi.json", openapi.endpoint, methods=["GET"]),
    ]
    middleware = [Middleware(UnversionedPaths)]  # outermost: the key and the counts see the /v1 path
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"], allow_headers=["*"]))
    middleware.append(Middleware(FrontDoor, api_key=config.api_key, metrics=service.metrics))
    app = Starlette(routes=routes, middleware=middleware if own_lifespan else [], lifespan=lifespan if own_lifespan else None,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    return app


def _refused(e: APIError | ClientGone) -> Response:
    """The answer to a request refused before its reply began: the error, or 499 (the client left)."""
    return e.response() if isinstance(e, APIError) else Response(status_code=499)
