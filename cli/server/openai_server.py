"""OpenAI's API over the service (service.py): /v1/chat/completions and /v1/completions, whole or
as SSE streams, /v1/models, /health, /metrics; and create_app, the app of one model with every
route of the package.

The routes check OpenAI's fields (openai_request.py), hand the service a Generation and render the
Stream it returns in OpenAI's shapes.  A request whose client goes away is cancelled at once,
which frees its KV blocks.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.engine.request import Event
from infer.engine.sampler import MAX_LOGPROBS, TokenLogprob

from . import anthropic_api, openai_chat, openapi
from .cors import Cors
from .embeddings_api import EmbeddingsAPI
from .error_shapes import error_response
from .llama_api import LLAMA_PATHS, LlamaAPI, SlotBook
from .llama_paths import UnversionedPaths
from .llama_props import LlamaProps, set_props, slot_action
from .ollama_api import OllamaAPI
from .ollama_api import routes as ollama_routes
from .openai_logprobs import chat_logprobs, completion_logprobs
from .openai_request import (
    MAX_CHOICES,
    APIError,
    ClientGone,
    Job,
    bool_field,
    chat_messages,
    int_field,
    parse_job,
    text_field,
)
from .rerank_api import ROUTES as RERANK_ROUTES
from .rerank_api import RerankAPI
from .responses_api import ResponsesAPI
from .server_metrics import Metrics
from .service import ChatPrompt, EngineService, Generation, ServerConfig, Service, Stream, TextPrompt, TokenPrompt
from .tokenize_api import TokenizeAPI
from .webui import page_routes

__all__ = ["FrontDoor", "OpenAIAPI", "ServerConfig", "create_app"]


# the paths behind --api-key: llama-server's are all but /health and /v1/health (and the web UI's)
PROTECTED = ("/v1", "/api/", "/tokenize", "/detokenize", "/rerank", *LLAMA_PATHS)
PUBLIC = frozenset({"/v1/health"})


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

        if self.api_key and path.startswith(PROTECTED) and path not in PUBLIC and not self._authorized(scope):
            err = APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await error_response(path, err)(scope, receive, counted)
        try:
            await self.app(scope, receive, counted)
        except ClientDisconnect:
            pass  # the client left (or hit --timeout) before its request body was whole: nobody to answer

    def _authorized(self, scope: Scope) -> bool:
        """'Authorization: Bearer <key>' (OpenAI's clients) or 'X-Api-Key: <key>' (Anthropic's, as
        llama-server also takes it)."""
        key = self.api_key.encode()
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), key):
                return True
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
            job = parse_job(body, (top or 0) if want else None, self.tokenizer)
            prompt = ChatPrompt(messages, openai_chat.plan_fields(body))
            streams = await self._start(request, [prompt], job)
        except (APIError, ClientGone) as e:
            return _refused(e)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": self.fingerprint}
        if job.stream:
            return self._sse(self._choices_chunks(head, streams, job, self._chat_chunks))
        try:
            whole = await self._collect(streams)
        except (APIError, ClientGone) as e:
            return _refused(e)
        choices = []
        for i, (stream, (text, lps, ev)) in enumerate(zip(streams, whole)):
            r1, c1 = stream.reply.feed(text)
            r2, c2, calls = stream.reply.finish()
            choices.append({"index": i, "message": openai_chat.message(r1 + r2, c1 + c2, calls),
                            "logprobs": {"content": chat_logprobs(self.tokenizer, lps), "refusal": None}
                            if job.logprobs else None,
                            "finish_reason": "tool_calls" if calls else ev.finish_reason})
        return JSONResponse({**head, "choices": choices, "usage": _usage([ev for _, _, ev in whole], job.n)})

    async def _start(self, request: Request, prompts: list, job: Job) -> list[Stream]:
        """n generations of each prompt (prompt-major, as OpenAI indexes the choices), each its own
        sequence: started one after another, so that the later ones find the prompt in the engine's
        prefix cache.  A choice's seed is the request's plus its index (the same seed n times would
        give n equal choices).  Past the context, max_tokens ends at the context (finish_reason
        "length"), as llama-server does.  If one cannot start, those started are cancelled."""
        if len(prompts) * job.n > MAX_CHOICES:
            raise APIError(400, f"{len(prompts)} prompts times n = {job.n} is {len(prompts) * job.n} choices; at most "
                           f"{MAX_CHOICES} in one request", "n", "invalid_value")
        streams: list[Stream] = []
        try:
            for prompt in prompts:
                for j in range(job.n):
                    seed = job.params.seed if job.params.seed is not None else self.service.config.seed
                    jj = job if seed is None or j == 0 else \
                        replace(job, params=replace(job.params, seed=(seed + j) % 2**64))
                    streams.append(await self.service.start(request, Generation(prompt, jj, clip=True)))
        except BaseException:
            for s in streams:
                await s.events.aclose()
            raise
        return streams

    async def _collect(self, streams: list[Stream]) -> list:
        """Every choice whole; if one fails, the others are cancelled."""
        tasks = [asyncio.ensure_future(self.service.collect(s)) for s in streams]
        try:
            return await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()  # a no-op for those done
            await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                await s.events.aclose()  # cancels the request of any choice still running

    async def _choices_chunks(self, head: dict, streams: list[Stream], job: Job, chunks) -> AsyncIterator[dict]:
        """The chunks of every choice, as they come (each carries its index), then the usage of all."""
        finals: list[Event | None] = [None] * len(streams)
        async for c in _merged([chunks(head, s, i, finals) for i, s in enumerate(streams)]):
            yield {**c, "usage": None} if job.include_usage else c  # OpenAI's chunks but the last: a null usage
        if job.include_usage:
            yield {**head, "object": "chat.completion.chunk" if chunks == self._chat_chunks else head["object"],
                   "choices": [], "usage": _usage(finals, job.n)}

    async def _chat_chunks(self, head: dict, stream: Stream, index: int, finals: list):
        head = {**head, "object": "chat.completion.chunk"}
        job, reply, events = stream.job, stream.reply, stream.events

        def chunk(delta: dict, finish: str | None = None, lps: list[TokenLogprob] | None = None) -> dict:
            logprobs = {"content": chat_logprobs(self.tokenizer, lps or []), "refusal": None} if job.logprobs and lps else None
            return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

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
            finals[index] = ev
            yield chunk({}, "tool_calls" if calls else ev.finish_reason)
        finally:
            await events.aclose()  # cancels the request if the stream stopped early

    async def completions(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            prompts = self._prompts(body.get("prompt"))
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
            job = parse_job(body, k, self.tokenizer)
            streams = await self._start(request, prompts, job)
        except (APIError, ClientGone) as e:
            return _refused(e)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model, "system_fingerprint": self.fingerprint}
        if job.stream:
            return self._sse(self._choices_chunks(head, streams, job, self._completion_chunks))
        try:
            whole = await self._collect(streams)
        except (APIError, ClientGone) as e:
            return _refused(e)
        choices = [{"text": text, "index": i,
                    "logprobs": completion_logprobs(self.tokenizer, lps, 0) if job.logprobs else None,
                    "finish_reason": ev.finish_reason} for i, (text, lps, ev) in enumerate(whole)]
        return JSONResponse({**head, "choices": choices, "usage": _usage([ev for _, _, ev in whole], job.n)})

    def _prompts(self, prompt_in) -> list[TextPrompt | TokenPrompt]:
        """A completion's prompts: a string or token ids, or an array of them (several prompts)."""
        if isinstance(prompt_in, list) and prompt_in and all(isinstance(p, (str, list)) for p in prompt_in):
            return [self._prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt_in)]
        return [self._prompt(prompt_in, "prompt")]

    def _prompt(self, prompt_in, param: str) -> TextPrompt | TokenPrompt:
        if isinstance(prompt_in, str):
            return TextPrompt(text_field(prompt_in, param))
        if isinstance(prompt_in, list) and prompt_in and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt_in):
            if not all(0 <= t < self.tokenizer.vocab_size for t in prompt_in):
                raise APIError(400, f"'{param}' token ids must be in [0, {self.tokenizer.vocab_size})", param,
                               "invalid_value")
            return TokenPrompt(prompt_in)
        raise APIError(400, f"'{param}' must be a string or a non-empty array of token ids (or 'prompt' an array "
                       "of them)", param, "invalid_type" if not isinstance(prompt_in, list) else "invalid_value")

    async def _completion_chunks(self, head: dict, stream: Stream, index: int, finals: list):
        job, events = stream.job, stream.events
        offset = 0
        try:
            ev = stream.first
            while True:
                if ev.finish_reason is not None:
                    finals[index] = ev
                if ev.text or ev.logprobs or ev.finish_reason is not None:
                    lps = completion_logprobs(self.tokenizer, ev.logprobs or [], offset) if job.logprobs else None
                    offset += len(ev.text)
                    yield {**head, "choices": [{"text": ev.text, "index": index, "logprobs": lps,
                                                "finish_reason": ev.finish_reason}]}
                if ev.finish_reason is not None:
                    break
                ev = await anext(events)
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


