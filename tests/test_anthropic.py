"""Anthropic's Messages API on `infer serve` (cli/server/anthropic_api.py, anthropic_request.py),
driven by the official `anthropic` Python client against a live server on the embedded model:
text whole and streamed (Anthropic's event sequence), a system prompt, several turns,
stop_sequences and max_tokens as stop reasons, a forced tool call as a tool_use block (streamed:
input_json_delta) and its tool_result, count_tokens, Anthropic's error envelope; thinking on and
off through a tiny random Qwen3.5 whose template opens <think>.  Without a server: the request's
conversion, the stream's block sequence, and the envelope from the router and the front door."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers.server import MODEL, Server
from infer.cli.server import anthropic_request
from infer.cli.server.anthropic_api import Blocks
from infer.cli.server.openai_request import APIError
from infer.engine.tool_calls import ToolCall

anthropic = pytest.importorskip("anthropic")

KEY = "sk-anthropic-test"
HELLO = [{"role": "user", "content": "Name three colours."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}
GREEDY = {"temperature": 0}  # the client has no temperature argument any more: an extra field
FORCED = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def server_args():
    return ("--api-key", KEY, "--ctx", "1024", "--threads", "2", "--parallel", "2")


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key=KEY, max_retries=0, timeout=120)


def events_of(client, **kw) -> list:
    return list(client.messages.create(stream=True, **kw))


def test_text_whole_and_streamed(client):
    kw = dict(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=HELLO)
    r = client.messages.create(**kw)
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 0 < r.usage.output_tokens <= 12 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 0
    events = events_of(client, **kw)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.content == [] and events[0].message.usage.input_tokens > 0
    assert events[1].index == 0 and events[1].content_block.type == "text"
    assert all(e.index == 0 and e.delta.type == "text_delta" for e in events[2:-3])
    assert "".join(e.delta.text for e in events[2:-3]) == r.content[0].text  # greedy: the same tokens
    assert events[-2].delta.stop_reason == r.stop_reason and events[-2].usage.output_tokens == r.usage.output_tokens
    with client.messages.stream(**kw) as s:  # the client's own accumulation of the events
        assert s.get_final_message().content[0].text == r.content[0].text


def test_system_prompt_and_turns(client):
    base = client.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens
    system = client.messages.count_tokens(model=MODEL, messages=HELLO, system="Answer in French.").input_tokens
    blocks = client.messages.count_tokens(model=MODEL, messages=HELLO, system=[
        {"type": "text", "text": "Answer"}, {"type": "text", "text": "in French."}]).input_tokens
    assert system > base and blocks >= system
    turns = [*HELLO, {"role": "assistant", "content": "Red, green, blue."},
             {"role": "user", "content": [{"type": "text", "text": "Two more?"}]}]
    r = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, system="Be brief.", messages=turns)
    assert r.content[0].type == "text" and r.usage.input_tokens + r.usage.cache_read_input_tokens == \
        client.messages.count_tokens(model=MODEL, messages=turns, system="Be brief.").input_tokens > system


def test_count_tokens_is_the_prompt(client):
    for kw in (dict(messages=HELLO), dict(messages=HELLO, system="Be brief.", tools=[WEATHER])):
        n = client.messages.count_tokens(model=MODEL, **kw).input_tokens
        r = client.messages.create(model=MODEL, max_tokens=1, **kw)
        assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens  # the prompt the generation ran on
    assert client.messages.count_tokens(model=MODEL, messages=HELLO, tools=[WEATHER]).input_tokens > \
        client.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens  # the tools are in the prompt


def test_stop_reasons(client):
    kw = dict(model=MODEL, extra_body=GREEDY, messages=HELLO)
    whole = client.messages.create(max_tokens=24, **kw).content[0].text
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    # max_tokens past the context (1024) ends there rather than a 400, as llama-server's
    r = client.messages.create(max_tokens=32000, stop_sequences=["@@never@@", stop], **kw)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == whole[:whole.index(stop)]
    end = events_of(client, max_tokens=24, stop_sequences=[stop], **kw)[-2]
    assert end.delta.stop_reason == "stop_sequence" and end.delta.stop_sequence == stop
    r = client.messages.create(max_tokens=3, **kw)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3 and r.stop_sequence is None


def test_forced_tool_use_and_its_result(client):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=MODEL, max_tokens=80, extra_body=GREEDY, messages=msgs, tools=[WEATHER], tool_choice=FORCED)
    r = client.messages.create(**kw)
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
    use = r.content[0]
    assert use.name == "get_weather" and use.id.startswith("toolu_") and set(use.input) == {"city"}
    events = events_of(client, **kw)
    starts = [e for e in events if e.type == "content_block_start"]
    assert len(starts) == 1 and starts[0].content_block.type == "tool_use" and starts[0].content_block.name == "get_weather"
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert all(e.delta.type == "input_json_delta" for e in events if e.type == "content_block_delta")
    assert json.loads("".join(parts)) == use.input and events[-2].delta.stop_reason == "tool_use"
    with client.messages.stream(**kw) as s:
        assert s.get_final_message().content[0].input == use.input
    for result in ("Sunny, 25 C", [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "25 C"}]):
        turns = [*msgs, {"role": "assistant", "content": [use.model_dump()]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
        after = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=turns, tools=[WEATHER])
        assert after.type == "message" and after.content
    failed = [*msgs, {"role": "assistant", "content": [use.model_dump()]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "no such city", "is_error": True}]}]
    fine = [*failed[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "no such city"}]}]
    assert client.messages.count_tokens(model=MODEL, messages=failed).input_tokens > \
        client.messages.count_tokens(model=MODEL, messages=fine).input_tokens  # the model is told it failed


def test_errors_in_anthropics_envelope(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": HELLO})  # no max_tokens
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in e.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="image input is not supported"):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="context"):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "colour " * 1100}])
    stranger = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        stranger.messages.create(model=MODEL, max_tokens=4, messages=HELLO)
    assert e.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", auth_token=KEY, max_retries=0)
    assert bearer.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 0  # Authorization: Bearer too


# ---------------------------------------------------------------- thinking: a model whose template opens <think>


@pytest.fixture(scope="module")
def thinking_client(tmp_path_factory):
    from helpers.qwen35_template import FIXTURE
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("anthropic-qwen35")
    path = write_tiny_model(d / "tiny-qwen35.gguf", "qwen35", seed=7, chat_template=FIXTURE, n_ctx=1024)
    s = Server(path, d, "--ctx", "1024", "--threads", "2")
    try:
        yield anthropic.Anthropic(base_url=f"http://127.0.0.1:{s.port}", api_key="x", max_retries=0, timeout=300)
    finally:
        assert s.stop() == 0 and "Traceback" not in s.output(), s.output()


@pytest.mark.e2e
def test_thinking_on_and_off(thinking_client):
    """A random model never closes the thought the template opens: with thinking on the whole reply
    is a thinking block (streamed: thinking_delta, then signature_delta before its stop); off, the
    template closes an empty thought in the prompt (more tokens) and the reply is text."""
    c = thinking_client
    msgs = [{"role": "user", "content": "hi"}]
    on = c.messages.create(model="tiny-qwen35", max_tokens=6, extra_body=GREEDY, messages=msgs,
                           thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in on.content] == ["thinking"] and on.content[0].thinking and on.content[0].signature == ""
    assert on.stop_reason == "max_tokens"
    events = list(c.messages.create(model="tiny-qwen35", max_tokens=6, extra_body=GREEDY, messages=msgs, stream=True,
                                    thinking={"type": "enabled", "budget_tokens": 1024}))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert events[1].type == "content_block_start" and events[1].content_block.type == "thinking"
    assert [e.type for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert [d.type for d in deltas][-1] == "signature_delta" and events[-4].delta.type == "signature_delta"
    assert "".join(d.thinking for d in deltas[:-1]) == on.content[0].thinking
    off = c.messages.create(model="tiny-qwen35", max_tokens=6, extra_body=GREEDY, messages=msgs,
                            thinking={"type": "disabled"})
    assert "thinking" not in [b.type for b in off.content]
    assert off.usage.input_tokens + off.usage.cache_read_input_tokens > on.usage.input_tokens + \
        on.usage.cache_read_input_tokens
    assert c.messages.count_tokens(model="tiny-qwen35", messages=msgs, thinking={"type": "disabled"}).input_tokens == \
        off.usage.input_tokens + off.usage.cache_read_input_tokens


# ---------------------------------------------------------------- without a server


def test_the_request_becomes_openai_messages():
    body = {"model": "m", "system": [{"type": "text", "text": "Be brief."}], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "down"}]},
                                     {"type": "text", "text": "Try again?"}]}],
        "tools": [WEATHER], "tool_choice": FORCED, "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"}}
    req = anthropic_request.conversation(body)
    assert req.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "Error: down", "tool_call_id": "toolu_1"},  # the results first: they answer the calls
        {"role": "user", "content": "Try again?"}]
    assert req.fields == {"tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER["input_schema"]}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False}
    assert req.think is False and req.model == "m"
    assert anthropic_request.conversation({**body, "tool_choice": {"type": "any"}, "thinking": None}).fields[
        "tool_choice"] == "required"
    job = anthropic_request.job({"max_tokens": 7, "temperature": 0.5, "top_k": 3, "stop_sequences": ["END"]})
    assert job.max_tokens == 7 and job.params.stop == ("END",) and job.params.top_k == 3 and not job.stream
    stamped = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code."
    assert anthropic_request.system_text(stamped) == "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude Code."


BAD = {
    "no model": ({"messages": HELLO}, "model"),
    "empty messages": ({"model": "m", "messages": []}, "messages"),
    "a system role": ({"model": "m", "messages": [{"role": "system", "content": "x"}]}, "role"),
    "an image": ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
                 "image input is not supported"),
    "an image in a result": ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]}, "image"),
    "tool_use in a user turn": ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "tool_result"),
    "a server tool": ({"model": "m", "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "s"}]},
                      "custom tools"),
    "a tool without its schema": ({"model": "m", "messages": HELLO, "tools": [{"name": "f"}]}, "input_schema"),
    "tool_choice tool without a name": ({"model": "m", "messages": HELLO, "tools": [WEATHER],
                                         "tool_choice": {"type": "tool"}}, "name"),
    "tool_choice without tools": ({"model": "m", "messages": HELLO, "tool_choice": {"type": "any"}}, "tools"),
    "a bad thinking": ({"model": "m", "messages": HELLO, "thinking": {"type": "enabled"}}, "budget_tokens"),
    "is_error not a boolean": ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]}, "is_error"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_requests_are_a_400(case):
    body, says = BAD[case]
    with pytest.raises(APIError) as e:
        anthropic_request.conversation(body)
    assert e.value.status == 400 and says in e.value.message


def test_bad_generation_fields_are_a_400():
    for body, says in (({}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 4, "stop_sequences": [""]},
                                                                                "stop_sequences"),
                       ({"max_tokens": 4, "temperature": -1}, "temperature"), ({"max_tokens": 4, "stream": "yes"}, "stream")):
        with pytest.raises(APIError) as e:
            anthropic_request.job(body)
        assert e.value.status == 400 and says in e.value.message


def test_a_stream_of_blocks():
    """Thinking, then text, then tool calls: each block closed before the next starts, at rising
    indices, the thinking block with its signature_delta last."""
    b = Blocks()
    out = [*b.add("hm", ""), *b.add(" ok", "Hi"), *b.add("", "!"), *b.call(ToolCall("f", '{"a": 1}', "call_x")), *b.close()]
    seq = [(name, data["index"], (data.get("delta") or data.get("content_block"))["type"]) if name != "content_block_stop"
           else (name, data["index"]) for name, data in out]
    assert seq == [("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
                   ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
                   ("content_block_stop", 0), ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
                   ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1),
                   ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
                   ("content_block_stop", 2)]
    assert out[-3][1]["content_block"] == {"type": "tool_use", "id": "toolu_x", "name": "f", "input": {}}
    assert json.loads(out[-2][1]["delta"]["partial_json"]) == {"a": 1}


def test_router_and_front_door_answer_in_the_envelope(tmp_path):
    """A model the several-models router does not have is Anthropic's not_found_error; a wrong key at
    the front door an authentication_error; X-Api-Key is a key as Bearer is."""
    from starlette.testclient import TestClient

    from helpers.tiny_models import write_tiny_model
    from infer.cli.server.model_pool import ModelPool
    from infer.cli.server.model_router import Catalog, ModelRouter
    from infer.cli.server.openai_server import FrontDoor, ServerConfig, create_app
    from infer.cli.server.server_metrics import Metrics

    tiny = write_tiny_model(tmp_path / "tiny.gguf", "qwen2")
    router = ModelRouter(ModelPool(lambda name, p: None, lambda p: 0), Catalog(tiny), Metrics(), max_body=2**20, n_ctx=256)
    app = FrontDoor(router, "k", Metrics())
    with TestClient(app) as c:
        r = c.post("/v1/messages", json={"model": "no-such-model", "max_tokens": 4, "messages": HELLO},
                   headers={"x-api-key": "k"})
        assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
        r = c.post("/v1/messages/count_tokens", json={"model": "x", "messages": HELLO}, headers={"x-api-key": "no"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    llm = SimpleNamespace(engine=None, tokenizer=None, model=SimpleNamespace(path=tiny))
    c = TestClient(create_app(llm, ServerConfig(model_id="tiny", api_key="k")))  # no lifespan: no engine to start
    for headers in ({"x-api-key": "k"}, {"authorization": "Bearer k"}):
        r = c.post("/v1/messages", json={"model": "tiny", "messages": HELLO}, headers=headers)  # past the key
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.json()
    r = c.get("/v1/messages", headers={"x-api-key": "k"})
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = c.post("/v1/chat/completions", json={}, headers={"x-api-key": "no"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape there
