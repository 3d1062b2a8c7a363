"""Llama 4's chat template through engine/chat_template.py: each turn <|header_start|>ROLE
<|header_end|> then two newlines, the content and <|eot|>; tool results in the "ipython" role;
tools described in the first user message and calls written (and parsed back) as Llama 3's JSON
{"name": ..., "parameters": {...}}. FIXTURE is our condensation of the HF template of Llama 4's
Instruct models (the image parts and the date left out, the logic as it is); infer's built-in
template for files without one renders as llama.cpp's own (LLM_CHAT_TEMPLATE_LLAMA4, llama-chat.cpp)
after the BOS the HF template writes."""
from __future__ import annotations

import json

import pytest

from infer.engine.chat_template import LLAMA4_TEMPLATE, ChatTemplate, builtin_template, load_chat_template
from infer.engine.tool_calls import family, parse_reply, parse_tools

FIXTURE = """{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
    {{- '<|header_start|>system<|header_end|>\\n\\n' }}
    {%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}
    {{- system_message + '<|eot|>' }}
{%- endif %}
{%- if tools is not none %}
    {%- if messages | length == 0 %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {%- set first_user_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
    {{- '<|header_start|>user<|header_end|>\\n\\n' }}
    {{- 'Given the following functions, please respond with a JSON for a function call with its proper '
        'arguments that best answers the given prompt.\\n\\nRespond in the format {"name": function name, '
        '"parameters": dictionary of argument name and its value}.Do not use variables.\\n\\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}
    {{- first_user_message + '<|eot|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' + message['content'] + '<|eot|>' }}
    {%- elif 'tool_calls' in message and message.tool_calls | length > 0 %}
        {{- '<|header_start|>assistant<|header_end|>\\n\\n' }}
        {%- for tool_call in message.tool_calls %}
            {{- '{"name": "' + tool_call.function.name + '", "parameters": ' }}
            {{- tool_call.function.arguments | tojson + '}' }}
        {%- endfor %}
        {{- '<|eot|>' }}
    {%- elif message.role == 'tool' or message.role == 'ipython' %}
        {{- '<|header_start|>ipython<|header_end|>\\n\\n' + message.content + '<|eot|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"""

BOS, EOS = "<|begin_of_text|>", "<|eot|>"
CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]
HISTORY = ("<|header_start|>system<|header_end|>\n\nBe brief.<|eot|>"
           "<|header_start|>user<|header_end|>\n\nHi<|eot|>"
           "<|header_start|>assistant<|header_end|>\n\nHello!<|eot|>"
           "<|header_start|>user<|header_end|>\n\nHow are you?<|eot|>")
PROMPT = "<|header_start|>assistant<|header_end|>\n\n"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def _template(text: str) -> ChatTemplate:
    return ChatTemplate(text, BOS, EOS)


def _llama_cpp_llama4(messages: list[dict], add_ass: bool) -> str:
    """llama.cpp's built-in Llama 4 format (llama_chat_apply_template with tmpl "llama4")."""
    llama_cpp = pytest.importorskip("llama_cpp")
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = bytes(4096)
    n = llama_cpp.llama_chat_apply_template(b"llama4", chat, len(messages), add_ass, buf, len(buf))
    assert 0 < n <= len(buf)
    return buf[:n].decode()


def test_turns_and_generation_prompt():
    assert _template(FIXTURE).render(CONVO) == BOS + HISTORY + PROMPT
    assert _template(FIXTURE).render(CONVO, add_generation_prompt=False) == BOS + HISTORY


@pytest.mark.parametrize("convo", [CONVO, CONVO[1:], CONVO[1:2]])
@pytest.mark.parametrize("gen", [True, False])
def test_builtin_renders_as_the_fixture(convo, gen):
    builtin = load_chat_template(None, "llama4", "gpt2", "llama4", BOS, EOS)
    assert builtin.source is LLAMA4_TEMPLATE and builtin_template("llama4", "gpt2", None) is LLAMA4_TEMPLATE
    assert builtin.render(convo, add_generation_prompt=gen) == _template(FIXTURE).render(convo, add_generation_prompt=gen)


@pytest.mark.reference
@pytest.mark.parametrize("convo", [CONVO, CONVO[1:], CONVO[1:2]])
@pytest.mark.parametrize("gen", [True, False])
def test_builtin_renders_as_llama_cpp(convo, gen):
    ours = _template(LLAMA4_TEMPLATE).render(convo, add_generation_prompt=gen)
    assert ours == BOS + _llama_cpp_llama4(convo, gen)


def test_tools_in_the_first_user_message_and_calls_as_json():
    turn = CONVO[:2] + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22C"},
    ]
    out = _template(FIXTURE).render(turn, tools=TOOLS)
    assert out.startswith(BOS + "<|header_start|>system<|header_end|>\n\nEnvironment: ipython\nBe brief.<|eot|>"
                          "<|header_start|>user<|header_end|>\n\nGiven the following functions")
    assert json.dumps(TOOLS[0], indent=4) in out
    assert out.endswith('Hi<|eot|><|header_start|>assistant<|header_end|>\n\n'
                        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot|>'
                        "<|header_start|>ipython<|header_end|>\n\n22C<|eot|>" + PROMPT)
    # its calls are Llama 3's JSON: parsed (and constrained) as that family's
    assert family(FIXTURE) == "llama3"
    content, calls = parse_reply("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                                 parse_tools(TOOLS))
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
