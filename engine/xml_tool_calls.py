"""Tool calls in XML, as Qwen3-Coder, Qwen3.5 and Nemotron Nano 3 write them (llama.cpp's
"Qwen3-Coder" format), and as GLM-4.5 / 4.6 / 4.7 write them (llama.cpp's "GLM 4.5" format, at
the end of this module):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text, not JSON: a string is written as it is (over several lines if it
has them), anything else as JSON (the templates write mappings and lists with tojson, the rest
with Python's str()).  Reading a value back therefore needs the tool's schema: a string parameter
keeps its text ("42" stays a string), another parses as JSON.  The grammar holds each call to one
tool's parameters, required ones first in the schema's order and then any optional ones (llama.cpp
lets the required ones come in any order; a forced order is as valid and keeps the grammar small).
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

from .grammar import as_llama_cpp

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# a string value: any text up to the first parameter close (lazy: the value cannot contain it)
STRING_VALUE = 'xml_string[lazy]: /(?s:.*?)\\n<\\/parameter>\\n/'
_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def types_of(schema: Any) -> set[str] | None:
    """The JSON types a parameter's schema allows (None: it does not say, so any)."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    if "enum" in schema and all(isinstance(x, str) for x in schema["enum"]):
        return {"string"}
    if isinstance(schema.get("const"), str):
        return {"string"}
    return None


def grammar_body(tools: list, parallel: bool, lit: Callable[[str], str],
                 json_rule: Callable[[dict, dict], str], own_defs: Callable[[dict, str], tuple[dict, dict]]) -> str:
    """The Lark grammar of one call (or several, parallel) of any of the tools. lit(text): a marker as
    a token where the vocabulary has it; json_rule(schema, defs): a %json rule; own_defs: a tool's
    parameters with its definitions apart (the same renaming the JSON families use)."""
    rules, calls = [STRING_VALUE], []
    for i, tool in enumerate(tools):
        props, defs, required = _tool_params(tool, f"t{i}_", own_defs)
        args = []
        for j, (pname, pschema) in enumerate(props.items()):
            types = types_of(pschema)
            head = json.dumps(f"<parameter={pname}>\n")
            if types is not None and "string" not in types:
                value = f'{json_rule(as_llama_cpp(pschema), as_llama_cpp(defs))} "\\n</parameter>\\n"'
            elif types == {"string"}:
                value, text_rule = string_rule(pschema, f"text_{i}_{j}")
                rules += [text_rule] if text_rule else []
            else:  # text, where a string is one of several types: the text is what a model writes
                value = "xml_string"
            rules.append(f"arg_{i}_{j}: {head} {value}")
            args.append((pname, f"arg_{i}_{j}"))
        body = _args_body(args, required)
        rules.append(f'call_{i}: {lit(OPEN)} {json.dumps(chr(10) + f"<function={tool.name}>" + chr(10))} '
                     f'{body} "</function>\\n" {lit(CLOSE)}')
        calls.append(f"call_{i}")
    more = ' ("\\n" call)*' if parallel else ""
    return "\n".join([f"start: call{more}", f'call: {" | ".join(calls)}', *rules])


def _tool_params(tool: Any, prefix: str, own_defs: Callable[[dict, str], tuple[dict, dict]]) -> tuple[dict, dict, list]:
    """A tool's parameters (name -> schema), their definitions apart (renamed with prefix), and
    the required ones the parameters have."""
    params, defs = own_defs(tool.parameters, prefix)
    props = _properties(params)
    required = [p for p in params.get("required", []) if p in props] if isinstance(params, dict) else []
    return props, defs, required


def _properties(params: Any) -> dict:
    """A tool's parameters by name (their schemas); {} where it says none."""
    return params.get("properties", {}) if isinstance(params, dict) else {}


def _args_body(args: list[tuple[str, str]], required: list) -> str:
    """A call's arguments in a grammar: the required ones' rules in the schema's order, then any
    of the optional ones."""
    order = [rule for name, rule in args if name in required]
    optional = [rule for name, rule in args if name not in required]
    return " ".join(order) + (f' ({" | ".join(optional)})*' if optional else "")


def string_rule(schema: dict, name: str) -> tuple[str, str]:
    """A string parameter's value and close, and the rule that holds it (none: the shared one):
    an enum's (or const's) words as they are; a length bound as a bounded lazy match."""
    words = schema.get("enum") if "enum" in schema else [schema["const"]] if "const" in schema else None
    if isinstance(words, list) and words and all(isinstance(w, str) for w in words):
        return f'({" | ".join(json.dumps(w) for w in words)}) "\\n</parameter>\\n"', ""
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    bounded = isinstance(lo, int) and lo >= 0 and (hi is None or isinstance(hi, int) and hi >= lo)
    if not bounded or (lo == 0 and hi is None):  # no bound (or one that cannot hold: left to the text)
        return "xml_string", ""
    return name, f'{name}[lazy]: /(?s:.{{{lo},{"" if hi is None else hi}}}?)\\n<\\/parameter>\\n/'


