"""Anthropic's Messages request (POST /v1/messages, /v1/messages/count_tokens) checked and turned
into what the OpenAI chat route hands the service: OpenAI-style messages (checked again by
openai_request.chat_messages), the plan fields openai_chat.plan reads (tools, tool_choice,
parallel_tool_calls), ollama's `think` for Anthropic's `thinking`, and a Job.  So tool calls go
through engine/tool_calls.py and thinking through engine/reasoning.py exactly as a chat
completion's do.

Where llama-server (server-chat.cpp, server_chat_convert_anthropic_to_oai) is more permissive than
Anthropic's published API, this follows Anthropic: `model` and `max_tokens` are required, roles are
user and assistant, and an image is a 400 (this server reads text only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .openai_request import MAX_STOP, APIError, Job, chat_messages, int_field, kind, parse_job

ROLES = ("user", "assistant")
THINKING = ("enabled", "disabled", "adaptive")  # adaptive: the newest Claude models' "think when useful"
TOOL_CHOICES = ("auto", "any", "tool", "none")
# block types that carry media this server cannot read: a clear 400, not silently dropped
MEDIA = ("image", "document", "search_result", "container_upload")
BILLING = "x-anthropic-billing-header:"


@dataclass(frozen=True)
class MessagesRequest:
    """A checked Messages request, in the service's OpenAI terms."""

    model: str | None
    messages: list[dict]  # OpenAI chat messages, checked by chat_messages
    fields: dict  # openai_chat.plan's fields: tools, tool_choice, parallel_tool_calls
    think: bool | None  # ChatPrompt.think: False turns thinking off; None leaves the model's default


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message[:300], param, "invalid_request_error")


def _text(block: dict, p: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"'{p}.text' must be a string, got {kind(text)}", f"{p}.text")
    return text


