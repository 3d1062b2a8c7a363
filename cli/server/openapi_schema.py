"""The small pieces every part of the OpenAPI document is built from (openapi.py and the modules of
each API it merges: openapi_anthropic.py, openapi_llama.py, openapi_responses.py), here so those
modules need not import openapi.py, which imports them.  Constants are read-only; openapi.document()
turns the whole into plain dicts."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["BOOLEAN", "INTEGER", "NULL", "STRING", "json_content", "nullable", "number", "obj", "operation", "ref"]

NULL = MappingProxyType({"type": "null"})
STRING = MappingProxyType({"type": "string"})
BOOLEAN = MappingProxyType({"type": "boolean"})
INTEGER = MappingProxyType({"type": "integer"})


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Mapping, **extra) -> dict:
    """schema or null: OpenAI's clients send null for "not set", which the server reads as absent."""
    return {"anyOf": [schema, NULL], **extra}


def number(minimum: float | None = None, maximum: float | None = None, above: float | None = None,
           kind: str = "number", description: str | None = None) -> dict:
    s: dict[str, Any] = {"type": kind}
    for key, v in (("minimum", minimum), ("maximum", maximum), ("exclusiveMinimum", above), ("description", description)):
        if v is not None:
            s[key] = v
    return s


def obj(properties: dict, required: tuple[str, ...] = (), description: str | None = None, **extra) -> dict:
    """An object schema; other properties are allowed (the server ignores fields it does not read)."""
    s: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        s["required"] = list(required)
    if description:
        s["description"] = description
    return {**s, **extra}


def json_content(schema: Any) -> dict:
    """A JSON body's content, by media type."""
    return {"application/json": {"schema": schema}}


def operation(op_id: str, summary: str, ok: dict | None, request: str | None = None, errors: tuple[int, ...] = (), *,
              why: Mapping[int, str], error: str, secured: bool = True, ok_why: str = "OK",
              parameters: list | None = None) -> dict:
    """One operation: its JSON request body (a component's name), its 200 answer (content by media
    type), its error answers (why each status comes; the schema named error: the API's shape) and,
    when secured, the 401 of --api-key."""
    out: dict[str, Any] = {"operationId": op_id, "summary": summary,
                           "responses": {"200": {"description": ok_why, **({"content": ok} if ok else {})}}}
    if request:
        out["requestBody"] = {"required": True, "content": json_content(ref(request))}
    if parameters:
        out["parameters"] = parameters
    for status in (*errors, *((401,) if secured else ())):
        out["responses"][str(status)] = {"description": why[status], "content": json_content(ref(error))}
    if not secured:
        out["security"] = []
    return out
