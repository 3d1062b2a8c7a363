"""Qwen3.5's chat template (as its GGUF files carry it) through engine/chat_template.py: thinking
on by default (the generation prompt opens <think>), off with enable_thinking=False (an empty
thought closed in the prompt), earlier turns' thoughts dropped and the current turn's kept, tool
calls in its XML form. FIXTURE is our condensation of the template (the vision and tools
preambles shortened, the logic as it is); where llama-cpp-python's vendored tree has the real one
(models/templates/Qwen3.5-4B.jinja) it renders the same conversations the same way."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from infer.engine.chat_template import ChatTemplate, ChatTemplateError
from infer.engine.reasoning import opened_in_prompt, thinks
from infer.engine.tool_calls import family, parse_reply, parse_tools, prepare

FIXTURE = """{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\\n' }}
    {{- "# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>" }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\\n\\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\\n\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- else %}
                        {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\\n</parameter>\\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""


CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nan old thought\n</think>\n\nHello!"},
    {"role": "user", "content": "How are you?"},
]
HISTORY = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\nHello!<|im_end|>\n"  # an earlier turn's thought dropped
           "<|im_start|>user\nHow are you?<|im_end|>\n")
TOOL_TURN = CONVO + [
    {"role": "assistant", "content": "", "reasoning_content": "check the weather",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "content": "22C"},
]


def test_tool_calls_round_trip_through_the_template():
    """The calls Qwen3.5's template writes for an earlier turn are the calls read back from a reply
    written the same way (qwen3coder's XML): values typed by the tools' schemas, a string parameter
    that looks like a number kept as text."""
    assert family(FIXTURE) == "qwen3coder"
    tools = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"},
                                         "zip": {"type": "string"}, "metric": {"type": "boolean"}}}}}])
    args = {"city": "New York\nNY", "days": [1, 2], "zip": "10001", "metric": True}
    turn = CONVO + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": args}}]}]
    msgs, variables = prepare(turn, tools, "qwen3coder", "auto")
    text = ChatTemplate(FIXTURE, "", "<|im_end|>").render(msgs, tools=variables["tools"])
    reply = text.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0]
    reply = reply.split("</think>\n\n")[-1]  # the turn's (empty) thought, which the reasoning splitter takes
    assert "<parameter=metric>\nTrue\n</parameter>" in reply  # Python's str(): read back as JSON's true
    content, calls = parse_reply("qwen3coder", reply, tools)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args)]


def test_thinking_on_by_default():
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(CONVO)
    assert out == HISTORY + "<|im_start|>assistant\n<think>\n"
    assert opened_in_prompt(out) and thinks(FIXTURE)  # the reply starts inside the thought


def test_thinking_off():
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(CONVO, enable_thinking=False)
    assert out == HISTORY + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert not opened_in_prompt(out)


def test_tool_call_turn_keeps_its_thought():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(TOOL_TURN, tools=tools)
    assert out == (
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n</tools>'
        "\n\nBe brief.<|im_end|>\n" + HISTORY.split("<|im_end|>\n", 1)[1]
        # after the last user query: the turn's thought stays
        + "<|im_start|>assistant\n<think>\ncheck the weather\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")


def test_no_user_query_is_a_template_error():
    with pytest.raises(ChatTemplateError, match="No user query found"):
        ChatTemplate(FIXTURE).render([{"role": "system", "content": "x"}])


@pytest.mark.reference
@pytest.mark.parametrize("thinking", [None, False])
def test_real_template_renders_as_the_fixture(thinking):
    kw = {} if thinking is None else {"enable_thinking": thinking}
    text = chat_template("Qwen3.5-4B.jinja").read_text()  # llama.cpp's, from the installed llama-cpp-python's sources
    real, ours = ChatTemplate(text, "", "<|im_end|>"), ChatTemplate(FIXTURE, "", "<|im_end|>")
    assert real.render(CONVO, **kw) == ours.render(CONVO, **kw)
    # with tools the real one's preamble is longer; what follows it is the same
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    tail = "\n\nBe brief.<|im_end|>\n"
    assert real.render(TOOL_TURN, tools=tools, **kw).split(tail, 1)[1] == ours.render(TOOL_TURN, tools=tools,
                                                                                     **kw).split(tail, 1)[1]