def value(text: str, schema: Any) -> Any:
    """A parameter's text as the tool's schema types it: a string stays text, anything else is
    JSON (Python's True/False/None, which the templates' str() writes, read as JSON's)."""
    types = types_of(schema)
    if types == {"string"}:
        return text
    word = {"True": "true", "False": "false", "None": "null"}.get(text.strip(), text)
    try:
        return json.loads(word)
    except json.JSONDecodeError:
        return text


def parse(text: str, tools: list) -> list[tuple[str, dict]] | None:
    """(name, arguments) of each call in a reply, or None if its calls are not well formed; the
    content before the first call is the caller's to keep."""
    found = list(_CALL.finditer(text))
    if not found or text.count(OPEN) != len(found):
        return None
    schemas = {t.name: _properties(t.parameters) for t in tools}
    out = []
    for m in found:
        name = m.group(1).strip()
        body = m.group(2)
        args = {p.group(1).strip(): value(p.group(2), schemas.get(name, {}).get(p.group(1).strip()))
                for p in _PARAM.finditer(body)}
        if _PARAM.sub("", body).strip():  # text between parameters: not a call this format writes
            return None
        out.append((name, args))
    return out


# GLM-4.5 / 4.6 / 4.7: the tool's name right after <tool_call>, then each argument as a key and a
# value, with newlines between the tags (GLM-4.5, 4.6) or none (GLM-4.7):
#
#     <tool_call>get_weather
#     <arg_key>city</arg_key>
#     <arg_value>Paris</arg_value>
#     </tool_call>
#
# Values are written as Qwen3-Coder's are (a string as it is, anything else as JSON) and read back
# the same way, by the tool's schema.
GLM_KEY, GLM_VALUE = ("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>")
_GLM_CALL = re.compile(r"<tool_call>\s*([^<\n]+?)\s*((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>\s*)*)"
                       r"</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
# a string value: any text up to the first value close (lazy: the value cannot contain it)
GLM_STRING_VALUE = 'glm_string[lazy]: /(?s:.*?)<\\/arg_value>/'


def glm_parse(text: str, tools: list) -> list[tuple[str, dict]] | None:
    """(name, arguments) of each GLM call in a reply, or None if its calls are not well formed."""
    found = list(_GLM_CALL.finditer(text))
    if not found or text.count(OPEN) != len(found):
        return None
    schemas = {t.name: _properties(t.parameters) for t in tools}
    out = []
    for m in found:
        name = m.group(1).strip()
        args = {}
        for a in _GLM_ARG.finditer(m.group(2)):
            if GLM_KEY[0] in a.group(2) or GLM_VALUE[0] in a.group(2):  # a value left unclosed
                return None
            key = a.group(1).strip()
            args[key] = value(a.group(2), schemas.get(name, {}).get(key))
        out.append((name, args))
    return out


def glm_grammar_body(tools: list, parallel: bool, lit: Callable[[str], str],
                     json_rule: Callable[[dict, dict], str], own_defs: Callable[[dict, str], tuple[dict, dict]]) -> str:
    """grammar_body's grammar for GLM's calls: each argument's key and value tags, a newline
    before each tag and call or none (as the model's template writes them), a string value's text
    up to its close, any other value JSON."""
    rules, calls = [GLM_STRING_VALUE, 'nl: "\\n"?'], []
    for i, tool in enumerate(tools):
        props, defs, required = _tool_params(tool, f"t{i}_", own_defs)
        args = []
        for j, (pname, pschema) in enumerate(props.items()):
            types = types_of(pschema)
            if types is not None and "string" not in types:
                val = f'{json_rule(as_llama_cpp(pschema), as_llama_cpp(defs))} "</arg_value>"'
            else:  # text (a string, or one of several types: what a model writes)
                val = "glm_string"
            key = json.dumps(GLM_KEY[0] + pname + GLM_KEY[1])
            rules.append(f'arg_{i}_{j}: nl {key} nl "{GLM_VALUE[0]}" {val}')
            args.append((pname, f"arg_{i}_{j}"))
        body = _args_body(args, required)
        rules.append(f'call_{i}: {lit(OPEN)} {json.dumps(tool.name)} {body} nl {lit(CLOSE)}')
        calls.append(f"call_{i}")
    more = " (nl call)*" if parallel else ""  # GLM-4.7 writes its calls back to back
    return "\n".join([f"start: call{more}", f'call: {" | ".join(calls)}', *rules])
