"""The OpenAPI paths and schemas of OpenAI's Responses API (responses_api.py, responses_input.py),
merged into openapi.document().  As the rest of the document: the request schema says what the
validators accept where JSON Schema can say it; what depends on the model (its template, whether a
grammar compiles) is a 400, in the descriptions."""
from __future__ import annotations

from infer.engine.tool_calls import TOOL_NAME

from .openai_request import SAMPLING_FIELDS
from .responses_input import EFFORT_LEVELS, INPUT_ROLES, MAX_METADATA

NULL = {"type": "null"}
STRING = {"type": "string"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


def _obj(properties: dict, required: tuple[str, ...] = (), description: str | None = None) -> dict:
    s: dict = {"type": "object", "properties": properties}
    if required:
        s["required"] = list(required)
    if description:
        s["description"] = description
    return s


def schemas() -> dict:
    text_part = _obj({"type": {"enum": ["input_text", "output_text", "text"]}, "text": STRING}, ("type", "text"))
    refusal = _obj({"type": {"const": "refusal"}, "refusal": STRING}, ("type", "refusal"))
    content = {"anyOf": [STRING, {"type": "array", "items": {"anyOf": [text_part, refusal]}}],
               "description": "Text, or text parts (joined with newlines): this server reads text only."}
    item = {"anyOf": [
        _obj({"type": {"const": "message"}, "role": {"enum": list(INPUT_ROLES)}, "content": content}, ("role", "content"),
             "A message; type may be left out. developer is read as system."),
        _obj({"type": {"const": "function_call"}, "call_id": STRING, "name": STRING, "arguments": STRING},
             ("type", "call_id", "name", "arguments"), "An earlier call, joined to the assistant turn before it."),
        _obj({"type": {"const": "function_call_output"}, "call_id": STRING,
              "output": {"anyOf": [STRING, {"type": "array", "items": text_part}]}}, ("type", "call_id", "output")),
        _obj({"type": {"const": "reasoning"}, "content": _nullable({"type": "array", "items": _obj(
            {"type": {"const": "reasoning_text"}, "text": STRING}, ("text",))})}, ("type",),
            "An earlier turn's thinking (for templates that show it again); without content it is skipped.")]}
    fmt = {"anyOf": [_obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
                     _obj({"type": {"const": "json_schema"}, "name": STRING, "schema": _ref("JsonSchema"),
                           "strict": _nullable({"type": "boolean"})}, ("type", "schema"))]}
    tool = _obj({"type": {"const": "function"}, "name": {"type": "string", "pattern": TOOL_NAME},
                 "description": _nullable(STRING),
                 "parameters": _nullable({"type": "object", "description": "A JSON Schema of the arguments."}),
                 "strict": _nullable({"type": "boolean"})}, ("type", "name"),
                "Function tools only; two may not have the same name.")
    sampling = {f.name: {"anyOf": [{"type": f.type}, NULL]} for f in SAMPLING_FIELDS}
    request = _obj({
        "model": _nullable(STRING),
        "input": {"anyOf": [STRING, {"type": "array", "items": item}],
                  "description": "A user message, or input items; may be empty with previous_response_id."},
        "instructions": _nullable({"type": "string", "description": "A system message first; not carried over "
                                                                    "by previous_response_id."}),
        "previous_response_id": _nullable({"type": "string", "description": "A response this server stored (the "
                                                                            "last 512 per model): its conversation "
                                                                            "comes first. Unknown: a 400."}),
        "max_output_tokens": _nullable({"type": "integer", "minimum": 1}),
        **sampling,
        "seed": _nullable({"type": "integer", "minimum": 0, "maximum": 2**64 - 1}),
        "stream": _nullable({"type": "boolean", "default": False}),
        "store": _nullable({"type": "boolean", "default": True}),
        "tools": _nullable({"type": "array", "items": tool}),
        "tool_choice": _nullable({"anyOf": [{"enum": ["auto", "none", "required"]},
                                            _obj({"type": {"const": "function"}, "name": STRING}, ("type", "name"))]}),
        "parallel_tool_calls": _nullable({"type": "boolean", "default": True}),
        "reasoning": _nullable(_obj({"effort": _nullable({"enum": list(EFFORT_LEVELS)}),
                                     "summary": {"description": "Ignored."}},
                                    description="none turns thinking off; minimal is low, xhigh high.")),
        "text": _nullable(_obj({"format": _nullable(fmt)})),
        "metadata": _nullable({"type": "object", "maxProperties": MAX_METADATA,
                               "additionalProperties": {"type": "string", "maxLength": 512},
                               "propertyNames": {"maxLength": 64}}),
        "grammar": _nullable({"type": "string", "description": "A GBNF grammar (llama.cpp's syntax)."}),
        "background": {"enum": [False, None]}, "conversation": {"type": "null"}, "prompt": {"type": "null"},
    }, ("input",), "The chat template must accept the conversation; at most one of text.format (other than text) "
                   "and grammar.")
    output_item = _obj({"id": STRING, "type": {"enum": ["message", "reasoning", "function_call"]},
                        "status": {"enum": ["in_progress", "completed", "incomplete"]}}, ("id", "type"))
    count = {"type": "integer", "minimum": 0}
    response = _obj({
        "id": STRING, "object": {"const": "response"}, "created_at": {"type": "integer"}, "model": STRING,
        "status": {"enum": ["completed", "incomplete", "in_progress"]}, "output": {"type": "array", "items": output_item},
        "incomplete_details": _nullable(_obj({"reason": STRING})),
        "usage": _nullable(_obj({"input_tokens": count, "output_tokens": count, "total_tokens": count})),
    }, ("id", "object", "created_at", "model", "status", "output"))
    return {"ResponseRequest": request, "Response": response,
            "ResponseDeleted": _obj({"id": STRING, "object": {"const": "response"}, "deleted": {"const": True}},
                                    ("id", "object", "deleted"))}


def paths(operation, json_content, sse) -> dict:
    """The routes, built with openapi.py's operation() (its error answers, the API key)."""
    rid = [{"name": "response_id", "in": "path", "required": True, "schema": STRING}]

    def stored(op_id: str, summary: str, ok: dict) -> dict:
        op = operation(op_id, summary, ok, errors=(404,))
        op["responses"]["404"]["description"] = "No response this server stored (and still has) has that id."
        return {**op, "parameters": rid}

    return {
        "/v1/responses": {"post": operation(
            "createResponse", "A response (OpenAI's Responses API)", {**json_content(_ref("Response")), **sse},
            "ResponseRequest", (400, 404, 413, 503),
            ok_why="The response, or with stream: true its events as server-sent events")},
        "/v1/responses/{response_id}": {
            "get": stored("getResponse", "A response this server stored", json_content(_ref("Response"))),
            "delete": stored("deleteResponse", "Forget a stored response", json_content(_ref("ResponseDeleted")))},
    }
