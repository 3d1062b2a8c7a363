"""A Ministral 3 model served: its template from the GGUF (helpers/mistral3_templates.py), tool
calls in its [TOOL_CALLS]NAME[ARGS]{json} syntax through the OpenAI API, and its [THINK] thought
returned apart as reasoning_content. A tiny random mistral3 (YaRN and the attention temperature),
so grammars force what it writes."""
from __future__ import annotations

import json

import openai
import pytest

from helpers.mistral3_templates import MINISTRAL

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server_model(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-mistral3")
    return write_tiny_model(d / "tiny-mistral3.gguf", "mistral3", seed=7, chat_template=MINISTRAL, n_ctx=1024)


@pytest.fixture(scope="module")
def server_args():
    return ("--ctx", "1024", "--threads", "2", "--parallel", "2")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=300)


def test_tool_calls(client):
    """tool_choice "required": the model writes [TOOL_CALLS]get_weather[ARGS]{...}, which comes back
    as an OpenAI tool call with a 9-character id (what Mistral's templates take back)."""
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "weather?"}]
    for stream in (False, True):
        kw = dict(model=model, messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=200, seed=3,
                  parallel_tool_calls=False)
        if not stream:
            r = client.chat.completions.create(**kw)
            calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        else:
            chunks = [ch for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
            calls = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
            finish = chunks[-1].choices[0].finish_reason
        assert finish == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
        assert set(json.loads(calls[0].function.arguments)) == {"city"} and len(calls[0].id) == 9


def test_thought_comes_apart(client):
    """A reply that thinks in [THINK] ... [/THINK] first: the thought is reasoning_content, the rest
    the content, whole and streamed."""
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "hi"}]
    kw = dict(model=model, messages=msgs, max_tokens=60, seed=4,
              extra_body={"grammar": 'root ::= "[THINK]" [a-z ]{3,12} "[/THINK]" "yes"'})
    r = client.chat.completions.create(**kw)
    thought = r.choices[0].message.model_extra["reasoning_content"]
    assert r.choices[0].message.content == "yes" and 3 <= len(thought) <= 12 and "[" not in thought
    chunks = [ch for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "yes"
    assert "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for ch in chunks) == thought