def _text_or_blocks(value: Any, p: str) -> str:
    """A string, or text blocks joined by newlines (a system prompt's, a tool result's content)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _bad(f"'{p}' must be a string or an array of text blocks, got {kind(value)}", p)
    parts = []
    for i, block in enumerate(value):
        q = f"{p}[{i}]"
        t = block.get("type") if isinstance(block, dict) else None
        if t in MEDIA:
            raise _media(t, q)
        if t != "text":
            raise _bad(f"'{q}' must be a text block {{\"type\": \"text\", \"text\": ...}}", q)
        parts.append(_text(block, q))
    return "\n".join(parts)


def _media(t: str, p: str) -> APIError:
    return _bad(f"'{p}' is an {t} block: {t} input is not supported (this server reads text only)", p)


def system_text(system: Any) -> str | None:
    """`system` as one text: a string or an array of text blocks (joined by newlines).  Claude
    Code's billing header carries a stamp (cch=) that changes on every request, which would keep
    the prefix cache from reaching past the system prompt: it is blanked, as llama-server does."""
    return None if system is None else _blank_stamp(_text_or_blocks(system, "system"))


def _blank_stamp(text: str) -> str:
    if not text.startswith(BILLING):
        return text
    at = text.find("cch=", len(BILLING))
    if at < 0 or text[at + 9:at + 10] != ";":  # the stamp is five characters then ';'
        return text
    return text[:at + 4] + "fffff" + text[at + 9:]


def _tool_result(block: dict, p: str) -> dict:
    """A tool_result block as an OpenAI tool message; is_error marks the content for the model
    (templates have no field for it)."""
    use_id = block.get("tool_use_id")
    if not isinstance(use_id, str):
        raise _bad(f"'{p}.tool_use_id' must be a string, got {kind(use_id)}", f"{p}.tool_use_id")
    content = block.get("content")
    text = "" if content is None else _text_or_blocks(content, f"{p}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"'{p}.is_error' must be true or false, got {kind(is_error)}", f"{p}.is_error")
    return {"role": "tool", "tool_call_id": use_id, "content": f"Error: {text}" if is_error else text}


def _tool_use(block: dict, p: str) -> dict:
    """An earlier tool_use block as an OpenAI tool call (its input as JSON text)."""
    use_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(use_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise _bad(f"'{p}' must be {{\"type\": \"tool_use\", \"id\": string, \"name\": string, \"input\": object}}", p)
    return {"id": use_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _turn(m: Any, i: int) -> list[dict]:
    """One Anthropic message as OpenAI messages: a user turn's tool results become tool messages
    (first: they answer the assistant's calls just before), its text a user message; an assistant
    turn's text, thinking and tool_use blocks one assistant message."""
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(f"'{p}' must be an object with 'role' and 'content', got {kind(m)}", p)
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"'{p}.role' must be user or assistant (the system prompt is the top-level 'system'), "
                   f"got {role!r}", f"{p}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad(f"'{p}.content' must be a string or an array of content blocks, got {kind(content)}", f"{p}.content")
    texts, thinking, calls, results = [], [], [], []
    for j, block in enumerate(content):
        q = f"{p}.content[{j}]"
        t = block.get("type") if isinstance(block, dict) else None
        if t == "text":
            texts.append(_text(block, q))
        elif t in MEDIA:
            raise _media(t, q)
        elif t == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, q))
        elif t == "tool_result" and role == "user":
            results.append(_tool_result(block, q))
        elif t == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"'{q}.thinking' must be a string", f"{q}.thinking")
            thinking.append(block["thinking"])
        elif t == "redacted_thinking" and role == "assistant":
            continue  # encrypted thinking of Anthropic's models: nothing a local model can read
        else:
            allowed = "text, tool_use, thinking" if role == "assistant" else "text, tool_result"
            raise _bad(f"'{q}' must be a content block of a type a {role} turn has ({allowed}), got "
                       f"{t if t is not None else kind(block)!r}", q)
    out = list(results)
    if role == "user" and (texts or not results):
        out.append({"role": "user", "content": "\n".join(texts)})
    elif role == "assistant":
        msg: dict = {"role": "assistant", "content": "\n".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = "\n".join(thinking)
        out.append(msg)
    return out


def _tools(tools: Any) -> list[dict]:
    """Anthropic's client tools as OpenAI's; the server tools Anthropic runs itself (web search,
    code execution, ...) are a 400."""
    if not isinstance(tools, list):
        raise _bad(f"'tools' must be an array, got {kind(tools)}", "tools")
    out = []
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad(f"'{p}' must be an object with 'name' and 'input_schema', got {kind(t)}", p)
        if t.get("type") not in (None, "custom"):
            raise _bad(f"'{p}' is a {t['type']!r} tool: only custom tools (name, description, input_schema) are "
                       "supported"[:300], f"{p}.type")
        schema, desc = t.get("input_schema"), t.get("description", "")
        if not isinstance(schema, dict):
            raise _bad(f"'{p}.input_schema' must be a JSON Schema object, got {kind(schema)}", f"{p}.input_schema")
        if not isinstance(desc, str):
            raise _bad(f"'{p}.description' must be a string, got {kind(desc)}", f"{p}.description")
        out.append({"type": "function", "function": {"name": t.get("name"), "description": desc, "parameters": schema}})
    return out  # names: openai_chat.plan's rule (tool_calls.parse_tools), checked there


def _tool_choice(choice: Any) -> dict:
    """Anthropic's tool_choice as OpenAI's tool_choice and parallel_tool_calls."""
    if choice is None:
        return {}
    if not isinstance(choice, dict) or choice.get("type") not in TOOL_CHOICES:
        raise _bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}, with 'name' for "
                   "\"tool\"", "tool_choice")
    t = choice["type"]
    out: dict[str, Any] = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(t)}
    if t == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise _bad(f"'tool_choice.name' must be a string, got {kind(name)}", "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    serial = choice.get("disable_parallel_tool_use")
    if serial is not None:
        if not isinstance(serial, bool):
            raise _bad(f"'tool_choice.disable_parallel_tool_use' must be true or false, got {kind(serial)}",
                       "tool_choice.disable_parallel_tool_use")
        out["parallel_tool_calls"] = not serial
    return out


def _think(thinking: Any) -> bool | None:
    """`thinking` as ChatPrompt.think: disabled turns a thinking model's thought off (a template's
    enable_thinking); enabled and adaptive keep it on, budget_tokens unenforced (the thought ends
    where the model ends it, within max_tokens)."""
    if thinking is None:
        return None
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING:
        raise _bad("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
                   "thinking")
    if thinking["type"] == "enabled":
        budget = int_field(thinking, "budget_tokens")
        if budget is None or budget < 1:
            raise _bad("'thinking.budget_tokens' must be a positive integer", "thinking.budget_tokens")
    return thinking["type"] != "disabled"


def conversation(body: dict) -> MessagesRequest:
    """The fields /v1/messages and /v1/messages/count_tokens share: model, system, messages, tools,
    tool_choice and thinking."""
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("'model' is required: a string" if model is None else f"'model' must be a string, got {kind(model)}",
                   "model")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty array of {role, content} objects", "messages")
    system = system_text(body.get("system"))
    msgs = ([{"role": "system", "content": system}] if system else []) + [x for i, m in enumerate(raw) for x in _turn(m, i)]
    fields: dict[str, Any] = {}
    if body.get("tools") is not None:
        fields["tools"] = _tools(body["tools"])
    fields.update(_tool_choice(body.get("tool_choice")))
    if fields.get("tool_choice") is not None and not fields.get("tools") and fields["tool_choice"] != "none":
        raise _bad("'tool_choice' needs 'tools'", "tool_choice")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _bad(f"'metadata' must be an object, got {kind(metadata)}", "metadata")
    think = _think(body.get("thinking"))
    return MessagesRequest(model, chat_messages({"messages": msgs}), fields, think)


def job(body: dict) -> Job:
    """The generation fields: max_tokens (required, as Anthropic's API has it), temperature, top_p,
    top_k, stop_sequences, stream; SamplingParams checks their values."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _bad("'max_tokens' is required: the most tokens the reply may have", "max_tokens")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)):
        raise _bad("'stop_sequences' must be an array of non-empty strings", "stop_sequences")
    if stops and len(stops) > MAX_STOP:
        raise _bad(f"'stop_sequences' takes at most {MAX_STOP} strings, got {len(stops)}", "stop_sequences")
    fields = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stream") if k in body}
    return parse_job({**fields, "stop": stops}, None)
