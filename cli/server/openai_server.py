"""An OpenAI-compatible HTTP front end over the engine: Starlette routes, SSE streams, metrics.

Requests are validated here and become token ids and SamplingParams; the engine steps in its own
thread and hands each event to the event loop through a per-request asyncio queue.  A request
whose client goes away is cancelled at once, which frees its KV blocks.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.engine.chat_template import ChatTemplateError
from infer.engine.engine import PromptError
from infer.engine.request import Event
from infer.engine.grammar import GrammarError
from infer.engine.sampler import MAX_LOGPROBS, SamplingParams, TokenLogprob
from infer.engine.tokenizer import TokenizerError

from . import openai_chat, openapi
from .embeddings_api import EmbeddingsAPI
from .ollama_api import OllamaAPI
from .ollama_api import routes as ollama_routes
from .tokenize_api import TokenizeAPI
from .webui import page_routes
from .openai_logprobs import chat_logprobs, completion_logprobs
from .openai_request import (APIError, ClientGone, Job, bool_field, chat_messages, disconnected, int_field, kind,
                             parse_job, parse_json, text_field)
from .server_metrics import Metrics



@dataclass(frozen=True)
class ServerConfig:
    model_id: str
    model_aliases: tuple[str, ...] = ()  # other names a request may use for the model
    api_key: str | None = None
    max_queue: int = 64  # requests that would wait for a running slot beyond this many get 503
    max_body: int = 8 * 2**20
    cors_origins: tuple[str, ...] = ()
    reasoning_format: str = "deepseek"  # --reasoning-format: "deepseek" splits <think> off as reasoning_content
    any_name: bool = False  # behind model_router.py, which has resolved the request's model name already
    webui: bool = True  # GET / from a browser: the chat page (webui.py); --no-webui: ollama's answer only


class FrontDoor:
    """ASGI middleware: the API key on the /v1, ollama /api and (de)tokenize routes, and a request
    count by route and status."""

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

        if self.api_key and path.startswith(("/v1", "/api/", "/tokenize", "/detokenize")) and not self._authorized(scope):
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


class OpenAIServer:
    def __init__(self, llm, config: ServerConfig, metrics: Metrics | None = None):
        self.llm = llm
        self.engine = llm.engine
        self.tokenizer = llm.tokenizer
        self.config = config
        self.metrics = metrics or Metrics()
        self.created = int(time.time())
        self.fingerprint = "fp_infer"

    # -- plumbing ---------------------------------------------------------------------------------

    async def json_body(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.config.max_body:
            raise self._too_large()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body:
                raise self._too_large()
            chunks.append(chunk)
        body = parse_json(b"".join(chunks))
        if not isinstance(body, dict):
            raise APIError(400, f"the request body must be a JSON object, got {kind(body)}", None, "invalid_type")
        return body

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.config.max_body} bytes", None, "body_too_large")

    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is None:
            return self.config.model_id
        if not isinstance(model, str):
            raise APIError(400, f"'model' must be a string, got {kind(model)}", "model", "invalid_type")
        if model != self.config.model_id and model not in self.config.model_aliases and not self.config.any_name:
            raise APIError(404, f"the model {model[:200]!r} does not exist; this server has {self.config.model_id!r}",
                           "model", "model_not_found")
        return self.config.model_id

    def fit(self, job: Job, prompt: list[int]) -> SamplingParams:
        """The job's params with max_tokens checked against (or defaulted to) the room left."""
        n_ctx, n = self.engine.n_ctx, len(prompt)
        if n == 0:
            raise APIError(400, "the prompt is empty", None, "invalid_value")
        if n >= n_ctx:
            raise APIError(400, f"the prompt has {n} tokens but the context holds {n_ctx} (with room for at least "
                           "one generated token); shorten the prompt", None, "context_length_exceeded")
        if job.max_tokens is None:
            return replace(job.params, max_tokens=n_ctx - n)
        if n + job.max_tokens > n_ctx:
            raise APIError(400, f"the prompt has {n} tokens and max_tokens asks for {job.max_tokens} more, "
                           f"{n + job.max_tokens} in all, but the context holds {n_ctx}; lower max_tokens or shorten "
                           "the prompt", "max_tokens", "context_length_exceeded")
        return replace(job.params, max_tokens=job.max_tokens)

    async def compile_grammar(self, job: Job):
        """The job's grammar compiled off the event loop (the first one hands the vocabulary to the
        grammar engine, a second or two; a large grammar takes up to a second to build), for
        add_request; a bad one is a 400."""
        g = job.params.grammar
        if g is None:
            return None
        try:
            return await asyncio.to_thread(self.engine.grammars.compile, g)
        except GrammarError as e:
            raise APIError(400, str(e), job.grammar_param, "invalid_grammar") from None

    def admit(self) -> None:
        """503 when one more request would wait beyond --max-queue."""
        eng = self.engine
        free_slots = max(0, eng.scheduler.max_seqs - eng.num_running())
        if eng.num_waiting() + 1 > self.config.max_queue + free_slots:
            raise APIError(503, f"the server is overloaded ({self.config.max_queue} requests already waiting); "
                           "retry shortly", None, "server_overloaded", "server_error", {"Retry-After": "1"})

    async def events(self, request: Request, prompt: list[int], params: SamplingParams,
                      compiled=None) -> AsyncIterator[Event]:
        """The engine's events for one request, until its finish; the request is cancelled (its KV
        blocks freed) as soon as the client disconnects or the consumer stops early."""
        self.admit()
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        t0 = time.perf_counter()
        try:
            rid = self.engine.add_request(prompt, params, sink=lambda ev: loop.call_soon_threadsafe(q.put_nowait, ev),
                                          compiled=compiled)
        except (PromptError, GrammarError) as e:
            raise APIError(400, str(e), None, "invalid_value") from None

        async def watch() -> None:
            await disconnected(request.receive)
            q.put_nowait(None)

        watcher = asyncio.ensure_future(watch())
        done = False
        last = None
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    raise ClientGone
                now = time.perf_counter()
                if last is None and (ev.token_id is not None or (ev.finish_reason and ev.usage.completion_tokens)):
                    self.metrics.ttft.observe(now - t0)
                    last = now
                elif last is not None and ev.token_id is not None:
                    self.metrics.itl.observe(now - last)
                    last = now
                if ev.finish_reason == "error":
                    done = True
                    err = self.engine.last_error
                    raise APIError(500, f"generation failed: {type(err).__name__}: {err}".splitlines()[0][:300],
                                   None, "engine_error", "server_error")
                if ev.finish_reason is not None:
                    done = True
                    u = ev.usage
                    self.metrics.prompt_tokens += u.prompt_tokens
                    self.metrics.cached_tokens += u.cached_tokens
                    self.metrics.completion_tokens += u.completion_tokens
                yield ev
                if done:
                    return
        finally:
            watcher.cancel()
            if not done:
                self.engine.cancel(rid)

    async def encode(self, fn, arg) -> list[int]:
        try:
            return await asyncio.to_thread(fn, arg)
        except (ChatTemplateError, TokenizerError) as e:
            raise APIError(400, str(e).splitlines()[0], None, "invalid_value") from None

    # -- routes -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        eng = self.engine
        return JSONResponse({"status": "ok", "model": self.config.model_id,
                             "running": eng.num_running(), "waiting": eng.num_waiting(),
                             **({"spec_drafted": eng.drafted, "spec_accepted": eng.accepted,
                                 "spec_acceptance": round(eng.accepted / eng.drafted, 4) if eng.drafted else None}
                                if eng.spec.kind else {})})

    async def metrics_route(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render([self.engine]), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "infer",
             "context_length": self.engine.n_ctx},
        ]})

    async def chat(self, request: Request) -> Response:
        try:
            body = await self.json_body(request)
            model = self.check_model(body)
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
            chat, tool_grammar = openai_chat.plan(body, messages, self.llm.template.source,
                                                  self.config.reasoning_format, job, self.tokenizer.token_id)
            prompt, opened = await self.encode(lambda c: openai_chat.encode(self.llm, c), chat)
            job, opened = openai_chat.constrain(job, chat, tool_grammar, opened)
            compiled = await self.compile_grammar(job)
            params = self.fit(job, prompt)
            events = self.events(request, prompt, params, compiled)
            first = await anext(events)  # surfaces a 503 or a cancelled request before any header goes out
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": self.fingerprint}
        reply = openai_chat.ChatReply(chat, opened)
        if job.stream:
            return self._sse(self._chat_chunks(head, first, events, job, reply))
        try:
            text, lps, ev = await self.collect(first, events)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        r1, c1 = reply.feed(text)
        r2, c2, calls = reply.finish()
        choice = {"index": 0, "message": openai_chat.message(r1 + r2, c1 + c2, calls),
                  "logprobs": {"content": chat_logprobs(self.tokenizer, lps), "refusal": None} if job.logprobs else None,
                  "finish_reason": "tool_calls" if calls else ev.finish_reason}
        return JSONResponse({**head, "choices": [choice], "usage": _usage(ev)})

    @staticmethod
    async def collect(first: Event, events: AsyncIterator[Event]) -> tuple[str, list[TokenLogprob], Event]:
        """A whole non-streamed reply: (text, logprobs, the finish event)."""
        parts, lps = [], []
        ev = first
        while True:
            parts.append(ev.text)
            lps += ev.logprobs or []
            if ev.finish_reason is not None:
                return "".join(parts), lps, ev
            ev = await anext(events)

    async def _chat_chunks(self, head: dict, first: Event, events: AsyncIterator[Event], job: Job, reply):
        head = {**head, "object": "chat.completion.chunk"}
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
            ev = first
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
            body = await self.json_body(request)
            model = self.check_model(body)
            prompt_in = body.get("prompt")
            if isinstance(prompt_in, list) and len(prompt_in) == 1 and isinstance(prompt_in[0], (str, list)):
                prompt_in = prompt_in[0]  # a batch of one
            if isinstance(prompt_in, str):
                prompt_in = text_field(prompt_in, "prompt")
            elif isinstance(prompt_in, list) and prompt_in and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt_in):
                if not all(0 <= t < self.tokenizer.vocab_size for t in prompt_in):
                    raise APIError(400, f"'prompt' token ids must be in [0, {self.tokenizer.vocab_size})", "prompt",
                                   "invalid_value")
            else:
                raise APIError(400, "'prompt' must be a string or an array of token ids (one prompt per request)",
                               "prompt", "invalid_type" if not isinstance(prompt_in, list) else "invalid_value")
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
            compiled = await self.compile_grammar(job)
            prompt = (await self.encode(self.llm.encode_raw, prompt_in)) if isinstance(prompt_in, str) else prompt_in
            params = self.fit(job, prompt)
            events = self.events(request, prompt, params, compiled)
            first = await anext(events)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model, "system_fingerprint": self.fingerprint}
        if job.stream:
            return self._sse(self._completion_chunks(head, first, events, job))
        try:
            text, lps, ev = await self.collect(first, events)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=499)
        choice = {"text": text, "index": 0,
                  "logprobs": completion_logprobs(self.tokenizer, lps, 0) if job.logprobs else None,
                  "finish_reason": ev.finish_reason}
        return JSONResponse({**head, "choices": [choice], "usage": _usage(ev)})

    async def _completion_chunks(self, head: dict, first: Event, events: AsyncIterator[Event], job: Job):
        tail = {"usage": None} if job.include_usage else {}
        offset = 0
        try:
            ev = first
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
    server = OpenAIServer(llm, config, metrics)
    tokens = TokenizeAPI(server)
    ollama = OllamaAPI(server)
    embeddings = EmbeddingsAPI(server, ollama)

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
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
        Route("/openapi.json", openapi.endpoint, methods=["GET"]),
    ]
    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"], allow_headers=["*"]))
    middleware.append(Middleware(FrontDoor, api_key=config.api_key, metrics=server.metrics))
    app = Starlette(routes=routes, middleware=middleware if own_lifespan else [], lifespan=lifespan if own_lifespan else None,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.server = server
    return app
