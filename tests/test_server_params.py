"""An API error names the request field at fault (OpenAI's `param`) from the error's own field
(InferError.field), never from its message text; the stop field's shape is the adapter's check,
what each stop string must be is SamplingParams'.  Pure functions of cli/server: no model, no server."""
from __future__ import annotations

import pytest

from infer.cli.server.openai_chat import plan
from infer.cli.server.openai_request import APIError, parse_job, stop_strings

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
