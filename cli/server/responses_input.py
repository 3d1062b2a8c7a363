"""A Responses API request (OpenAI's POST /v1/responses) read as the chat request it amounts to:
its input items turned into chat messages, its tools, tool_choice, text.format, reasoning and
max_output_tokens into the chat route's fields, which openai_request.py and openai_chat.py then
check and plan exactly as they do for /v1/chat/completions (llama.cpp converts the same way:
tools/server/server-chat.cpp, server_chat_convert_responses_to_chatcmpl).

What differs from llama.cpp: previous_response_id continues a conversation the server remembers
(responses_api.py's store) rather than being refused; tools other than functions are refused
with a 400 rather than skipped; a reasoning item without text (an encrypted one) is skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .openai_request import SAMPLING_FIELDS, APIError, kind, text_field

INPUT_ROLES = ("user", "system", "developer", "assistant")
# infer's and llama.cpp's fields beside OpenAI's that a Responses request may send, read as the chat
# route reads them (llama.cpp passes every unknown field on to its chat route)
EXTRA_FIELDS = ("seed", "stop", "ignore_eos", "grammar", "chat_template_kwargs",
                *(f.name for f in SAMPLING_FIELDS if f.name not in ("temperature", "top_p")))
# OpenAI's fields this server cannot honour: a 400 rather than a silently different answer
UNSUPPORTED = {"background": "background responses", "conversation": "conversations",
               "prompt": "prompt templates"}
EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh")
MAX_METADATA = 16  # OpenAI's bound: 16 keys, each up to 64 characters, each value up to 512


@dataclass(frozen=True)
class ChatRequest:
    """A Responses request as the chat route's fields (for openai_request.parse_job and
    openai_chat.plan_fields), its conversation without the instructions (what a later
    previous_response_id continues), and whether thinking is off (reasoning.effort "none")."""

    fields: dict  # the chat body: messages, tools, tool_choice, max_tokens, response_format, ...
    conversation: list[dict]  # the earlier turns and this input, as chat messages
    no_thinking: bool


def chat_request(body: dict, earlier: list[dict]) -> ChatRequest:
    """The chat request a Responses body amounts to, after the conversation `earlier` (the turns
    of its previous_response_id); APIError on a field this server cannot read."""
    for name, what in UNSUPPORTED.items():
        if body.get(name):
            raise APIError(400, f"'{name}' is not supported: this server has no {what}", name, "unsupported_parameter")
    if "input" not in body:
        raise APIError(400, "'input' is required: a string or an array of input items", "input", "missing_required_parameter")
    conversation = [*earlier, *input_messages(body["input"])]
    messages = list(conversation)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise APIError(400, f"'instructions' must be a string, got {kind(instructions)}", "instructions", "invalid_type")
        messages.insert(0, {"role": "system", "content": text_field(instructions, "instructions")})
    if not messages:
        raise APIError(400, "'input' is empty and there is no earlier conversation to continue", "input", "invalid_value")
    fields: dict[str, Any] = {"messages": messages}
    for name in ("temperature", "top_p", "stream", "parallel_tool_calls", *EXTRA_FIELDS):
        if body.get(name) is not None:
            fields[name] = body[name]
    if body.get("max_output_tokens") is not None:
        fields["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        fields["tools"] = chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        fields["tool_choice"] = chat_tool_choice(body["tool_choice"])
    fmt = response_format(body.get("text"))
    if fmt is not None:
        fields["response_format"] = fmt
    effort = reasoning_effort(body.get("reasoning"))
    if effort not in (None, "none"):
        fields["reasoning_effort"] = effort
    metadata(body.get("metadata"))
    return ChatRequest(fields, conversation, effort == "none")


def input_messages(value: Any) -> list[dict]:
    """The input as chat messages: a string is one user message; items are messages (input and
    output), function calls (joined to the assistant turn before them, as llama.cpp does), their
    outputs (tool messages) and reasoning (the assistant turn's reasoning_content)."""
    if isinstance(value, str):
        return [{"role": "user", "content": text_field(value, "input")}]
    if not isinstance(value, list):
        raise APIError(400, f"'input' must be a string or an array of input items, got {kind(value)}", "input",
                       "invalid_type")
    out: list[dict] = []
    for i, item in enumerate(value):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"'{p}' must be an object, got {kind(item)}", p, "invalid_type")
        t = item.get("type", "message")
        last = out[-1] if out and out[-1]["role"] == "assistant" else None
        if t == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise APIError(400, f"'{p}.role' must be one of {', '.join(INPUT_ROLES)}, got {role!r}"[:300],
                               f"{p}.role", "invalid_value")
            content = _content(item.get("content"), f"{p}.content", role)
            if role == "assistant" and last is not None and not last.get("tool_calls"):
                last["content"] += content  # after this turn's reasoning item
            else:
                out.append({"role": role, "content": content})
        elif t == "function_call":
            call = {"id": _string(item, "call_id", p), "type": "function",
                    "function": {"name": _string(item, "name", p), "arguments": _string(item, "arguments", p)}}
            if last is None:
                last = {"role": "assistant", "content": ""}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif t == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", p),
                        "content": _content(item.get("output"), f"{p}.output", "tool")})
        elif t == "reasoning":
            text = _reasoning_text(item, p)
            if not text:
                continue  # a summary or encrypted content only: nothing a local model can read again
            if last is not None and not last.get("content") and not last.get("tool_calls"):
                last["reasoning_content"] = last.get("reasoning_content", "") + text
            else:
                out.append({"role": "assistant", "content": "", "reasoning_content": text})
        else:
            raise APIError(400, f"'{p}.type' {t!r} is not supported: input items are messages, function_call, "
                           "function_call_output and reasoning"[:300], f"{p}.type", "invalid_value")
    return out


