"""Mistral 3's chat templates through engine/chat_template.py, engine/tool_calls.py and
engine/reasoning.py: Ministral 3 Reasoning's (llama.cpp's models/templates/
mistralai-Ministral-3-14B-Reasoning-2512.jinja: [SYSTEM_PROMPT], [INST], tool calls as
[TOOL_CALLS]NAME[ARGS]{json}, results in [TOOL_RESULTS], reasoning in [THINK]...[/THINK]) and Mistral
Small 3.2's (Mistral-Small-3.2-24B-Instruct-2506.jinja: the tools before the last [INST], a
[CALL_ID] before [ARGS]). MINISTRAL and SMALL are our condensations of them (default system prompts
shortened, image and thinking blocks left out, the rest as it is: helpers/mistral3_templates.py); where
llama-cpp-python's vendored tree has the real ones, they render the same conversations the same way."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from helpers.mistral3_templates import MINISTRAL, SMALL
from infer.engine.chat_template import ChatTemplate
from infer.engine.reasoning import TAGS, ThinkStream, spelled_out, split_reply, style
from infer.engine.tool_calls import family, parse_reply, parse_tools, prepare

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}}}}]
ARGS = {"city": "Paris", "days": [1, 2]}
CALL_TURN = CONVO + [
    {"role": "assistant", "content": "", "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "22C"},
]


def render(source: str, messages: list[dict], **kw) -> str:
    msgs, variables = prepare(messages, parse_tools(TOOLS), family(source), "auto")
    return ChatTemplate(source, "<s>", "</s>").render(msgs, add_generation_prompt=True, **variables, **kw)


def test_ministral_renders_calls_and_results():
    assert family(MINISTRAL) == "mistral_args" and style(MINISTRAL) == "mistral" and spelled_out("mistral")
    out = render(MINISTRAL, CALL_TURN)
    assert out == ("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS]" + json.dumps(TOOLS) +
                   "[/AVAILABLE_TOOLS][INST]Hi[/INST]Hello!</s>[INST]Weather in Paris?[/INST]"
                   '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": [1, 2]}</s>[TOOL_RESULTS]22C[/TOOL_RESULTS]')


@pytest.mark.parametrize("source", [MINISTRAL, SMALL], ids=["ministral", "small"])
def test_calls_round_trip_through_the_template(source):
    """The calls a template writes for an earlier turn are the calls read back from a reply written
    the same way (Small 3.2's [CALL_ID] kept as the call's id)."""
    out = render(source, CALL_TURN)
    reply = out.split("[/INST]")[-1].split("</s>")[0]
    content, calls = parse_reply("mistral_args", reply, parse_tools(TOOLS))
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
    assert (calls[0].id == "abcDEF123") is (source == SMALL)


def test_small_renders_tools_before_the_last_query():
    assert family(SMALL) == "mistral_args" and style(SMALL) == ""  # no [THINK]: it does not reason
    out = render(SMALL, CALL_TURN)
    assert out.startswith("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>[AVAILABLE_TOOLS]")
    assert out.endswith("[TOOL_RESULTS]abcDEF123[TOOL_CONTENT]22C[/TOOL_RESULTS]")


def test_reasoning_in_think_tags_is_split_off():
    reply = "[THINK]They ask for the weather.[/THINK]It is 22C."
    assert split_reply("mistral", reply) == ("They ask for the weather.", "It is 22C.")
    for size in (1, 3, 5):  # streamed in pieces: a tag cut between pieces is held until whole
        s = ThinkStream(tags=TAGS["mistral"])
        parts = [s.feed(reply[i:i + size]) for i in range(0, len(reply), size)] + [s.finish()]
        assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == split_reply("mistral", reply)
    assert split_reply("mistral", "It is 22C.") == ("", "It is 22C.")  # no thought: all answer
    # a thought, then a call: the call is read from the answer
    _, answer = split_reply("mistral", '[THINK]Call the tool.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')
    assert [c.name for c in parse_reply("mistral_args", answer)[1]] == ["get_weather"]


@pytest.mark.reference
@pytest.mark.parametrize("name, ours", [("mistralai-Ministral-3-14B-Reasoning-2512.jinja", MINISTRAL),
                                        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", SMALL)], ids=["ministral", "small"])
@pytest.mark.parametrize("convo", [CONVO, CALL_TURN], ids=["chat", "tools"])
def test_real_templates_render_as_the_fixtures(name, ours, convo):
    real = chat_template(name).read_text()
    assert family(real) == family(ours) and style(real) == style(ours)
    assert render(real, convo) == render(ours, convo)
