"""OpenAI's Responses API over the service (service.py): POST /v1/responses, whole or as server-sent
events, and GET / DELETE /v1/responses/{id} for the responses the server remembers.

A request is read as the chat request it amounts to (responses_input.py), checked and planned by
the chat route's own code (openai_request.parse_job, openai_chat.plan through the service), and
its reply, split by openai_chat.ChatReply into reasoning, text and tool calls, comes back as
output items: a reasoning item, a message, function calls.  The server keeps the last responses it
produced (ResponseStore, one per model's service) so that previous_response_id continues their
conversation, as OpenAI's does within its storage.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from infer.engine.sampler import SamplingParams
from infer.engine.tool_calls import ToolCall

from .openai_chat import ChatReply, plan_fields
from .openai_request import APIError, ClientGone, chat_messages, kind, parse_job
from .responses_input import chat_request, metadata
from .service import ChatPrompt, Generation, Service, Stream

STORED = 512  # responses a model's service remembers for previous_response_id and GET (least recent out)
# the chat route's params named as a Responses request names them, for errors
PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format", "reasoning_effort": "reasoning.effort"}


@dataclass(frozen=True)
class Stored:
    response: dict  # the response object, as GET /v1/responses/{id} returns it
    conversation: tuple[dict, ...]  # its turns as chat messages (its instructions aside), its reply last


class ResponseStore:
    """The responses a model's service has produced, the most recent STORED of them (an LRU: a
    response continued or read counts as recent)."""

    def __init__(self, capacity: int = STORED):
        self.capacity = capacity
        self.entries: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, entry: Stored) -> None:
        self.entries[rid] = entry
        self.entries.move_to_end(rid)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        entry = self.entries.get(rid)
        if entry is not None:
            self.entries.move_to_end(rid)
        return entry

    def delete(self, rid: str) -> bool:
        return self.entries.pop(rid, None) is not None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
    """A reply's output items, built from its pieces as they come (reasoning and text deltas, the
    tool calls at the end), and the stream events that announce them.  One item is open at a time:
    a piece of another kind closes it and opens the next, so the items keep the reply's order."""

    def __init__(self):
        self.items: list[dict] = []
        self.open: dict | None = None
        self.text = ""  # the open item's text so far

    def piece(self, kind: str, delta: str) -> list[dict]:
        """Events for a delta of reasoning ("reasoning") or text ("message")."""
        if not delta:
            return []
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self.close("completed")
            events += self._start(kind)
        self.text += delta
        i = len(self.items) - 1
        t = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return events + [{"type": t, "item_id": self.open["id"], "output_index": i, "content_index": 0, "delta": delta,
                          **extra}]

    def _start(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "encrypted_content": None,
                    "status": "in_progress"}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        self.items.append(item)
        self.open, self.text = item, ""
        i = len(self.items) - 1
        return [{"type": "response.output_item.added", "output_index": i, "item": _copy(item)},
                {"type": "response.content_part.added", "item_id": item["id"], "output_index": i, "content_index": 0,
                 "part": self._part("")}]

    def _part(self, text: str) -> dict:
        if self.open is not None and self.open["type"] == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def close(self, status: str) -> list[dict]:
        """Events that finish the open item (none when none is open)."""
        item = self.open
        if item is None:
            return []
        i, part = len(self.items) - 1, self._part(self.text)
        item["content"], item["status"] = [part], status
        done = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
        extra = {} if item["type"] == "reasoning" else {"logprobs": []}
        self.open, self.text = None, ""
        return [{"type": done, "item_id": item["id"], "output_index": i, "content_index": 0, "text": part["text"],
                 **extra},
                {"type": "response.content_part.done", "item_id": item["id"], "output_index": i, "content_index": 0,
                 "part": dict(part)},
                {"type": "response.output_item.done", "output_index": i, "item": _copy(item)}]

    def calls(self, calls: list[ToolCall]) -> list[dict]:
        """Events of the reply's function calls (each whole: its arguments in one delta)."""
        events = []
        for c in calls:
            item = {"id": new_id("fc"), "type": "function_call", "call_id": c.id, "name": c.name, "arguments": "",
                    "status": "in_progress"}
            self.items.append(item)
            i = len(self.items) - 1
            events.append({"type": "response.output_item.added", "output_index": i, "item": dict(item)})
            events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": i,
                           "delta": c.arguments})
            item.update(arguments=c.arguments, status="completed")
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": i,
                           "name": c.name, "arguments": c.arguments})
            events.append({"type": "response.output_item.done", "output_index": i, "item": dict(item)})
        return events

    def message(self) -> dict:
        """The reply as the assistant's chat message, for the conversation a later request continues."""
        msg: dict = {"role": "assistant", "content": "".join(
            p["text"] for it in self.items if it["type"] == "message" for p in it["content"])}
        reasoning = "".join(p["text"] for it in self.items if it["type"] == "reasoning" for p in it["content"])
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
                 for it in self.items if it["type"] == "function_call"]
        if calls:
            msg["tool_calls"] = calls
        return msg


