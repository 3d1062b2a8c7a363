"""Gemma 4's chat format: its turns, its tool declarations and calls, its thinking channel.

A conversation is turns "<|turn>ROLE\\n...<turn|>\\n" (the assistant's role is "model"); the system
turn also holds the tool declarations ("<|tool>declaration:NAME{...}<tool|>") and, with thinking on,
"<|think|>".  The model thinks in "<|channel>thought\\n...<channel|>" before its answer (with
thinking off the generation prompt closes an empty thought itself) and calls tools as

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:[1,2]}<tool_call|>

Gemma's own value syntax, not JSON: keys bare, strings between <|"|> quotes, numbers, true, false
and null bare.  The results come back in the same model turn, "<|tool_response>response:NAME{...}
<tool_response|>", and the model goes on from there.

TEMPLATE is infer's built-in rendering of that format (used for a file without
tokenizer.chat_template), written to render the conversations infer accepts (string contents,
OpenAI tools) exactly as Google's template does (llama.cpp's models/templates/google-gemma-4-31B-it.jinja).
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CALL_PREFIX = OPEN + "call:"
THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>thought", "<channel|>"

TEMPLATE = r"""{%- macro value(v, quote_keys=true) -%}
  {%- if v is string -%}{{- '<|"|>' + v + '<|"|>' -}}
  {%- elif v is boolean -%}{{- 'true' if v else 'false' -}}
  {%- elif v is mapping -%}
    {{- '{' -}}
    {%- for k, x in v | dictsort -%}
      {{- (',' if not loop.first else '') + ('<|"|>' + k + '<|"|>' if quote_keys else k) + ':' + value(x, quote_keys) -}}
    {%- endfor -%}
    {{- '}' -}}
  {%- elif v is sequence -%}
    {{- '[' -}}{%- for x in v -%}{{- (',' if not loop.first else '') + value(x, quote_keys) -}}{%- endfor -%}{{- ']' -}}
  {%- else -%}{{- v -}}
  {%- endif -%}
{%- endmacro -%}
{%- macro names(items) -%}
  {{- '[' -}}{%- for x in items -%}{{- (',' if not loop.first else '') + '<|"|>' + x + '<|"|>' -}}{%- endfor -%}{{- ']' -}}
{%- endmacro -%}
{%- macro props(properties) -%}
  {%- set skip = ['description', 'type', 'properties', 'required', 'nullable'] -%}
  {%- set ns = namespace(n=0) -%}
  {%- for key, p in properties | dictsort if key not in skip -%}
    {%- set kind = p['type'] | upper -%}
    {%- set parts = [] -%}
    {%- if p['description'] -%}{%- set parts = parts + ['description:<|"|>' + p['description'] + '<|"|>'] -%}{%- endif -%}
    {%- if kind == 'STRING' and p['enum'] -%}{%- set parts = parts + ['enum:' + value(p['enum'])] -%}
    {%- elif kind == 'ARRAY' and p['items'] is mapping and p['items'] -%}
      {%- set f = namespace(items=[]) -%}
      {%- for ik, iv in p['items'] | dictsort if iv is not none -%}
        {%- if ik == 'properties' -%}{%- set f.items = f.items + ['properties:{' + (props(iv) if iv is mapping else '') + '}'] -%}
        {%- elif ik == 'required' -%}{%- set f.items = f.items + ['required:' + names(iv)] -%}
        {%- elif ik == 'type' -%}{%- set f.items = f.items + ['type:' + value(iv | upper if iv is string else iv | map('upper') | list)] -%}
        {%- else -%}{%- set f.items = f.items + [ik + ':' + value(iv)] -%}
        {%- endif -%}
      {%- endfor -%}
      {%- set parts = parts + ['items:{' + f.items | join(',') + '}'] -%}
    {%- endif -%}
    {%- if p['nullable'] -%}{%- set parts = parts + ['nullable:true'] -%}{%- endif -%}
    {%- if kind == 'OBJECT' -%}
      {%- set inner = p['properties'] if p['properties'] is defined and p['properties'] is mapping else p -%}
      {%- set parts = parts + ['properties:{' + props(inner) + '}'] -%}
      {%- if p['required'] -%}{%- set parts = parts + ['required:' + names(p['required'])] -%}{%- endif -%}
    {%- endif -%}
    {{- (',' if ns.n else '') + key + ':{' + (parts + ['type:<|"|>' + kind + '<|"|>']) | join(',') + '}' -}}
    {%- set ns.n = ns.n + 1 -%}
  {%- endfor -%}
{%- endmacro -%}
{%- macro declaration(f) -%}
  {{- 'declaration:' + f['name'] + '{description:<|"|>' + f['description'] + '<|"|>' -}}
  {%- set params = f['parameters'] -%}
  {%- if params -%}
    {{- ',parameters:{' -}}
    {%- if params['properties'] -%}{{- 'properties:{' + props(params['properties']) + '},' -}}{%- endif -%}
    {%- if params['required'] -%}{{- 'required:' + names(params['required']) + ',' -}}{%- endif -%}
    {%- if params['type'] -%}{{- 'type:<|"|>' + params['type'] | upper + '<|"|>}' -}}{%- endif -%}
  {%- endif -%}
  {{- '}' -}}
{%- endmacro -%}
{%- macro answer(text) -%}
  {%- set ns = namespace(out='') -%}
  {%- for part in text.split('<channel|>') -%}
    {%- set ns.out = ns.out + part.split('<|channel>')[0] -%}
  {%- endfor -%}
  {{- ns.out | trim -}}
{%- endmacro -%}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- set system_first = messages and messages[0]['role'] in ['system', 'developer'] -%}
{%- set turns = messages[1:] if system_first else messages -%}
{%- set ns = namespace(last=None, last_user=-1) -%}
{{- bos_token -}}
{%- if thinking or tools or system_first -%}
  {{- '<|turn>system\n' + ('<|think|>\n' if thinking else '') -}}
  {%- if system_first -%}{{- messages[0]['content'] | trim -}}{%- endif -%}
  {%- for tool in tools or [] -%}{{- '<|tool>' + declaration(tool['function']) | trim + '<tool|>' -}}{%- endfor -%}
  {{- '<turn|>\n' -}}
{%- endif -%}
{%- for m in turns -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in turns -%}{%- if m['role'] != 'tool' -%}
  {%- set i = loop.index0 -%}
  {%- set ns.last = None -%}
  {%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
  {%- set before = namespace(role=None) -%}
  {%- for earlier in turns[:i] if earlier['role'] != 'tool' -%}{%- set before.role = earlier['role'] -%}{%- endfor -%}
  {%- if not (role == 'model' and before.role == 'assistant') -%}{{- '<|turn>' + role + '\n' -}}{%- endif -%}
  {%- set thought = m.get('reasoning') or m.get('reasoning_content') -%}
  {%- if thought and i > ns.last_user and m.get('tool_calls') -%}
    {{- '<|channel>thought\n' + thought + '\n<channel|>' -}}
  {%- endif -%}
  {%- set answered = namespace(any=false, stop=false) -%}
  {%- if m.get('tool_calls') -%}
    {%- for call in m['tool_calls'] -%}
      {%- set args = call['function']['arguments'] -%}
      {{- '<|tool_call>call:' + call['function']['name'] + '{' -}}
      {%- if args is mapping -%}
        {%- for k, x in args | dictsort -%}{{- (',' if not loop.first else '') + k + ':' + value(x, false) -}}{%- endfor -%}
      {%- elif args is string -%}{{- args -}}
      {%- endif -%}
      {{- '}<tool_call|>' -}}
    {%- endfor -%}
    {%- set ns.last = 'tool_call' -%}
    {%- for r in turns[i + 1:] -%}
      {%- if r['role'] != 'tool' -%}{%- set answered.stop = true -%}{%- endif -%}
      {%- if not answered.stop -%}
        {%- set who = namespace(name=r.get('name') or 'unknown') -%}
        {%- for call in m['tool_calls'] if call.get('id') == r.get('tool_call_id') -%}{%- set who.name = call['function']['name'] -%}{%- endfor -%}
        {{- '<|tool_response>response:' + who.name + '{value:' + value(r['content'], false) + '}<tool_response|>' -}}
        {%- set answered.any = true -%}
        {%- set ns.last = 'tool_response' -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- if m['content'] is string -%}{{- answer(m['content']) if role == 'model' else m['content'] | trim -}}{%- endif -%}
  {%- if ns.last == 'tool_call' and not answered.any -%}{{- '<|tool_response>' -}}
  {%- elif not (answered.any and not m['content']) -%}{{- '<turn|>\n' -}}
  {%- endif -%}
{%- endif -%}{%- endfor -%}
{%- if add_generation_prompt and ns.last not in ['tool_response', 'tool_call'] -%}
  {{- '<|turn>model\n' + ('' if thinking else '<|channel>thought\n<channel|>') -}}
{%- endif -%}
"""


# ---------------------------------------------------------------- the model's tool calls

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_KEY = re.compile(r"[^:}]+")  # a key runs to its colon (llama.cpp's gemma4-dict-key)
_SPACE = re.compile(r"\s*")


class SyntaxProblem(ValueError):
    """Text that is not a Gemma 4 value (the reply is then content, not a call)."""


def _space(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _value(text: str, i: int) -> tuple[Any, int]:
    """The value at text[i:] as Python (what JSON would make of it), and where it ends."""
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise SyntaxProblem("an unclosed string")
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", i):
        return _dict(text, i)
    if text.startswith("[", i):
        items: list[Any] = []
        i = _space(text, i + 1)
        if text.startswith("]", i):
            return items, i + 1
        while True:
            item, i = _value(text, i)
            items.append(item)
            i = _space(text, i)
            if text.startswith("]", i):
                return items, i + 1
            if not text.startswith(",", i):
                raise SyntaxProblem("a list without its ',' or ']'")
            i = _space(text, i + 1)
    for word, v in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, i):
            return v, i + len(word)
    m = _NUMBER.match(text, i)
    if m is None:
        raise SyntaxProblem(f"no value at {text[i:i + 20]!r}")
    return json.loads(m.group()), m.end()


def _dict(text: str, i: int) -> tuple[dict, int]:
    out: dict[str, Any] = {}
    i = _space(text, i + 1)
    if text.startswith("}", i):
        return out, i + 1
    while True:
        m = _KEY.match(text, i)
        if m is None or not text.startswith(":", m.end()):
            raise SyntaxProblem("a key without its ':'")
        key = m.group()
        if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) >= 2 * len(QUOTE):  # a quoted key
            key = key[len(QUOTE):-len(QUOTE)]
        out[key], i = _value(text, _space(text, m.end() + 1))
        i = _space(text, i)
        if text.startswith("}", i):
            return out, i + 1
        if not text.startswith(",", i):
            raise SyntaxProblem("an object without its ',' or '}'")
        i = _space(text, i + 1)


def parse(text: str) -> tuple[str, list[tuple[str, dict]]] | None:
    """(the content before the first call, [(name, arguments)]) of a reply with calls; None if it
    has none or one does not parse (then the whole reply is content)."""
    start = text.find(CALL_PREFIX)
    if start < 0:
        return None
    calls, i = [], start
    while i < len(text):
        if not text.startswith(CALL_PREFIX, i):
            return None
        brace = text.find("{", i + len(CALL_PREFIX))
        name = text[i + len(CALL_PREFIX):brace] if brace >= 0 else ""
        if not name or any(c in name for c in "<>{} \n"):
            return None
        try:
            args, i = _dict(text, brace)
        except SyntaxProblem:
            return None
        if not text.startswith(CLOSE, i):
            return None
        calls.append((name, args))
        i = _space(text, i + len(CLOSE))
    return text[:start].strip(), calls


QUOTE_RULE = "quote"
_TYPED = {"string": "string", "integer": "INTEGER", "number": "NUMBER", "boolean": "BOOL", "null": '"null"'}


def string_rule(name: str, quoted: bool, lo: int = 0, hi: int | None = None) -> str:
    """A string's text and its closing quote (after the opening one).  The quote as text: one lazy
    lexeme up to it (a greedy one would take its "<" and could not give it back); the quote a
    token of its own: any text, which the token ends."""
    count = "*" if hi is None else f"{{{max(lo, 0)},{max(hi, lo, 0)}}}"
    if quoted:
        return f'{name}[lazy]: /(?s:.{count}?)<\\|"\\|>/'
    return f"{name}: /(?s:.{count})/ {QUOTE_RULE}"


def _args_rule(tool: Any, i: int, quoted: bool) -> str:
    """A tool's arguments: its schema's properties in the order its template sorts them (so, as the
    model saw earlier calls written), the required ones present, each value of its schema's type
    where that is one simple type (else any value); a schema without properties: any object."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    props = params.get("properties")
    if not isinstance(props, dict) or not props:
        return f"args_{i}: dict"
    required = set(params.get("required") or ())
    parts, terminals = [], []
    for n, (key, schema) in enumerate(sorted(props.items(), key=lambda kv: kv[0].lower())):  # as dictsort
        kind = schema.get("type") if isinstance(schema, dict) else None
        value = _TYPED.get(kind, "value") if isinstance(kind, str) else "value"
        if kind == "string" and isinstance(schema.get("maxLength"), int):  # its length bound, as JSON's
            lo = schema.get("minLength", 0)
            terminals.append(string_rule(f"text_{i}_{n}", quoted, lo if isinstance(lo, int) else 0, schema["maxLength"]))
            value = f"{QUOTE_RULE} text_{i}_{n}"
        sep = '","' if n else ""
        parts.append(f'({sep} {json.dumps(key + ":")} {value})' + ("" if key in required else "?"))
    if next(iter(sorted(props, key=str.lower))) not in required:  # no first key to hang the separators on
        return f"args_{i}: dict"
    return "\n".join([f'args_{i}: "{{" {" ".join(parts)} "}}"', *terminals])


def grammar_body(tools: list, parallel: bool, lit: Callable[[str], str]) -> str:
    """The Lark grammar of one call (or several, parallel) of any of the tools: the name, then its
    arguments in Gemma's value syntax (_args_rule).  lit(text): a marker as a token where the
    vocabulary has it."""
    quote = lit(QUOTE)
    quoted = not quote.startswith("<[")  # the quote spelled as text: no token of the vocabulary
    calls = [f'call_{i}: {lit(OPEN)} {json.dumps("call:" + t.name)} args_{i} {lit(CLOSE)}' for i, t in enumerate(tools)]
    return "\n".join([
        f'start: call{"+" if parallel else ""}',
        f'call: {" | ".join(f"call_{i}" for i in range(len(tools)))}',
        *calls,
        *(_args_rule(t, i, quoted) for i, t in enumerate(tools)),
        'dict: "{" (kv ("," kv)*)? "}"',
        'kv: KEY ":" value',
        'KEY: /[A-Za-z0-9_.\\-]+/',
        'list: "[" (value ("," value)*)? "]"',
        'value: string | dict | list | NUMBER | BOOL | "null"',
        f"{QUOTE_RULE}: {quote}",
        f"string: {QUOTE_RULE} text",
        string_rule("text", quoted),
        'BOOL: "true" | "false"',
        'INTEGER: /-?(0|[1-9][0-9]*)/',
        'NUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/',
    ])
