"""Granite 4.0's chat template (as the Granite 4.0 H GGUF files carry it) through
engine/chat_template.py: roles between <|start_of_role|> and <|end_of_role|>, each turn ended by
<|end_of_text|>; a default system message where the conversation has none; tools listed in the
system message and tool calls as JSON in <tool_call>; consecutive tool results in one user turn.
FIXTURE is our condensation of the template (the tools preamble shortened, documents left out, the
logic as it is); where llama-cpp-python's vendored tree has the real one
(models/templates/ibm-granite-granite-4.0.jinja) it renders the same conversations the same way."""
from __future__ import annotations

import pytest

from helpers.llama_vocab import chat_template
from infer.engine.chat_template import ChatTemplate
from infer.engine.tool_calls import family

FIXTURE = """{%- set ns = namespace(system_message='', tools_message='') %}
{%- if tools %}
    {%- set ns.tools_message = 'Tools:\\n<tools>' %}
    {%- for tool in tools %}
        {%- set ns.tools_message = ns.tools_message + '\\n' + (tool | tojson) %}
    {%- endfor %}
    {%- set ns.tools_message = ns.tools_message + '\\n</tools>' %}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set ns.system_message = messages[0].content %}
    {%- if tools %}
        {%- set ns.system_message = ns.system_message + '\\n\\n' + ns.tools_message %}
    {%- endif %}
{%- elif tools %}
    {%- set ns.system_message = ns.tools_message %}
{%- endif %}
{%- if ns.system_message %}
    {{- '<|start_of_role|>system<|end_of_role|>' + ns.system_message + '<|end_of_text|>\\n' }}
{%- else %}
    {{- '<|start_of_role|>system<|end_of_role|>You are a helpful assistant. Please ensure responses are professional, accurate, and safe.<|end_of_text|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}
        {{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + content + '<|end_of_text|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|start_of_role|>assistant<|end_of_role|>' + content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if (loop.first and content) or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {%- if tool_call.function %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments if tool_call.arguments is string else tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|end_of_text|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|start_of_role|>user<|end_of_role|>' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|end_of_text|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_of_role|>assistant<|end_of_role|>' }}
{%- endif %}"""

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]
HISTORY = ("<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
           "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
           "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
           "<|start_of_role|>user<|end_of_role|>How are you?<|end_of_text|>\n")
TOOL_TURN = CONVO + [
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
    {"role": "tool", "content": "22C"},
    {"role": "tool", "content": "14:00"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _template(text: str) -> ChatTemplate:
    return ChatTemplate(text, "", "<|end_of_text|>")


def test_turns_and_generation_prompt():
    assert _template(FIXTURE).render(CONVO) == HISTORY + "<|start_of_role|>assistant<|end_of_role|>"


def test_default_system_message():
    out = _template(FIXTURE).render(CONVO[1:2])
    assert out == ("<|start_of_role|>system<|end_of_role|>You are a helpful assistant. Please ensure responses "
                   "are professional, accurate, and safe.<|end_of_text|>\n"
                   "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")


def test_tool_calls_and_results():
    out = _template(FIXTURE).render(TOOL_TURN, tools=TOOLS)
    assert out == (
        "<|start_of_role|>system<|end_of_role|>Be brief.\n\nTools:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n</tools>'
        "<|end_of_text|>\n" + HISTORY.split("<|end_of_text|>\n", 1)[1]
        + '<|start_of_role|>assistant<|end_of_role|><tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n'
        "</tool_call><|end_of_text|>\n"
        "<|start_of_role|>user<|end_of_role|>\n<tool_response>\n22C\n</tool_response>\n<tool_response>\n14:00\n"
        "</tool_response><|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")
    assert family(FIXTURE) == "hermes"  # its calls are parsed (and constrained) as Hermes' JSON in <tool_call>


@pytest.mark.reference
def test_real_template_renders_as_the_fixture():
    text = chat_template("ibm-granite-granite-4.0.jinja").read_text()  # llama.cpp's, from llama-cpp-python's sources
    real, ours = _template(text), _template(FIXTURE)
    assert family(text) == "hermes"
    for convo in (CONVO, CONVO[1:2], CONVO[1:]):
        assert real.render(convo) == ours.render(convo)
    # with tools the real one's preamble is longer; what follows it is the same
    tail = "</tools>"
    assert real.render(TOOL_TURN, tools=TOOLS).split(tail, 1)[1].split("<|end_of_text|>\n", 1)[1] == \
        ours.render(TOOL_TURN, tools=TOOLS).split(tail, 1)[1].split("<|end_of_text|>\n", 1)[1]