def _copy(item: dict) -> dict:
    return {**item, "content": [dict(p) for p in item["content"]]}


class ResponsesAPI:
    """POST /v1/responses and the stored responses of one model's service."""

    def __init__(self, service: Service, store: ResponseStore | None = None):
        self.service = service
        self.store = store or ResponseStore()

    async def create(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = self.service.check_model(body)
            earlier = self._earlier(body.get("previous_response_id"))
            req = chat_request(body, earlier)
            store = body.get("store", True)
            if not isinstance(store, bool):
                raise APIError(400, f"'store' must be true or false, got {kind(store)}", "store", "invalid_type")
            job = parse_job(req.fields, None)
            prompt = ChatPrompt(chat_messages(req.fields), plan_fields(req.fields), think=False if req.no_thinking else None)
            stream = await self.service.start(request, Generation(prompt, job))
        except APIError as e:
            return renamed(e).response()
        except ClientGone:
            return Response(status_code=499)
        head = self._head(body, model, job.params)
        turn = Turn(self, head, stream, req.conversation, store)
        if job.stream:
            return _sse(turn.events())
        try:
            async for _ in turn.events():
                pass
        except APIError as e:
            return renamed(e).response()
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse(turn.response)

    def _earlier(self, prev: Any) -> list[dict]:
        if prev is None:
            return []
        if not isinstance(prev, str):
            raise APIError(400, f"'previous_response_id' must be a string, got {kind(prev)}", "previous_response_id",
                           "invalid_type")
        entry = self.store.get(prev)
        if entry is None:  # OpenAI's answer, word for word
            raise APIError(400, f"Previous response with id '{prev[:100]}' not found.", "previous_response_id",
                           "previous_response_not_found")
        return [dict(m) for m in entry.conversation]

    def _head(self, body: dict, model: str, params: SamplingParams) -> dict:
        """The response object before its output: the request's settings echoed, as OpenAI's are."""
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        reasoning = body.get("reasoning") or {}
        return {
            "id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None, "model": model, "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default", "store": body.get("store", True), "temperature": params.temperature,
            "text": {"format": text.get("format") or {"type": "text"}}, "tool_choice": body.get("tool_choice") or "auto",
            "tools": [{"strict": True, **t} for t in body.get("tools") or []], "top_p": params.top_p,
            "truncation": "disabled", "usage": None, "user": body.get("user"), "metadata": metadata(body.get("metadata")) or {},
        }

    async def retrieve(self, request: Request) -> Response:
        rid = request.path_params["response_id"]
        entry = self.store.get(rid)
        if entry is None:
            return not_found(rid).response()
        return JSONResponse(entry.response)

    async def delete(self, request: Request) -> Response:
        rid = request.path_params["response_id"]
        if not self.store.delete(rid):
            return not_found(rid).response()
        return JSONResponse({"id": rid, "object": "response", "deleted": True})


class Turn:
    """One response under way: the engine's events through the chat reply's split into output
    items and their stream events; at the end the whole response, kept in the store."""

    def __init__(self, api: ResponsesAPI, head: dict, stream: Stream, conversation: list[dict], store: bool):
        self.api, self.head, self.stream, self.conversation, self.keep = api, head, stream, conversation, store
        self.response = head

    async def events(self) -> AsyncIterator[dict]:
        stream, out = self.stream, Output()
        reply = cast(ChatReply, stream.reply)  # a ChatPrompt's stream always has one
        try:
            yield {"type": "response.created", "response": self.head}
            yield {"type": "response.in_progress", "response": self.head}
            ev = stream.first
            while True:
                if ev.text:
                    reasoning, content = reply.feed(ev.text)
                    for e in out.piece("reasoning", reasoning) + out.piece("message", content):
                        yield e
                if ev.finish_reason is not None:
                    break
                ev = await anext(stream.events)
            reasoning, content, calls = reply.finish()
            cut = ev.finish_reason == "length" and not calls
            for e in out.piece("reasoning", reasoning) + out.piece("message", content) + \
                    out.close("incomplete" if cut else "completed") + out.calls(calls):
                yield e
            self.response = self._final(out, ev, cut)
            if self.keep:
                self.api.store.put(self.response["id"], Stored(self.response, (*self.conversation, out.message())))
            yield {"type": "response.incomplete" if cut else "response.completed", "response": self.response}
        finally:
            await stream.events.aclose()  # cancels the request if the stream stopped early

    def _final(self, out: Output, ev, cut: bool) -> dict:
        u = ev.usage
        reasoning = "".join(p["text"] for it in out.items if it["type"] == "reasoning" for p in it["content"])
        # the reasoning's tokens, counted again from its text (the engine counts the reply's tokens as one)
        thought = len(self.api.service.llm.tokenizer.encode(reasoning, add_special=False)) if reasoning else 0
        return {**self.head, "status": "incomplete" if cut else "completed", "completed_at": int(time.time()),
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": out.items,
                "usage": {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                          "total_tokens": u.prompt_tokens + u.completion_tokens,
                          "input_tokens_details": {"cached_tokens": u.cached_tokens},
                          "output_tokens_details": {"reasoning_tokens": min(thought, u.completion_tokens)}}}


def _sse(events: AsyncIterator[dict]) -> StreamingResponse:
    """Server-sent events as OpenAI's Responses API sends them: an event line and the event as JSON,
    numbered; an error after the headers is an error event (then the stream ends)."""
    async def body() -> AsyncIterator[bytes]:
        n = 0

        def sse(event: dict) -> bytes:
            nonlocal n
            event = {**event, "sequence_number": n}
            n += 1
            return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"

        try:
            async for e in events:
                yield sse(e)
        except ClientGone:
            return  # the request is cancelled; nobody is listening
        except APIError as e:
            yield sse({"type": "error", "code": e.code, "message": e.message, "param": e.param})
        finally:
            await events.aclose()  # however the body ends, the request is cancelled and its blocks freed

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def renamed(e: APIError) -> APIError:
    """The error with its param as a Responses request names it (the chat route's names otherwise)."""
    param = e.param
    if param in PARAMS:
        param = PARAMS[param]
    elif param is not None and param.startswith("messages"):
        param = "input"
    if param != e.param:
        e.message = e.message.replace(f"'{e.param}'", f"'{param}'")
        e.param = param
    return e


def not_found(rid: str) -> APIError:
    return APIError(404, f"Response with id '{rid[:100]}' not found.", None, "not_found")


async def stored(apis: list[ResponsesAPI], request: Request) -> Response:
    """GET or DELETE /v1/responses/{id} of a several-models server: from the loaded model that
    produced it (an unloaded model's responses are gone with it)."""
    rid = request.path_params["response_id"]
    for api in apis:
        if rid in api.store.entries:
            return await (api.delete if request.method == "DELETE" else api.retrieve)(request)
    return not_found(rid).response()
