"""The OpenAPI paths and schemas of Anthropic's Messages routes (anthropic_api.py), merged into
openapi.document().  The request schemas say what anthropic_request.py accepts; errors take
Anthropic's envelope."""
from __future__ import annotations

from infer.engine.sampler import SamplingParams
from infer.engine.tool_calls import TOOL_NAME

from .anthropic_api import ERROR_TYPES
from .anthropic_request import MAX_STOP
from .openai_request import SAMPLING_FIELDS
from .openapi_schema import BOOLEAN, STRING, json_content, nullable, number, obj, operation, ref

WHY = {400: "A request the server refuses: bad JSON, a wrong field, a prompt over the context, an image.",
       401: "--api-key is set and the request's key (X-Api-Key or Bearer) is missing or wrong.",
       404: "The model named is not served here.", 413: "The body is larger than --max-body.",
       503: "The queue is full (--max-queue): retry after Retry-After seconds."}


SSE = {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string", "description": "message_start, content_block_start, content_block_delta, "
                                               "content_block_stop, message_delta, message_stop; or error."},
    "data": {"type": "string", "description": "The event as JSON, its type the event's name."}}}}}


def _const(name: str) -> dict:
    return {"const": name}


def _requests() -> dict:
    text = obj({"type": _const("text"), "text": STRING}, ("type", "text"))
    result = obj({"type": _const("tool_result"), "tool_use_id": STRING,
                  "content": nullable({"anyOf": [STRING, {"type": "array", "items": ref("AnthropicTextBlock")}]}),
                  "is_error": nullable(BOOLEAN)}, ("type", "tool_use_id"),
                 "is_error: the content goes to the model marked as an error.")
    use = obj({"type": _const("tool_use"), "id": STRING, "name": STRING, "input": {"type": "object"}},
              ("type", "id", "name", "input"))
    thinking = obj({"type": _const("thinking"), "thinking": STRING, "signature": nullable(STRING)}, ("type", "thinking"),
                   "Given back to the template as the turn's reasoning_content.")
    redacted = obj({"type": _const("redacted_thinking")}, ("type",), "Ignored.")

    def message(role: str, blocks: list) -> dict:
        return obj({"role": _const(role), "content": {"anyOf": [STRING, {"type": "array", "items": {"anyOf": blocks}}]}},
                   ("role", "content"))

    tool = obj({"type": nullable({"const": "custom"}), "name": {"type": "string", "pattern": TOOL_NAME},
                "description": STRING, "input_schema": {"type": "object", "description": "A JSON Schema of the input."}},
               ("name", "input_schema"), "Two tools may not have the same name; server tools are not supported.")
    serial = {"disable_parallel_tool_use": nullable(BOOLEAN)}
    choice = {"anyOf": [obj({"type": {"enum": ["auto", "any", "none"]}, **serial}, ("type",)),
                        obj({"type": _const("tool"), "name": STRING, **serial}, ("type", "name"))],
              "description": "auto, any and tool need tools; tool must name one of them."}
    thinking_field = {"anyOf": [obj({"type": _const("enabled"), "budget_tokens": number(1, kind="integer")},
                                    ("type", "budget_tokens")),
                                obj({"type": {"enum": ["disabled", "adaptive"]}}, ("type",))],
                      "description": "Whether a thinking model thinks (its template's switch); the budget is not "
                                     "enforced. A reply's thought comes back as a thinking block."}
    conversation = {
        "model": {"type": "string", "description": "A name the server has for its model (GET /v1/models)."},
        "system": nullable({"anyOf": [STRING, {"type": "array", "items": ref("AnthropicTextBlock")}]}),
        "messages": {"type": "array", "minItems": 1, "items": {"anyOf": [
            message("user", [text, result]), message("assistant", [text, use, thinking, redacted])]}},
        "tools": nullable({"type": "array", "items": tool}),
        "tool_choice": nullable(choice),
        "thinking": nullable(thinking_field),
        "metadata": nullable({"type": "object", "description": "Ignored."}),
    }
    sampling = {f.name: nullable(number(f.minimum, f.maximum, f.above, f.type, f.description),
                                 default=SamplingParams.__dataclass_fields__[f.name].default)
                for f in SAMPLING_FIELDS if f.name in ("temperature", "top_p", "top_k")}
    return {
        "AnthropicTextBlock": text,
        "AnthropicMessagesRequest": obj({
            **conversation, **sampling,
            "max_tokens": number(1, kind="integer", description="Past the context, the reply stops at its end "
                                                                 "(llama-server's rule)."),
            "stop_sequences": nullable({"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1}}),
            "stream": nullable(BOOLEAN, default=False),
        }, ("model", "max_tokens", "messages"), "Images and documents are refused (a 400): text only."),
        "AnthropicCountTokensRequest": obj(conversation, ("model", "messages")),
    }


def _responses() -> dict:
    count = number(0, kind="integer")
    block = {"anyOf": [
        obj({"type": _const("thinking"), "thinking": STRING, "signature": STRING}, ("type", "thinking", "signature")),
        obj({"type": _const("text"), "text": STRING}, ("type", "text")),
        obj({"type": _const("tool_use"), "id": STRING, "name": STRING, "input": {"type": "object"}},
            ("type", "id", "name", "input"))]}
    usage = obj({k: count for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                    "cache_creation_input_tokens")}, ("input_tokens", "output_tokens"))
    return {
        "AnthropicMessage": obj({
            "id": STRING, "type": _const("message"), "role": _const("assistant"), "model": STRING,
            "content": {"type": "array", "items": block},
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
            "stop_sequence": {"type": ["string", "null"]}, "usage": usage},
            ("id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage")),
        "AnthropicTokenCount": obj({"input_tokens": count}, ("input_tokens",)),
        "AnthropicError": obj({"type": _const("error"), "error": obj({
            "type": {"enum": sorted({*ERROR_TYPES.values(), "invalid_request_error", "api_error"})},
            "message": STRING}, ("type", "message"))}, ("type", "error"), "Anthropic's error envelope."),
    }


def schemas() -> dict:
    return {**_requests(), **_responses()}


def _operation(op_id: str, summary: str, ok: dict, request: str, errors: tuple[int, ...], ok_why: str = "OK") -> dict:
    """One operation, its errors in Anthropic's envelope."""
    return operation(op_id, summary, ok, request, errors, why=WHY, error="AnthropicError", ok_why=ok_why)


def paths() -> dict:
    return {
        "/v1/messages": {"post": _operation(
            "createMessage", "A chat reply (Anthropic's Messages API)", {**json_content(ref("AnthropicMessage")), **SSE},
            "AnthropicMessagesRequest", (400, 404, 413, 503),
            ok_why="The message, or with stream: true its events as server-sent events")},
        "/v1/messages/count_tokens": {"post": _operation(
            "countMessageTokens", "The tokens of a Messages request's prompt (tools included)",
            json_content(ref("AnthropicTokenCount")), "AnthropicCountTokensRequest", (400, 404, 413))},
    }