def _string(item: dict, name: str, p: str) -> str:
    v = item.get(name)
    if not isinstance(v, str):
        raise APIError(400, f"'{p}.{name}' must be a string, got {kind(v)}", f"{p}.{name}", "invalid_type")
    return text_field(v, f"{p}.{name}")


def _content(content: Any, p: str, role: str) -> str:
    """A message's content (or a call's output): text, or text parts joined with newlines (as the
    chat route joins them); this server reads text only."""
    if isinstance(content, str):
        return text_field(content, p)
    if not isinstance(content, list):
        raise APIError(400, f"'{p}' must be a string or an array of content parts, got {kind(content)}", p,
                       "invalid_type")
    texts = []
    for j, part in enumerate(content):
        t = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if t == "refusal" else "text") if isinstance(part, dict) else None
        if t not in ("input_text", "output_text", "refusal", "text") or not isinstance(text, str):
            raise APIError(400, f"'{p}[{j}]' must be a text part ({{\"type\": \"input_text\", \"text\": ...}}"
                           f"{', output_text or refusal' if role == 'assistant' else ''}): this server reads text only",
                           f"{p}[{j}]", "invalid_value")
        texts.append(text_field(text, f"{p}[{j}]"))
    return "\n".join(texts)


def _reasoning_text(item: dict, p: str) -> str:
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str) for c in content):
        raise APIError(400, f"'{p}.content' must be an array of {{\"type\": \"reasoning_text\", \"text\": ...}}",
                       f"{p}.content", "invalid_value")
    return text_field("".join(c["text"] for c in content), f"{p}.content")


def chat_tools(tools: Any) -> list[dict]:
    """Function tools in the Responses shape ({type, name, description, parameters, strict}) in the
    chat route's ({type, function: {...}}); openai_chat.plan checks the rest.  OpenAI's built-in tools
    (web_search, custom, local_shell, ...) are left out, as llama-server leaves them: the server runs
    none of them, and an agent (Codex CLI) sends them beside its function tools."""
    if not isinstance(tools, list):
        raise APIError(400, f"'tools' must be an array, got {kind(tools)}", "tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise APIError(400, f"'tools[{i}]' must be an object with a string 'type', got {kind(t)}",
                           f"tools[{i}]", "invalid_value")
        if t["type"] != "function":
            continue
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if t.get(k) is not None}})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """tool_choice in the chat route's shape: a mode, or the function it names."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise APIError(400, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                   "\"name\": ...}", "tool_choice", "invalid_value")


def response_format(text: Any) -> dict | None:
    """text.format as the chat route's response_format (text, json_object, json_schema)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise APIError(400, "'text' must be an object {\"format\": {\"type\": ...}}", "text", "invalid_type")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if "schema" not in fmt:
            raise APIError(400, "'text.format' of type json_schema needs a 'schema'", "text.format",
                           "missing_required_parameter")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]}}
    raise APIError(400, "'text.format.type' must be text, json_object or json_schema", "text.format", "invalid_value")


def reasoning_effort(reasoning: Any) -> str | None:
    """reasoning.effort as the chat route's reasoning_effort (low, medium, high: gpt-oss's levels):
    minimal is low, xhigh high; none turns thinking off."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise APIError(400, f"'reasoning' must be an object, got {kind(reasoning)}", "reasoning", "invalid_type")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    if effort not in EFFORT_LEVELS:
        raise APIError(400, f"'reasoning.effort' must be one of {', '.join(EFFORT_LEVELS)}, got {effort!r}"[:300],
                       "reasoning.effort", "invalid_value")
    return {"minimal": "low", "xhigh": "high"}.get(effort, effort)


def metadata(value: Any) -> dict | None:
    """metadata, echoed back: at most 16 string keys and values (OpenAI's rule)."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()):
        raise APIError(400, "'metadata' must be an object of at most 16 string values (keys up to 64 characters, "
                       "values up to 512)", "metadata", "invalid_value")
    return value
