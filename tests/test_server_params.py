"""An API error names the request field at fault (OpenAI's `param`) from the error's own field
(InferError.field), never from its message text; the stop field's shape is the adapter's check,
what each stop string must be is SamplingParams'.  Pure functions of cli/server: no model, no server."""
from __future__ import annotations

import pytest

from infer.cli.server.ollama_api import chat_message
from infer.cli.server.openai_chat import plan
from infer.cli.server.openai_request import APIError, chat_messages, parse_job, stop_strings
from infer.engine.chat_template import ChatTemplate

MSGS = [{"role": "user", "content": "hi"}]


def refused(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    return e.value


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0), ("top_k", -2), ("min_p", 2),
                                          ("repeat_penalty", 0)])
def test_sampling_errors_name_their_field(field, value):
    err = refused(parse_job, {field: value}, None)
    assert (err.status, err.param, err.code) == (400, field, "invalid_value")


@pytest.mark.parametrize("stop, code", [(42, "invalid_type"), ({"a": 1}, "invalid_type"), ([1, 2], "invalid_value"),
                                        ([""], "invalid_value"), ("", "invalid_value"), (["x"] * 17, "invalid_value")])
def test_bad_stop_is_the_stop_field(stop, code):
    err = refused(parse_job, {"stop": stop}, None)
    assert (err.status, err.param, err.code) == (400, "stop", code)


def test_stop_shapes():
    assert stop_strings(None, "stop") == ()
    assert stop_strings("\n", "stop") == ("\n",)
    assert stop_strings(["a", "b"], "stop") == ("a", "b")
    assert parse_job({"stop": ["a", "a"]}, None).params.stop == ("a", "a")


def test_tool_errors_name_the_field_that_failed():
    job = parse_job({}, None)
    tool = {"type": "function", "function": {"name": "tool_choice"}}  # a name that reads like the other field
    err = refused(plan, {"tools": [tool, tool]}, MSGS, "", "deepseek", job, lambda text: None)
    assert err.param == "tools"
    err = refused(plan, {"tool_choice": "required"}, MSGS, "", "deepseek", job, lambda text: None)
    assert err.param == "tool_choice"


def test_chat_template_kwargs_reach_the_template():
    """llama-server's and vLLM's chat_template_kwargs become template variables (Qwen3.5's
    enable_thinking); the renderer's own variables and non-objects are 400s naming the field."""
    job = parse_job({}, None)
    p, _ = plan({"chat_template_kwargs": {"enable_thinking": False}}, MSGS, "", "deepseek", job, lambda text: None)
    assert p.variables == {"enable_thinking": False}
    for bad, code in (([1], "invalid_type"), ({"messages": []}, "invalid_value"),
                      ({"add_generation_prompt": False}, "invalid_value")):
        err = refused(plan, {"chat_template_kwargs": bad}, MSGS, "", "deepseek", job, lambda text: None)
        assert (err.status, err.param, err.code) == (400, "chat_template_kwargs", code)


# a thinking model's template in the style of Qwen3's: an earlier turn's reasoning_content shown
# after the last user turn only
THINKS = ("{%- for m in messages %}{%- if m.role == 'assistant' and m.reasoning_content and loop.index0 > 0 %}"
          "<think>{{ m.reasoning_content }}</think>{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}")


def test_earlier_reasoning_reaches_the_template():
    """An assistant turn's thinking sent back (OpenAI/llama-server: reasoning_content; ollama:
    thinking) reaches the template, as llama-server passes it; another type is a 400 naming it."""
    turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "add"}]
    text = ChatTemplate(THINKS).render(chat_messages({"messages": turns}))
    assert text == "[user]2+2?<think>add</think>[assistant]4"
    ollama_turns = [turns[0], {"role": "assistant", "content": "4", "thinking": "add"}]
    msgs = chat_messages({"messages": [chat_message(m) for m in ollama_turns]})
    assert msgs[1] == {"role": "assistant", "content": "4", "reasoning_content": "add"}
    err = refused(chat_messages, {"messages": [turns[0], {**turns[1], "reasoning_content": 5}]})
    assert (err.status, err.param, err.code) == (400, "messages[1].reasoning_content", "invalid_type")
    # on other roles it means nothing to a template and is not passed on
    assert "reasoning_content" not in chat_messages({"messages": [{**turns[0], "reasoning_content": "x"}]})[0]
