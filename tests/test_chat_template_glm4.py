"""GLM-4.5 / 4.6's and GLM-4.7's chat templates (as their GGUF files carry them) through
engine/chat_template.py: "[gMASK]<sop>", turns opened by <|system|>, <|user|>, <|assistant|> and
<|observation|> (tool results) with no closing token; the reasoning in <think> kept for the turns
after the last user query and emptied before; thinking off with enable_thinking=False (4.6: a
"/nothink" after each user message and an empty thought in the prompt; 4.7: the prompt closes the
thought, which it otherwise opens); tool calls as <tool_call>NAME<arg_key>K</arg_key>
<arg_value>V</arg_value></tool_call> (4.6 with newlines between the tags). FIXTURE_46 and
FIXTURE_47 are our condensations of the templates (the tools preamble shortened, content as
strings only, the logic as it is); where llama-cpp-python's vendored tree has the real ones
(models/templates/GLM-4.6.jinja, GLM-4.7-Flash.jinja) they render the same conversations the same
way."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from infer.engine.chat_template import ChatTemplate
from infer.engine.reasoning import opened_in_prompt, split_reply, style
from infer.engine.tool_calls import family, parse_reply, parse_tools, prepare

# the two templates differ in the newlines between their tags (nl), in GLM-4.6's "/nothink" and in
# how the turns' and the generation prompt's thoughts are opened or closed: our condensation sets
# those first, the rest is one
_BODY = """
{%- if tools -%}
<|system|>
# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>{%- endif -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}{% set ns.last_user_index = loop.index0 %}{% endif %}
{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'user' -%}
{{ '<|user|>' + nl + m.content }}
{{- '/nothink' if nothink and (enable_thinking is defined and not enable_thinking
                               and not m.content.endswith('/nothink')) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = m.content %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- elif '</think>' in content %}
    {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
    {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ nl + '<think>' + reasoning_content.strip() + '</think>' }}
{%- else -%}
{{ empty_thought }}
{%- endif -%}
{%- if content.strip() %}{{ nl + content.strip() }}{% endif -%}
{%- for tc in m.tool_calls or [] %}
{%- set tc = tc.function if tc.function else tc %}
{{- nl + '<tool_call>' + tc.name }}
{%- for k, v in tc.arguments.items() -%}
{{ nl + '<arg_key>' + k + '</arg_key>' + nl + '<arg_value>' }}
{{- v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{%- endfor -%}
{{ nl + '</tool_call>' }}
{%- endfor %}
{%- elif m.role == 'tool' -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{ '<|observation|>' }}{% endif -%}
{{ nl + '<tool_response>' + nl + m.content + nl + '</tool_response>' }}
{%- elif m.role == 'system' -%}
{{ '<|system|>' + nl + m.content }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- think_off if (enable_thinking is defined and not enable_thinking) else think_on -}}
{%- endif -%}"""
FIXTURE_46 = ("[gMASK]<sop>{%- set nl, nothink, empty_thought = '\\n', true, '\\n<think></think>' %}"
              "{%- set think_on, think_off = '', '\\n<think></think>' %}" + _BODY)
FIXTURE_47 = ("[gMASK]<sop>{%- set nl, nothink, empty_thought = '', false, '</think>' %}"
              "{%- set think_on, think_off = '<think>', '</think>' %}" + _BODY)

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>an old thought</think>Hello!"},
    {"role": "user", "content": "How are you?"},
]
TOOL_TURN = CONVO + [
    {"role": "assistant", "content": "", "reasoning_content": "check the weather",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "content": "22C"},
    {"role": "tool", "content": "9C"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _render(fixture: str, convo: list[dict], **kw) -> str:
    return ChatTemplate(fixture, "", "").render(convo, **kw)


def test_glm46_thinking_on_and_off():
    history = "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n<think></think>\nHello!<|user|>\nHow are you?"
    out = _render(FIXTURE_46, CONVO)
    assert out == history + "<|assistant|>"  # an earlier turn's thought emptied; the model opens its own
    assert style(FIXTURE_46) == "think" and not opened_in_prompt(out)
    off = _render(FIXTURE_46, CONVO, enable_thinking=False)
    assert off == history.replace("Hi<", "Hi/nothink<") + "/nothink<|assistant|>\n<think></think>"
    assert not opened_in_prompt(off)
    # what the model writes after the prompt: its thought first, then the answer
    assert split_reply("think", "\n<think>Greet back.</think>\nFine, thanks.") == ("Greet back.", "Fine, thanks.")


def test_glm47_thinking_opened_in_the_prompt():
    history = "[gMASK]<sop><|system|>Be brief.<|user|>Hi<|assistant|></think>Hello!<|user|>How are you?"
    out = _render(FIXTURE_47, CONVO)
    assert out == history + "<|assistant|><think>" and opened_in_prompt(out)  # the reply starts inside the thought
    off = _render(FIXTURE_47, CONVO, enable_thinking=False)
    assert off == history + "<|assistant|></think>" and not opened_in_prompt(off)


def test_tool_call_turn_keeps_its_thought():
    out = _render(FIXTURE_46, TOOL_TURN, tools=TOOLS)
    assert out.startswith("[gMASK]<sop><|system|>\n# Tools\n<tools>\n"
                          '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n'
                          "</tools><|system|>\nBe brief.")
    assert out.endswith(  # after the last user query: the turn's thought stays
        "<|user|>\nHow are you?<|assistant|>\n<think>check the weather</think>\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
        "</tool_call><|observation|>\n<tool_response>\n22C\n</tool_response>\n<tool_response>\n9C\n</tool_response>"
        "<|assistant|>")
    out = _render(FIXTURE_47, TOOL_TURN, tools=TOOLS)
    assert out.endswith(
        "<|user|>How are you?<|assistant|><think>check the weather</think><tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>[1, 2]</arg_value>"
        "</tool_call><|observation|><tool_response>22C</tool_response><tool_response>9C</tool_response>"
        "<|assistant|><think>")


@pytest.mark.parametrize("fixture", [FIXTURE_46, FIXTURE_47], ids=["4.6", "4.7"])
def test_tool_calls_round_trip_through_the_template(fixture):
    """The calls GLM's template writes for an earlier turn are the calls read back from a reply
    written the same way: values typed by the tools' schemas, a string that looks like a number
    kept as text."""
    assert family(fixture) == "glm45"
    tools = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"},
                                         "zip": {"type": "string"}, "metric": {"type": "boolean"}}}}}])
    args = {"city": "New York\nNY", "days": [1, 2], "zip": "10001", "metric": True}
    turn = CONVO + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]}]
    msgs, variables = prepare(turn, tools, "glm45", "auto")
    text = ChatTemplate(fixture, "", "").render(msgs, tools=variables["tools"], add_generation_prompt=False)
    reply = text.split("<|assistant|>")[-1].split("</think>", 1)[1]  # after the turn's (empty) thought
    assert "<arg_value>true</arg_value>" in reply  # tojson: JSON's true
    content, calls = parse_reply("glm45", reply, tools)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args)]


@pytest.mark.reference
@pytest.mark.parametrize("name, fixture", [("GLM-4.6.jinja", FIXTURE_46), ("GLM-4.7-Flash.jinja", FIXTURE_47)],
                         ids=["4.6", "4.7"])
@pytest.mark.parametrize("thinking", [None, False], ids=["default", "off"])
def test_real_template_renders_as_the_fixture(name, fixture, thinking):
    kw = {} if thinking is None else {"enable_thinking": thinking}
    text = chat_template(name).read_text()  # llama.cpp's, from the installed llama-cpp-python's sources
    real, ours = ChatTemplate(text, "", ""), ChatTemplate(fixture, "", "")
    assert family(text) == "glm45" and style(text) == "think"
    assert real.render(CONVO, **kw) == ours.render(CONVO, **kw)
    # with tools the real one's preamble is longer; what follows it is the same
    tail = "</tools>"
    assert real.render(TOOL_TURN, tools=TOOLS, **kw).split(tail, 1)[1].split("<|system|>", 1)[1] == \
        ours.render(TOOL_TURN, tools=TOOLS, **kw).split(tail, 1)[1].split("<|system|>", 1)[1]
