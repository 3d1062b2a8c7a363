"""Tool calling: OpenAI's tools through a model's own chat template, and its replies parsed back.

Models write tool calls in their family's syntax, which their chat template also renders:
- hermes (Qwen2.5, Qwen3, Hermes): <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
- llama3 (Llama 3.1-3.3, Llama 4): a JSON object {"name": ..., "parameters": {...}} as the whole
  reply, after an optional <|python_tag|>
- mistral (Mistral Nemo, Small): [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]
- mistral_args (Mistral Small 3.2, Ministral 3, Magistral, Devstral): [TOOL_CALLS]NAME[ARGS]{...} per
  call (Small 3.2's template writes [CALL_ID]ID between them in earlier turns)
- deepseek (DeepSeek-R1 distills, V3): <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  \\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
- deepseek_v31 (DeepSeek-V3.1): <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>, the arguments as bare JSON
- qwen3coder (Qwen3-Coder, Qwen3.5, Nemotron Nano 3): <tool_call>\n<function=NAME>\n<parameter=P>\n
  VALUE\n</parameter>\n</function>\n</tool_call>, values as text (xml_tool_calls.py)
- glm45 (GLM-4.5, 4.6, 4.7): <tool_call>NAME\n<arg_key>P</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>
  (GLM-4.7: no newlines), values as text as qwen3coder's (xml_tool_calls.py)
- gemma4 (Gemma 4): <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>, Gemma's own value
  syntax (gemma4_format.py)
- generic, for templates that know no tools (llama.cpp's generic format): the tools are described
  in the system prompt and the whole reply is JSON, {"tool_calls": [{"name", "arguments"}]} or
  {"response": "..."}, held to that schema by a grammar, so it always parses.
The family is read from the template's source (the markers it writes).  With tool_choice
"required" or a named function every family is held to a grammar that forces the call; with
"auto" a native family's model is free until it writes its call marker, and from there the call is
held to the same grammar (a lazy grammar: SamplingParams.grammar_triggers).  The reply needs the
special tokens spelled out (SamplingParams.special): several families' markers are control tokens.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from infer.quant.errors import InferError

from . import gemma4_format, xml_tool_calls
from .grammar import JSON_OPTIONS, MAX_DEPTH, Grammar, as_llama_cpp, too_deep

FAMILIES = ("hermes", "llama3", "mistral", "mistral_args", "deepseek", "qwen3coder", "glm45", "generic",
            "deepseek_v31", "gemma4")
DS_BEGIN, DS_CALL, DS_SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
DS_CALL_END, DS_END = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
# where a call starts in each family's reply ("^text": only as the answer's first text, after
# whitespace): the stream holds text back from there, and tool_choice "auto" starts its grammar there
CALL_STARTS = MappingProxyType({
    "hermes": ("<tool_call>",), "qwen3coder": (xml_tool_calls.OPEN,), "glm45": (xml_tool_calls.OPEN,),
    "mistral": ("[TOOL_CALLS]",), "mistral_args": ("[TOOL_CALLS]",), "deepseek": (DS_BEGIN, DS_CALL),
    "deepseek_v31": (DS_BEGIN, DS_CALL), "gemma4": (gemma4_format.OPEN,),
    "llama3": ("<|python_tag|>", '^{"name"', '^{ "name"'), "generic": ("^{",)})


class ToolError(InferError, ValueError):
    """A malformed tools list or tool_choice (the message names the problem)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


TOOL_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"  # what a tool's name may be (OpenAI's rule)
_NAME = re.compile(TOOL_NAME)


def parse_tools(tools: Any) -> list[Tool]:
    """OpenAI's tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]."""
    if not isinstance(tools, list):
        raise ToolError(f"'tools' must be an array, got {type(tools).__name__}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(f, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}"[:200])
        if name in seen:
            raise ToolError(f"tools[{i}]: two tools are named {name!r}")
        seen.add(name)
        desc = f.get("description", "")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(desc, str) or not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function: 'description' must be a string and 'parameters' an object")
        if too_deep(params):
            raise ToolError(f"tools[{i}].function.parameters nests deeper than {MAX_DEPTH} levels")
        out.append(Tool(name, desc, params))
    return out


