"""`infer serve`'s structured output, tool calls and reasoning through the official openai client:
the embedded model (Gemma's template knows no tools: the generic format) and a tiny Qwen-style
model whose template writes <tool_call> and opens <think> (grammars force what it writes)."""
from __future__ import annotations

import json
import re

import pytest

from helpers.server import HELLO, MODEL, Server

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server_args():
    return ("--ctx", "1024", "--threads", "2", "--parallel", "4")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=120)


def test_structured_output(client):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=60, seed=4, response_format=fmt)
    value = json.loads(r.choices[0].message.content)
    assert value["colour"] in ("red", "green", "blue") and 1 <= value["count"] <= 9 and set(value) == set(schema["required"])
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=60, seed=4, response_format=fmt, stream=True) if c.choices]
    assert "".join(parts) == r.choices[0].message.content  # streamed: the same tokens
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")
    r = client.completions.create(model=MODEL, prompt="The answer is", max_tokens=10, seed=1,
                                  extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert r.choices[0].text in (" yes", " no")
    r = client.completions.create(model=MODEL, prompt="Colour:", max_tokens=30, seed=2,
                                  extra_body={"json_schema": {"enum": ["red", "blue"]}})
    assert json.loads(r.choices[0].text) in ("red", "blue")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}


def test_tool_calls_generic(client):
    # Gemma's template knows no tools: llama.cpp's generic JSON format, always held to its schema
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}, "auto"):
        r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=80, seed=1)
        m = r.choices[0].message
        if choice == "auto" and not m.tool_calls:  # the model answered: the text of {"response": ...}
            assert r.choices[0].finish_reason == "stop" and m.content
            continue
        assert r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1
        call = m.tool_calls[0]
        assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], tool_choice="required",
                                                 parallel_tool_calls=False, max_tokens=80, seed=1, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0][0].index == 0 and deltas[0][0].function.name == "get_weather"
    assert json.loads(deltas[0][0].function.arguments) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call and its result back in the conversation
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 25 C"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], max_tokens=40, seed=2)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


THINKING_QWEN = """{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is not defined or enable_thinking %}<think>
{% endif %}{% endif %}"""


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-serve")
    path = write_tiny_model(d / "tiny-qwen2.gguf", "qwen2", seed=5, chat_template=THINKING_QWEN, n_ctx=1024)
    s = Server(path, d, "--ctx", "1024", "--threads", "2", "--parallel", "2")
    yield s, openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x", max_retries=0, timeout=120)
    assert s.stop() == 0, s.output()


@pytest.mark.e2e
def test_tool_calls_hermes_and_reasoning(tiny_server):
    """A Qwen-style template (hermes <tool_call> syntax) that opens <think> in the prompt: a tiny
    random model, so grammars force what it writes.  A forced call first finishes the thought the
    prompt opened (which this model never does within a few tokens); with thinking off the call is
    held from the first token."""
    _, c = tiny_server
    model = c.models.list().data[0].id
    msgs = [{"role": "user", "content": "weather?"}]
    r = c.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=12,
                                  seed=3)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.model_extra["reasoning_content"] and not m.tool_calls
    for stream in (False, True):
        kw = dict(model=model, messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=600, seed=3,
                  parallel_tool_calls=False, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        if not stream:
            m = c.chat.completions.create(**kw).choices[0].message
            calls = m.tool_calls
        else:
            chunks = [ch for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
            calls = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        assert set(json.loads(calls[0].function.arguments)) == {"city"}
    # the reply starts inside <think> (the template opened it): split at </think>
    grammar = 'root ::= [a-z ]{3,12} "</think>" "\\n\\n" "yes"'
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=60, seed=4, extra_body={"grammar": grammar})
    m = r.choices[0].message
    assert m.content == "yes" and re.fullmatch(r"[a-z ]{3,12}", m.model_extra["reasoning_content"])
    chunks = [ch for ch in c.chat.completions.create(model=model, messages=msgs, max_tokens=60, seed=4, stream=True,
                                                      extra_body={"grammar": grammar}) if ch.choices]
    thought = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks)
    said = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert (thought, said) == (m.model_extra["reasoning_content"], "yes")
    # a response format's JSON also comes after the thought (thinking on: this model never ends it);
    # with thinking off it is held from the first token and is the content
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, seed=4, response_format=fmt)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.model_extra["reasoning_content"] and not m.content
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=300, seed=4, response_format=fmt,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert json.loads(m.content)["n"] in range(10) and not (m.model_extra or {}).get("reasoning_content")


SKY = [{"role": "user", "content": "Is the sky blue? Answer with your confidence."}]
FRANCE = [{"role": "user", "content": "What is the capital of France? Give an answer and a confidence between 0 and 1."}]
CONFIDENCE = {"type": "object", "properties": {"answer": {"type": "string"},
                                               "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
              "required": ["answer", "confidence"], "additionalProperties": False}
RATE = {"type": "function", "function": {"name": "rate", "description": "Rate how sure you are",
                                         "parameters": CONFIDENCE}}


def fraction_digits(value: str) -> int:
    return len(re.search(r'"confidence":\s*-?[0-9]*\.?([0-9]*)', value).group(1))


def test_numbers_end_within_max_tokens(client):
    """A held-out check: {"type": "number", "minimum": 0, "maximum": 1} let the embedded model write
    0.84916918545542067601509690545... until max_tokens (these seeds, without the bound); as llama.cpp's
    JSON grammars, a number takes at most 16 digits after the point, in a response format and in a
    tool's parameters."""
    fmt = {"type": "json_schema", "json_schema": {"name": "rated", "schema": CONFIDENCE, "strict": True}}
    for msgs, seed in ((SKY, 3), (SKY, 4), (FRANCE, 2)):
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100, seed=seed, response_format=fmt)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", text
        assert 0 <= json.loads(text)["confidence"] <= 1 and fraction_digits(text) <= 16
    for seed in (2, 5):
        r = client.chat.completions.create(model=MODEL, messages=SKY, tools=[RATE], tool_choice="required",
                                           max_tokens=100, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r.choices[0].message.content
        args = calls[0].function.arguments
        assert 0 <= json.loads(args)["confidence"] <= 1 and fraction_digits(args) <= 16


def test_forced_calls_end_as_calls(client):
    """tool_choice naming a function, or "required" or "auto", with parallel_tool_calls left out (the
    held-out check): the embedded model repeated get_weather inside the generic format's array until
    max_tokens, and the reply came back as text.  A named function is called once; without
    parallel_tool_calls the generic family makes one call, as llama-server (its template renders no calls)."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, extra in ((named, {}), (named, {"parallel_tool_calls": True}), ("required", {}), ("auto", {})):
        kw = dict(model=MODEL, messages=msgs, tools=[weather], tool_choice=choice, max_tokens=200, seed=1, **extra)
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens < 200, m.content
        assert len(m.tool_calls) == 1 and m.tool_calls[0].function.name == "get_weather" and m.content is None
        assert set(json.loads(m.tool_calls[0].function.arguments)) == {"city"}
        chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather")]
        assert json.loads(deltas[0].function.arguments) == json.loads(m.tool_calls[0].function.arguments)
