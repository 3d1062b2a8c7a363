"""DeepSeek-V3.1's chat template (the deepseek2 architecture's newest family of this style) through
engine/chat_template.py: the system messages joined at the front after BOS, <｜User｜> and
<｜Assistant｜> turns each reply ended by <｜end▁of▁sentence｜>, the thought of earlier replies
dropped; thinking off by default (an empty <think></think> after <｜Assistant｜>), on with
`thinking` or `enable_thinking`; tool calls as <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
<｜tool▁call▁end｜> inside <｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>, results in
<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>. FIXTURE is our condensation of the template (the
same logic, written our way); where llama-cpp-python's vendored tree has the real one
(models/templates/deepseek-ai-DeepSeek-V3.1.jinja) it renders the same conversations the same way."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from infer.engine.chat_template import ChatTemplate
from infer.engine.reasoning import opened_in_prompt, style
from infer.engine.tool_calls import family, grammar, parse_reply, parse_tools, prepare

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
FIXTURE = """{%- set thinking = thinking if thinking is defined else (enable_thinking if enable_thinking is defined else false) -%}
{%- set ns = namespace(system='', first_sp=true, last_user=false, is_tool=false, first_call=false) -%}
{%- for m in messages if m['role'] == 'system' -%}
  {%- set ns.system = ns.system + ('' if ns.first_sp else '\\n\\n') + m['content'] -%}
  {%- set ns.first_sp = false -%}
{%- endfor -%}
{{- bos_token + ns.system -}}
{%- for m in messages -%}
  {%- if m['role'] == 'user' -%}
    {%- set ns.is_tool = false -%}{%- set ns.last_user = true -%}
    {{- '<｜User｜>' + m['content'] -}}
  {%- elif m['role'] == 'assistant' and m['tool_calls'] -%}
    {%- if ns.last_user -%}{{- '<｜Assistant｜><think></think>' -}}{%- endif -%}
    {%- set ns.last_user = false -%}{%- set ns.is_tool = false -%}
    {%- for call in m['tool_calls'] -%}
      {%- if loop.first -%}{{- (m['content'] or '') + '<｜tool▁calls▁begin｜>' -}}{%- endif -%}
      {{- '<｜tool▁call▁begin｜>' + call['function']['name'] + '<｜tool▁sep｜>' -}}
      {{- call['function']['arguments'] | tojson -}}{{- '<｜tool▁call▁end｜>' -}}
    {%- endfor -%}
    {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' -}}
  {%- elif m['role'] == 'assistant' -%}
    {%- if ns.last_user -%}{{- '<｜Assistant｜>' + ('<think>' if m['prefix'] is defined and m['prefix'] and thinking else '<think></think>') -}}{%- endif -%}
    {%- set ns.last_user = false -%}
    {%- if ns.is_tool -%}{{- m['content'] + '<｜end▁of▁sentence｜>' -}}{%- set ns.is_tool = false -%}
    {%- else -%}{{- m['content'].split('</think>', 1)[-1] + '<｜end▁of▁sentence｜>' -}}{%- endif -%}
  {%- elif m['role'] == 'tool' -%}
    {%- set ns.last_user = false -%}{%- set ns.is_tool = true -%}
    {{- '<｜tool▁output▁begin｜>' + m['content'] + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.last_user and not ns.is_tool -%}
  {{- '<｜Assistant｜>' + ('<think>' if thinking else '<think></think>') -}}
{%- endif -%}
{#- for the family's detection, as the real one writes it: '<｜tool▁sep｜>' + tool['function']['arguments'] -#}"""

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>greet back</think>Hello!"},
    {"role": "user", "content": "How are you?"},
]
HISTORY = f"{BOS}Be brief.<｜User｜>Hi<｜Assistant｜><think></think>Hello!{EOS}<｜User｜>How are you?"
ARGS = {"city": "Paris", "days": [1, 2]}
TOOL_TURN = CONVO + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": ARGS}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
    {"role": "tool", "content": "22C"},
    {"role": "tool", "content": "14:00"},
    {"role": "assistant", "content": "22C at 14:00."},
]
TOOLS = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])


def _template(text: str) -> ChatTemplate:
    return ChatTemplate(text, BOS, EOS)


def test_turns_and_generation_prompt_thinking_off():
    out = _template(FIXTURE).render(CONVO)
    assert out == HISTORY + "<｜Assistant｜><think></think>"
    assert not opened_in_prompt(out) and style(FIXTURE) == "think"


@pytest.mark.parametrize("variable", ["thinking", "enable_thinking"])
def test_thinking_on(variable):
    out = _template(FIXTURE).render(CONVO, **{variable: True})
    assert out == HISTORY + "<｜Assistant｜><think>"
    assert opened_in_prompt(out)  # the reply starts inside the thought


def test_tool_calls_and_results():
    msgs, variables = prepare(TOOL_TURN, TOOLS, "deepseek_v31", "auto")
    out = _template(FIXTURE).render(msgs, **variables)
    assert out == (HISTORY + "<｜Assistant｜><think></think><｜tool▁calls▁begin｜>"
                   '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": [1, 2]}<｜tool▁call▁end｜>'
                   '<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜>'
                   f"<｜tool▁calls▁end｜>{EOS}<｜tool▁output▁begin｜>22C<｜tool▁output▁end｜>"
                   f"<｜tool▁output▁begin｜>14:00<｜tool▁output▁end｜>22C at 14:00.{EOS}")


def test_family_and_calls_parsed():
    assert family(FIXTURE) == "deepseek_v31"
    reply = ("Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
             '{"city": "Paris", "days": [1, 2]}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>'
             '{"tz": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    content, calls = parse_reply("deepseek_v31", reply, TOOLS)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS), ("get_time", {"tz": "CET"})]
    assert parse_reply("deepseek_v31", "No call here.", TOOLS) == ("No call here.", [])


def test_grammar_holds_the_call_syntax():
    # "auto": free text until the call's first marker, from there the call syntax (a lark grammar
    # with one alternative per tool, the name before the separator)
    g, triggers = grammar(TOOLS, "deepseek_v31", "auto", None, True)
    assert g is not None and g.kind == "lark" and triggers
    assert "call_0" in g.source and "call_1" in g.source and '"get_weather"' in g.source and '"get_time"' in g.source


@pytest.mark.reference
def test_real_template_renders_as_the_fixture():
    text = chat_template("deepseek-ai-DeepSeek-V3.1.jinja").read_text()  # llama.cpp's, from llama-cpp-python's sources
    real, ours = _template(text), _template(FIXTURE)
    assert family(text) == "deepseek_v31" and style(text) == "think"
    msgs, variables = prepare(TOOL_TURN, TOOLS, "deepseek_v31", "auto")
    for convo, kw in ((CONVO, {}), (CONVO, {"thinking": True}), (CONVO, {"enable_thinking": True}),
                      (CONVO[1:2], {}), (msgs, variables), (msgs[:-1], variables)):
        assert real.render(convo, **kw) == ours.render(convo, **kw)
