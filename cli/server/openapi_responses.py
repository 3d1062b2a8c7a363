"""The OpenAPI paths and schemas of OpenAI's Responses API (responses_api.py, responses_input.py),
merged into openapi.document().  As the rest of the document: the request schema says what the
validators accept where JSON Schema can say it; what depends on the model (its template, whether a
grammar compiles) is a 400, in the descriptions."""
from __future__ import annotations

from infer.engine.tool_calls import TOOL_NAME

from .openai_request import SAMPLING_FIELDS
from .openapi_schema import NULL, STRING, json_content, nullable, obj, ref
from .responses_input import EFFORT_LEVELS, INPUT_ROLES, MAX_METADATA


def schemas() -> dict:
    text_part = obj({"type": {"enum": ["input_text", "output_text", "text"]}, "text": STRING}, ("type", "text"))
    refusal = obj({"type": {"const": "refusal"}, "refusal": STRING}, ("type", "refusal"))
    content = {"anyOf": [STRING, {"type": "array", "items": {"anyOf": [text_part, refusal]}}],
               "description": "Text, or text parts (joined with newlines): this server reads text only."}
    item = {"anyOf": [
        obj({"type": {"const": "message"}, "role": {"enum": list(INPUT_ROLES)}, "content": content}, ("role", "content"),
             "A message; type may be left out. developer is read as system."),
        obj({"type": {"const": "function_call"}, "call_id": STRING, "name": STRING, "arguments": STRING},
             ("type", "call_id", "name", "arguments"), "An earlier call, joined to the assistant turn before it."),
        obj({"type": {"const": "function_call_output"}, "call_id": STRING,
              "output": {"anyOf": [STRING, {"type": "array", "items": text_part}]}}, ("type", "call_id", "output")),
        obj({"type": {"const": "reasoning"}, "content": nullable({"type": "array", "items": obj(
            {"type": {"const": "reasoning_text"}, "text": STRING}, ("text",))})}, ("type",),
            "An earlier turn's thinking (for templates that show it again); without content it is skipped.")]}
    fmt = {"anyOf": [obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
                     obj({"type": {"const": "json_schema"}, "name": STRING, "schema": ref("JsonSchema"),
                           "strict": nullable({"type": "boolean"})}, ("type", "schema"))]}
    tool = obj({"type": {"const": "function"}, "name": {"type": "string", "pattern": TOOL_NAME},
                 "description": nullable(STRING),
                 "parameters": nullable({"type": "object", "description": "A JSON Schema of the arguments."}),
                 "strict": nullable({"type": "boolean"})}, ("type", "name"),
                "Function tools only; two may not have the same name.")
    sampling = {f.name: {"anyOf": [{"type": f.type}, NULL]} for f in SAMPLING_FIELDS}
    request = obj({
        "model": nullable(STRING),
        "input": {"anyOf": [STRING, {"type": "array", "items": item}],
                  "description": "A user message, or input items; may be empty with previous_response_id."},
        "instructions": nullable({"type": "string", "description": "A system message first; not carried over "
                                                                    "by previous_response_id."}),
        "previous_response_id": nullable({"type": "string", "description": "A response this server stored (the "
                                                                            "last 512 per model): its conversation "
                                                                            "comes first. Unknown: a 400."}),
        "max_output_tokens": nullable({"type": "integer", "minimum": 1}),
        **sampling,
        "seed": nullable({"type": "integer", "minimum": 0, "maximum": 2**64 - 1}),
        "stream": nullable({"type": "boolean", "default": False}),
        "store": nullable({"type": "boolean", "default": True}),
        "tools": nullable({"type": "array", "items": tool}),
        "tool_choice": nullable({"anyOf": [{"enum": ["auto", "none", "required"]},
                                            obj({"type": {"const": "function"}, "name": STRING}, ("type", "name"))]}),
        "parallel_tool_calls": nullable({"type": "boolean", "default": True}),
        "reasoning": nullable(obj({"effort": nullable({"enum": list(EFFORT_LEVELS)}),
                                     "summary": {"description": "Ignored."}},
                                    description="none turns thinking off; minimal is low, xhigh high.")),
        "text": nullable(obj({"format": nullable(fmt)})),
        "metadata": nullable({"type": "object", "maxProperties": MAX_METADATA,
                               "additionalProperties": {"type": "string", "maxLength": 512},
                               "propertyNames": {"maxLength": 64}}),
        "grammar": nullable({"type": "string", "description": "A GBNF grammar (llama.cpp's syntax)."}),
        "background": {"enum": [False, None]}, "conversation": {"type": "null"}, "prompt": {"type": "null"},
    }, ("input",), "The chat template must accept the conversation; at most one of text.format (other than text) "
                   "and grammar.")
    output_item = obj({"id": STRING, "type": {"enum": ["message", "reasoning", "function_call"]},
                        "status": {"enum": ["in_progress", "completed", "incomplete"]}}, ("id", "type"))
    count = {"type": "integer", "minimum": 0}
    response = obj({
        "id": STRING, "object": {"const": "response"}, "created_at": {"type": "integer"}, "model": STRING,
        "status": {"enum": ["completed", "incomplete", "in_progress"]}, "output": {"type": "array", "items": output_item},
        "incomplete_details": nullable(obj({"reason": STRING})),
        "usage": nullable(obj({"input_tokens": count, "output_tokens": count, "total_tokens": count})),
    }, ("id", "object", "created_at", "model", "status", "output"))
    return {"ResponseRequest": request, "Response": response,
            "ResponseDeleted": obj({"id": STRING, "object": {"const": "response"}, "deleted": {"const": True}},
                                    ("id", "object", "deleted"))}


def paths(operation, sse) -> dict:
    """The routes, built with openapi.py's operation() (its error answers, the API key)."""
    rid = [{"name": "response_id", "in": "path", "required": True, "schema": STRING}]

    def stored(op_id: str, summary: str, ok: dict) -> dict:
        op = operation(op_id, summary, ok, errors=(404,))
        op["responses"]["404"]["description"] = "No response this server stored (and still has) has that id."
        return {**op, "parameters": rid}

    return {
        "/v1/responses": {"post": operation(
            "createResponse", "A response (OpenAI's Responses API)", {**json_content(ref("Response")), **sse},
            "ResponseRequest", (400, 404, 413, 503),
            ok_why="The response, or with stream: true its events as server-sent events")},
        "/v1/responses/{response_id}": {
            "get": stored("getResponse", "A response this server stored", json_content(ref("Response"))),
            "delete": stored("deleteResponse", "Forget a stored response", json_content(ref("ResponseDeleted")))},
    }
