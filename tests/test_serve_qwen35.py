"""A Qwen3.5 model served: its template from the GGUF (helpers/qwen35_template.py), tool calls in
its XML syntax through the OpenAI API, and thinking on by default and off through OpenAI's
chat_template_kwargs (llama-server's and vLLM's field) and ollama's think. A tiny random qwen35
(gated delta nets beside attention), so grammars force what it writes."""
from __future__ import annotations

import json
import re

import openai
import pytest

from helpers.qwen35_template import FIXTURE
from helpers.server import raw

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer",
                                                                                        "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}}
THOUGHT = 'root ::= [a-z ]{3,12} "</think>" "\\n\\n" "yes"'  # what the reply must be when it starts thinking


@pytest.fixture(scope="module")
def server_model(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-qwen35")
    return write_tiny_model(d / "tiny-qwen35.gguf", "qwen35", seed=7, chat_template=FIXTURE, n_ctx=1024)


@pytest.fixture(scope="module")
def server_args():
    return ("--ctx", "1024", "--threads", "2", "--parallel", "2")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=300)


def test_xml_tool_calls(client):
    """tool_choice "required": the model writes <tool_call><function=...><parameter=...>, which comes
    back as an OpenAI tool call with its arguments typed by the schema (days a number, city text).
    Thinking off: with it on the call would first wait for the end of the thought the template
    opens, which this random model does not write."""
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "weather?"}]
    for stream in (False, True):
        kw = dict(model=model, messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=300, seed=3,
                  parallel_tool_calls=False, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        if not stream:
            r = client.chat.completions.create(**kw)
            calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        else:
            chunks = [ch for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
            calls = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
            finish = chunks[-1].choices[0].finish_reason
        assert finish == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
        args = json.loads(calls[0].function.arguments)
        assert set(args) == {"city", "days"} and isinstance(args["city"], str) and args["days"] in range(1, 8)


def test_thinking_on_and_off(client, server):
    """By default the template opens <think>: the reply's thought comes apart as reasoning_content.
    With enable_thinking false the template closes an empty thought in the prompt (more prompt
    tokens) and the whole reply is content; ollama's think does the same."""
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "hi"}]
    on = client.chat.completions.create(model=model, messages=msgs, max_tokens=40, seed=4, extra_body={"grammar": THOUGHT})
    assert on.choices[0].message.content == "yes"
    assert re.fullmatch(r"[a-z ]{3,12}", on.choices[0].message.model_extra["reasoning_content"])
    off = client.chat.completions.create(model=model, messages=msgs, max_tokens=40, seed=4, extra_body={
        "grammar": 'root ::= "yes"', "chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == "yes" and not off.choices[0].message.model_extra.get("reasoning_content")
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the closed, empty thought
    for think in (True, False):  # a random model never closes its thought: with think on it is all thinking
        status, _, reply = raw(server.port, "POST", "/api/chat", json.dumps({
            "model": model, "messages": msgs, "stream": False, "think": think,
            "options": {"num_predict": 6, "seed": 4}}).encode(), timeout=300)
        assert status == 200 and bool(reply["message"].get("thinking")) == think, reply
        assert bool(reply["message"]["content"]) != think, reply
    status, _, err = raw(server.port, "POST", "/v1/chat/completions", json.dumps({
        "model": model, "messages": msgs, "chat_template_kwargs": "no"}).encode())
    assert status == 400 and err["error"]["param"] == "chat_template_kwargs"