def _usage(finals: list, n: int) -> dict:
    """The usage of a request's choices (prompt-major, n to a prompt), as OpenAI counts it: each
    prompt once (its first choice's count, cached tokens included), the completions of every choice."""
    firsts = [ev.usage for ev in finals[::n]]
    prompt = sum(u.prompt_tokens for u in firsts)
    completion = sum(ev.usage.completion_tokens for ev in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(u.cached_tokens for u in firsts)}}


async def _merged(gens: list) -> AsyncIterator[dict]:
    """The items of several async generators as each comes; all of them closed however this ends."""
    if len(gens) == 1:
        try:
            async for item in gens[0]:
                yield item
        finally:
            await gens[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(g) -> None:
        try:
            async for item in g:
                queue.put_nowait((item, None))
            queue.put_nowait((None, None))
        except Exception as e:  # APIError, ClientGone: the whole stream's
            queue.put_nowait((None, e))

    tasks = [asyncio.ensure_future(pump(g)) for g in gens]
    try:
        left = len(gens)
        while left:
            item, err = await queue.get()
            if err is not None:
                raise err
            if item is None:
                left -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for g in gens:
            await g.aclose()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(request.url.path, APIError(exc.status_code, msg[:300], None, code, headers=exc.headers))


async def _server_error(request: Request, exc: Exception) -> Response:
    # A bug of ours: the client still gets its API's error shape, and the server keeps serving.
    err = APIError(500, f"internal error: {type(exc).__name__}", None, "internal_error", "server_error")
    return error_response(request.url.path, err)


def create_app(llm, config: ServerConfig, metrics: Metrics | None = None, own_lifespan: bool = True) -> Starlette:
    """The server of one model. Behind model_router.py (own_lifespan False): the router starts and
    stops its engine, and its front door (API key, CORS, request counts) is the router's."""
    service = EngineService(llm, config, metrics)
    server = OpenAIAPI(service)
    tokens = TokenizeAPI(service)
    ollama = OllamaAPI(service)
    embeddings = EmbeddingsAPI(service, ollama)
    rerank = RerankAPI(service, embeddings)
    responses = ResponsesAPI(service)
    anthropic = anthropic_api.AnthropicAPI(service)
    slots = SlotBook(llm.engine)
    llama, props = LlamaAPI(service, slots), LlamaProps(service, slots)

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
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
        *anthropic_api.routes(anthropic),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/health", server.health, methods=["GET"]),
        *(Route(path, llama.completion, methods=["POST"]) for path in ("/completion", "/completions")),
        Route("/infill", llama.infill, methods=["POST"]),
        Route("/props", props.props, methods=["GET"]),
        Route("/props", set_props, methods=["POST"]),
        Route("/slots", props.get_slots, methods=["GET"]),
        Route("/slots/{id_slot}", slot_action, methods=["POST"]),
        Route("/apply-template", props.apply_template, methods=["POST"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
        Route("/openapi.json", openapi.endpoint, methods=["GET"]),
    ]
    middleware = [Middleware(UnversionedPaths),  # outermost: the key and the counts see the /v1 path
                  Middleware(Cors, origins=config.cors_origins),
                  Middleware(FrontDoor, api_key=config.api_key, metrics=service.metrics)]
    app = Starlette(routes=routes, middleware=middleware if own_lifespan else [], lifespan=lifespan if own_lifespan else None,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.responses = responses  # the router finds a stored response's model here
    return app


def _refused(e: APIError | ClientGone) -> Response:
    """The answer to a request refused before its reply began: the error, or 499 (the client left)."""
    return e.response() if isinstance(e, APIError) else Response(status_code=499)
