"""Qwen3.5's chat template (as its GGUF files carry it) through engine/chat_template.py: thinking
on by default (the generation prompt opens <think>), off with enable_thinking=False (an empty
thought closed in the prompt), earlier turns' thoughts dropped and the current turn's kept, tool
calls in its XML form. FIXTURE (helpers/qwen35_template.py) is our condensation of the template
(the vision and tools preambles shortened, the logic as it is); where llama-cpp-python's vendored
tree has the real one (models/templates/Qwen3.5-4B.jinja) it renders the same conversations the
same way."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from helpers.qwen35_template import FIXTURE
from infer.engine.chat_template import ChatTemplate, ChatTemplateError
from infer.engine.reasoning import opened_in_prompt, thinks
from infer.engine.tool_calls import family, parse_reply, parse_tools, prepare

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
