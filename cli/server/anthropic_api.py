"""Anthropic's Messages API over the service (service.py): POST /v1/messages, whole or as server-sent
events in Anthropic's sequence, and POST /v1/messages/count_tokens, for Claude Code and the
official `anthropic` clients.

The request becomes the OpenAI chat route's ChatPrompt (anthropic_request.py); the reply comes
apart in the same ChatReply (openai_chat.py: thinking, text, tool calls) and goes out as content
blocks: thinking (an empty signature: a local model signs nothing, as llama-server's), text,
tool_use.  A stream is message_start, then per block content_block_start, its deltas
(thinking_delta and signature_delta, text_delta, input_json_delta) and content_block_stop, the
blocks one after another with rising indices, then message_delta (stop_reason, stop_sequence,
usage) and message_stop.  Errors take Anthropic's envelope, {"type": "error", "error": {"type",
"message"}}, with the status of the APIError behind them.
"""
from __future__ import annotations

import json
import uuid
from types import MappingProxyType
from typing import AsyncIterator, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from infer.engine.request import Event
from infer.engine.tool_calls import ToolCall

from . import anthropic_request
from .openai_request import APIError, ClientGone
from .service import ChatPrompt, Generation, Service, Stream

ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
PREFIX = "/v1/messages"  # the paths whose errors (the router's, the front door's) take Anthropic's envelope
ERROR_TYPES = MappingProxyType({400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                                503: "overloaded_error", 529: "overloaded_error"})


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(e: APIError) -> dict:
    return {"type": "error", "error": {"type": error_type(e.status), "message": e.message}}


def error_response(e: APIError | ClientGone) -> Response:
    """An APIError in Anthropic's envelope (its headers kept: a 503's Retry-After); 499 for a client gone."""
    if isinstance(e, ClientGone):
        return Response(status_code=499)
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)


def usage(ev: Event) -> dict:
    """Anthropic's usage: input_tokens are the prompt's tokens computed, the prefix cache's apart."""
    u = ev.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def tool_use(call: ToolCall) -> dict:
    """A tool call as a tool_use block: Anthropic's id prefix, the arguments as an object."""
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        value = {"value": call.arguments}
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": value if isinstance(value, dict) else {"value": value}}