def parse_tool_choice(choice: Any, tools: list[Tool]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the function a named choice forces)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise ToolError("'tool_choice' is \"required\" but there are no tools")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise ToolError(f"'tool_choice' names the function {name!r}, which is not among the tools"[:200])
        return "required", name
    raise ToolError("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def family(template_source: str) -> str:
    """The tool-call syntax a chat template writes (generic: none, or one not read here)."""
    if gemma4_format.CALL_PREFIX in template_source:  # llama.cpp's test: '<|tool_call>call:'
        return "gemma4"
    if "<tool_call>" in template_source and "<arg_key>" in template_source:  # GLM's keys and values
        return "glm45"
    if ("<tool_call>" in template_source and "<function=" in template_source and "<parameter=" in template_source
            and "'<tool_call><function=' ~" not in template_source):  # llama.cpp's test: newlines between the tags
        return "qwen3coder"
    if "<tool_call>" in template_source and "<function=" not in template_source:  # not Qwen3-Coder's XML
        return "hermes"
    if "[TOOL_CALLS]" in template_source:  # Small 3.2's and Ministral 3's: the name, then [ARGS] and its JSON
        return "mistral_args" if "[ARGS]" in template_source else "mistral"
    if "tool▁call" in template_source and "```json" in template_source:  # R1's fenced JSON, not V3.1's
        return "deepseek"
    if "tool▁call" in template_source and "tool▁sep" in template_source:  # V3.1's: the name, then bare JSON
        return "deepseek_v31"
    headers = "<|start_header_id|>" in template_source or "<|header_start|>" in template_source  # Llama 3, Llama 4
    if headers and "tools" in template_source and "parameters" in template_source:
        return "llama3"
    return "generic"


# ---------------------------------------------------------------- the prompt


def prepare(messages: list[dict], tools: list[Tool], fam: str, mode: str) -> tuple[list[dict], dict]:
    """Messages and template variables for a conversation with tools: assistant tool calls'
    arguments as objects (what templates index), and for the generic family the tools described in
    the system message and earlier calls and results written as the JSON it uses."""
    msgs = [dict(m) for m in messages]
    for m in msgs:
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
    if fam != "generic":
        return msgs, ({"tools": [t.as_openai() for t in tools]} if tools and mode != "none" else {})
    out = []
    for m in msgs:
        if m["role"] == "tool":
            out.append({"role": "user", "content": json.dumps(
                {"tool_response": {"tool_call_id": m.get("tool_call_id", ""), "content": m["content"]}})})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")})
    if tools and mode != "none":
        text = ("You can call these tools to answer the user's requests:\n"
                + json.dumps([t.as_openai() for t in tools], indent=2)
                + '\n\nReply with JSON only: {"tool_calls": [{"name": "tool_name", "arguments": {...}}]} to call '
                  'tools, or {"response": "your answer"} to answer directly.')
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return _merge_users(out), {}


def _template_call(call: Any) -> dict:
    """An assistant message's tool call with its arguments as an object, as HF templates expect."""
    f = call.get("function", {}) if isinstance(call, dict) else {}
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # a template can still print the text
    return {**call, "function": {**f, "arguments": args}}


def with_text_arguments(messages: list[dict]) -> list[dict]:
    """The messages with their tool calls' arguments as JSON text, for templates that write them
    as strings (DeepSeek-R1's concatenates them) and fail on objects."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                                                        if isinstance(c["function"]["arguments"], str)
                                                        else json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


def _merge_users(msgs: list[dict]) -> list[dict]:
    """Adjacent user messages (tool results turned into user text) joined, for templates that
    require the roles to alternate."""
    out: list[dict] = []
    for m in msgs:
        if out and m["role"] == out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(m)
    return out


# ---------------------------------------------------------------- the grammar


def _call_schema(tools: list[Tool], fam: str) -> tuple[dict, dict]:
    """The schema of one call of any of the tools, and the definitions its references need at the
    root of whatever schema holds it (each tool's $defs renamed apart: t0_Name, t1_Name, ...)."""
    key = "parameters" if fam == "llama3" else "arguments"
    extra = {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}} if fam == "mistral" else {}  # Mistral's call ids
    defs: dict = {}
    alternatives = []
    for i, t in enumerate(tools):
        params, own = _own_defs(t.parameters, f"t{i}_")
        defs.update(own)
        alternatives.append({"type": "object", "properties": {"name": {"const": t.name}, key: params, **extra},
                             "required": ["name", key], "additionalProperties": False})
    return as_llama_cpp({"anyOf": alternatives}), as_llama_cpp(defs)


def _own_defs(schema: dict, prefix: str) -> tuple[dict, dict]:
    """A tool's parameters without their $defs / definitions, their references renamed with prefix,
    and those definitions under the new names (Pydantic writes schemas so)."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    if not isinstance(defs, dict) or not defs:
        return schema, {}

    def rename(x):
        if isinstance(x, list):
            return [rename(v) for v in x]
        if not isinstance(x, dict):
            return x
        out = {k: rename(v) for k, v in x.items() if k not in ("$defs", "definitions") or x is not schema}
        ref = out.get("$ref")
        if isinstance(ref, str):
            for root in ("#/$defs/", "#/definitions/"):
                if ref.startswith(root):
                    out["$ref"] = "#/$defs/" + prefix + ref[len(root):]
        return out

    return rename(schema), {prefix + k: rename(v) for k, v in defs.items()}


def _with_defs(schema: dict, defs: dict) -> dict:
    return {**schema, "$defs": defs} if defs else schema


def _lark_json(schema: dict) -> str:
    """A schema inside a Lark grammar, with the JSON options Grammar.json_schema uses."""
    return "%json " + json.dumps({**schema, "x-guidance": dict(JSON_OPTIONS)})


def marker(text: str, token_id) -> str:
    """A marker in a Lark grammar: the vocabulary's one token spelled text (token_id(text)), else the text."""
    tid = token_id(text)
    return f"<[{tid}]>" if tid is not None else json.dumps(text)


def parallel_default(fam: str) -> bool:
    """Whether a request that does not say (parallel_tool_calls) may make several calls: as
    llama-server, what the template can render -- the generic family's template renders no calls,
    so one call (a small model held to an open array repeats its call until max_tokens)."""
    return fam != "generic"


def grammar(tools: list[Tool], fam: str, mode: str, name: str | None, parallel: bool | None,
            token_id=lambda text: None) -> tuple[Grammar | None, tuple[str, ...]]:
    """What holds the reply, and the texts that start it (SamplingParams.grammar_triggers; none:
    from the first token).  The generic family: always, from the start (the reply must be JSON).
    The others: with a call required (a named function: that one alone) from the start; with
    "auto" the model is free until it starts a call, which from there must parse.  token_id(text):
    the vocabulary's token spelled exactly text, if any: a marker that is one token is written as it.
    parallel: several calls may follow one another (None: parallel_default); a named function is
    called once, as llama.cpp's grammar for a named tool_choice allows."""
    if mode == "none" or not tools:
        return None, ()
    parallel = (parallel_default(fam) if parallel is None else parallel) and name is None
    chosen = [t for t in tools if name is None or t.name == name]
    triggers = () if mode == "required" else CALL_STARTS[fam]

    def lit(text: str) -> str:
        return marker(text, token_id)

    if fam in ("qwen3coder", "glm45"):
        body = xml_tool_calls.grammar_body if fam == "qwen3coder" else xml_tool_calls.glm_grammar_body
        return Grammar("lark", body(chosen, parallel, lit, lambda s, d: _lark_json(_with_defs(s, d)), _own_defs)), triggers
    if fam == "gemma4":
        return Grammar("lark", gemma4_format.grammar_body(chosen, parallel, lit)), triggers
    call, defs = _call_schema(chosen, fam)
    if fam == "generic":
        calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1,
                                                                  **({} if parallel else {"maxItems": 1})}},
                 "required": ["tool_calls"], "additionalProperties": False}
        if mode == "required":
            return Grammar.json_schema(_with_defs(calls, defs)), ()
        answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                  "additionalProperties": False}
        return Grammar.json_schema(_with_defs({"anyOf": [calls, answer]}, defs)), ()
    one = _lark_json(_with_defs(call, defs))
    if fam == "hermes":
        more = ' ("\\n" call)*' if parallel else ""
        body = f'start: call{more}\ncall: {lit("<tool_call>")} "\\n" args "\\n" {lit("</tool_call>")}\nargs: {one}'
    elif fam == "mistral":
        schema = _with_defs({"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})},
                            defs)
        body = f'start: {lit("[TOOL_CALLS]")} " "? args\nargs: {_lark_json(schema)}'
    elif fam == "mistral_args":  # the name outside the JSON: one alternative per tool
        rules = [f'call_{i}: {lit("[TOOL_CALLS]")} {json.dumps(t.name)} {lit("[ARGS]")} args_{i}\n'
                 f'args_{i}: {_lark_json(as_llama_cpp(t.parameters))}' for i, t in enumerate(chosen)]
        body = (f'start: call{"+" if parallel else ""}\n'
                f'call: {" | ".join(f"call_{i}" for i in range(len(chosen)))}\n' + "\n".join(rules))
    elif fam == "deepseek":  # the name outside the JSON: one alternative per tool
        rules = [f'call_{i}: {lit(DS_CALL)} "function" {lit(DS_SEP)} {json.dumps(t.name + chr(10) + "```json" + chr(10))} '
                 f'args_{i} {json.dumps(chr(10) + "```")} {lit(DS_CALL_END)}\n'
                 f'args_{i}: {_lark_json(as_llama_cpp(t.parameters))}' for i, t in enumerate(chosen)]
        body = (f'start: {lit(DS_BEGIN)} call{"+" if parallel else ""} {lit(DS_END)}\n'
                f'call: {" | ".join(f"call_{i}" for i in range(len(chosen)))}\n' + "\n".join(rules))
    elif fam == "deepseek_v31":  # the name before the separator: one alternative per tool
        rules = [f'call_{i}: {lit(DS_CALL)} {json.dumps(t.name)} {lit(DS_SEP)} args_{i} {lit(DS_CALL_END)}\n'
                 f'args_{i}: {_lark_json(as_llama_cpp(t.parameters))}' for i, t in enumerate(chosen)]
        body = (f'start: {lit(DS_BEGIN)} call{"+" if parallel else ""} {lit(DS_END)}\n'
                f'call: {" | ".join(f"call_{i}" for i in range(len(chosen)))}\n' + "\n".join(rules))
    else:  # llama3
        body = f'start: {lit("<|python_tag|>")}? args\nargs: {one}'
    return Grammar("lark", body), triggers


# ---------------------------------------------------------------- the reply


def new_id(fam: str = "") -> str:
    """A call id: OpenAI's shape, or the 9 letters and digits Mistral's templates require."""
    return uuid.uuid4().hex[:9] if fam in ("mistral", "mistral_args") else "call_" + uuid.uuid4().hex[:24]


def _json_at(text: str, i: int) -> tuple[Any, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text, i)
    except json.JSONDecodeError:
        return None


def _calls(items: Any, key: str = "arguments", fam: str = "") -> list[ToolCall] | None:
    """ToolCalls from [{"name", key}] objects, or None if they are not all well formed (a Mistral
    model's own 9-character ids are kept)."""
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        return None
    out = []
    for it in items:
        if not (isinstance(it, dict) and isinstance(it.get("name"), str)):
            return None
        args = it.get(key, it.get("arguments", it.get("parameters", {})))
        own = it.get("id")
        cid = own if fam == "mistral" and isinstance(own, str) and re.fullmatch(r"[A-Za-z0-9]{9}", own) else new_id(fam)
        out.append(ToolCall(it["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), cid))
    return out


def parse_reply(fam: str, text: str, tools: list[Tool] | tuple = ()) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of a whole reply; a reply that does not parse as calls is content.
    tools: what the request offered (qwen3coder's values are typed by their schemas)."""
    if fam == "generic":
        got = _json_at(text.strip(), 0)
        value = got[0] if got else None
        if isinstance(value, dict) and "tool_calls" in value:
            calls = _calls(value["tool_calls"])
            if calls:
                return "", calls
        if isinstance(value, dict) and isinstance(value.get("response"), str):
            return value["response"], []
        return text, []
    if fam == "hermes":
        calls, content = [], text
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S):
            got = _calls(_json_at(m.group(1), 0)[0] if _json_at(m.group(1), 0) else None)
            if got is None:
                return text, []
            calls += got
        if calls:
            content = text[:text.index("<tool_call>")].strip()
        return content, calls
    if fam in ("qwen3coder", "glm45"):
        found = (xml_tool_calls.parse if fam == "qwen3coder" else xml_tool_calls.glm_parse)(text, list(tools))
        if not found:
            return text, []
        return text[:text.index(xml_tool_calls.OPEN)].strip(), [
            ToolCall(n, json.dumps(a, ensure_ascii=False), new_id()) for n, a in found]
    if fam == "gemma4":
        got = gemma4_format.parse(text)
        return (got[0], [ToolCall(n, json.dumps(a, ensure_ascii=False), new_id()) for n, a in got[1]]) if got else (text, [])
    if fam == "mistral":
        i = text.find("[TOOL_CALLS]")
        j = i + len("[TOOL_CALLS]")
        got = _json_at(text, j + len(text[j:]) - len(text[j:].lstrip())) if i >= 0 else None
        calls = _calls(got[0], fam="mistral") if got else None
        return (text[:i].strip(), calls) if calls else (text, [])
    if fam == "mistral_args":
        return _parse_mistral_args(text)
    if fam == "deepseek":
        found = re.findall(re.escape(DS_CALL) + r"function" + re.escape(DS_SEP) + r"(.*?)\n```json\n(.*?)\n```"
                           + re.escape(DS_CALL_END), text, re.S)
        calls = []
        for name, args in found:
            got = _json_at(args, 0)
            if got is None:
                return text, []
            calls.append(ToolCall(name.strip(), json.dumps(got[0], ensure_ascii=False), new_id()))
        return (text[:text.index(DS_BEGIN)].strip() if DS_BEGIN in text else "", calls) if calls else (text, [])
    if fam == "deepseek_v31":
        found = re.findall(re.escape(DS_CALL) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + re.escape(DS_CALL_END),
                           text, re.S)
        calls = []
        for name, args in found:
            got = _json_at(args.strip(), 0)
            if got is None:
                return text, []
            calls.append(ToolCall(name.strip(), json.dumps(got[0], ensure_ascii=False), new_id()))
        return (text[:text.index(DS_BEGIN)].strip() if DS_BEGIN in text else "", calls) if calls else (text, [])
    # llama3: the whole reply is the call
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    got = _json_at(body, 0) if body.startswith("{") else None
    calls = _calls(got[0], "parameters") if got and not body[got[1]:].strip() else None
    return ("", calls) if calls else (text, [])


def _parse_mistral_args(text: str) -> tuple[str, list[ToolCall]]:
    """[TOOL_CALLS]NAME[ARGS]{...} per call (an optional [CALL_ID]ID before [ARGS], its 9 letters and
    digits kept); anything malformed: the whole reply is content."""
    head, *parts = text.split("[TOOL_CALLS]")
    calls = []
    for part in parts:
        name, sep, rest = part.partition("[ARGS]")
        name, _, own = name.partition("[CALL_ID]")
        got = _json_at(rest, len(rest) - len(rest.lstrip())) if sep else None
        if got is None or not _NAME.match(name.strip()) or rest[got[1]:].strip():
            return text, []
        cid = own.strip() if re.fullmatch(r"[A-Za-z0-9]{9}", own.strip()) else new_id("mistral_args")
        calls.append(ToolCall(name.strip(), json.dumps(got[0], ensure_ascii=False), cid))
    return (head.strip(), calls) if calls else (text, [])


class ReplyStream:
    """A streamed reply split as it arrives: text is passed on until something that may start a
    tool call shows up; from there it is held, and parsed when the reply ends."""

    def __init__(self, fam: str, tools: list[Tool] | tuple = ()):
        self.fam = fam
        self.tools = tools
        self.sent = ""  # content passed on
        self.held = ""  # text held back: a call from its marker on, or a tail that may begin a marker
        self.in_call = False

    def feed(self, text: str) -> str:
        """Content that can go out now."""
        if self.in_call:
            self.held += text
            return ""
        pending, self.held = self.held + text, ""
        if not pending:
            return ""
        starts = CALL_STARTS[self.fam]
        cut = _call_start(starts, self.sent, pending)
        if cut is None:
            # keep back a tail that could still become a call's start, until it cannot
            keep = _maybe_start(starts, self.sent, pending)
            out, self.held = pending[:len(pending) - keep], pending[len(pending) - keep:]
        else:
            out, self.held, self.in_call = pending[:cut], pending[cut:], True
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet passed on, tool calls) at the end of the reply."""
        content, calls = parse_reply(self.fam, self.sent + self.held, self.tools)
        if calls:
            return "", calls
        if self.fam == "generic" and not self.sent.strip():  # all held: the answer inside {"response": ...}
            return content, []
        return self.held, []


def _call_start(starts: tuple[str, ...], sent: str, text: str) -> int | None:
    """Where a call starts in text, the reply's next piece after `sent` (None: not in it)."""
    hits = []
    for start in starts:
        if start.startswith("^"):
            body = text.lstrip()
            if not sent.strip() and body.startswith(start[1:]):
                hits.append(len(text) - len(body))
        elif start in text:
            hits.append(text.find(start))
    return min(hits) if hits else None


def _maybe_start(starts: tuple[str, ...], sent: str, text: str) -> int:
    """Length of the tail of text that could still grow into a call's start (held back)."""
    best = 0
    for start in starts:
        if start.startswith("^"):
            body = text.lstrip()
            if not sent.strip() and body and start[1:].startswith(body):
                best = max(best, len(text))
            continue
        for n in range(1, len(start)):
            if text.endswith(start[:n]):
                best = max(best, n)
    return best