class Blocks:
    """A stream's content blocks, one open at a time: a delta of another kind closes the open block
    (a thinking block with its signature_delta) and starts the next, at the next index."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def _start(self, block: dict) -> Iterator[tuple[str, dict]]:
        yield from self.close()
        self.index += 1
        self.open = block["type"]
        yield "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def add(self, reasoning: str, content: str) -> Iterator[tuple[str, dict]]:
        if reasoning:
            if self.open != "thinking":
                yield from self._start({"type": "thinking", "thinking": ""})
            yield self._delta({"type": "thinking_delta", "thinking": reasoning})
        if content:
            if self.open != "text":
                yield from self._start({"type": "text", "text": ""})
            yield self._delta({"type": "text_delta", "text": content})

    def call(self, call: ToolCall) -> Iterator[tuple[str, dict]]:
        block = tool_use(call)
        yield from self._start({**block, "input": {}})
        yield self._delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})

    def close(self) -> Iterator[tuple[str, dict]]:
        if self.open is None:
            return
        if self.open == "thinking":  # Anthropic's clients expect a signature before a thinking block ends
            yield self._delta({"type": "signature_delta", "signature": ""})
        self.open = None
        yield "content_block_stop", {"type": "content_block_stop", "index": self.index}


class AnthropicAPI:
    """The Messages routes: their fields to a Generation, the service's Stream to Anthropic's shapes."""

    def __init__(self, service: Service):
        self.service = service

    async def messages(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            req = anthropic_request.conversation(body)
            job = anthropic_request.job(body)
            self.service.check_model({"model": req.model})
            prompt = ChatPrompt(req.messages, req.fields, think=req.think)
            # max_tokens past the context stops at its end (llama-server's rule): Claude Code asks for
            # 32000 whatever the model, which a refusal would make unusable on a smaller context
            stream = await self.service.start(request, Generation(prompt, job, clip=True))
        except (APIError, ClientGone) as e:
            return error_response(e)
        head = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": req.model}
        if job.stream:
            return self._sse(self._events(head, stream))
        try:
            text, _, ev = await self.service.collect(stream)
        except (APIError, ClientGone) as e:
            return error_response(e)
        assert stream.reply is not None  # a ChatPrompt's stream always has one
        r1, c1 = stream.reply.feed(text)
        r2, c2, calls = stream.reply.finish()
        content: list[dict] = []
        if r1 + r2:
            content.append({"type": "thinking", "thinking": r1 + r2, "signature": ""})
        if c1 + c2:
            content.append({"type": "text", "text": c1 + c2})
        content += [tool_use(c) for c in calls]
        reason, sequence = self._stop(stream, ev, text, bool(calls))
        return JSONResponse({**head, "content": content, "stop_reason": reason, "stop_sequence": sequence,
                             "usage": usage(ev)})

    async def count_tokens(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            req = anthropic_request.conversation(body)
            self.service.check_model({"model": req.model})
            ids = await self.service.chat_tokens(ChatPrompt(req.messages, req.fields, think=req.think))
        except APIError as e:
            return error_response(e)
        return JSONResponse({"input_tokens": len(ids)})

    def _stop(self, stream: Stream, ev: Event, text: str, called: bool) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence).  The engine drops a stop string from the text it sends; the
        one that stopped it is the first to complete after that text in the tokens generated."""
        if called:
            return "tool_use", None
        if ev.finish_reason == "length":
            return "max_tokens", None
        stops = stream.job.params.stop
        if ev.finish_reason == "stop" and stops:
            whole = self.service.llm.tokenizer.decode(ev.token_ids, special=stream.job.params.special)
            tail = whole[len(text):] if whole.startswith(text) else whole
            found = [(tail.find(s) + len(s), -len(s), s) for s in stops if s in tail]
            if found:
                return "stop_sequence", min(found)[2]
        return "end_turn", None

    async def _events(self, head: dict, stream: Stream) -> AsyncIterator[tuple[str, dict]]:
        reply, events = stream.reply, stream.events
        assert reply is not None
        start_usage = {"input_tokens": len(stream.prompt), "output_tokens": 0, "cache_read_input_tokens": 0,
                       "cache_creation_input_tokens": 0}  # the cache's share is known at the end (message_delta)
        blocks, parts = Blocks(), []
        try:
            yield "message_start", {"type": "message_start", "message": {
                **head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}}
            ev = stream.first
            while True:
                if ev.text:
                    parts.append(ev.text)
                    for e in blocks.add(*reply.feed(ev.text)):
                        yield e
                if ev.finish_reason is not None:
                    break
                ev = await anext(events)
            reasoning, content, calls = reply.finish()
            for e in blocks.add(reasoning, content):
                yield e
            for c in calls:
                for e in blocks.call(c):
                    yield e
            for e in blocks.close():
                yield e
            reason, sequence = self._stop(stream, ev, "".join(parts), bool(calls))
            yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                    "usage": usage(ev)}
            yield "message_stop", {"type": "message_stop"}
        finally:
            await events.aclose()  # cancels the request if the stream stopped early

    def _sse(self, events: AsyncIterator[tuple[str, dict]]) -> StreamingResponse:
        def event(name: str, data: dict) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for name, data in events:
                    yield event(name, data)
            except ClientGone:
                return  # the request is cancelled already; nobody is listening
            except APIError as e:  # the status is out: the error is an event, as Anthropic's are
                yield event("error", error_body(e))
            finally:
                await events.aclose()

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def routes(api: AnthropicAPI) -> list:
    from starlette.routing import Route

    return [Route(ROUTES[0], api.messages, methods=["POST"]), Route(ROUTES[1], api.count_tokens, methods=["POST"])]
