"""OpenAI's Responses API on `infer serve` (cli/server/responses_api.py, responses_input.py) through
the official openai client's `client.responses`: text and item input, instructions, streaming
events (parsed by the client's stream helpers), max_output_tokens -> incomplete, function tools
(a forced call, its arguments streamed, its output sent back), previous_response_id within the
server's memory, errors in OpenAI's shape; then reasoning items from a tiny thinking model (a
grammar forces what it writes).  llama.cpp's own checks (tools/server/tests/unit/
test_compat_oai_responses.py) are in test_llama_cpp_checks."""
from __future__ import annotations

import http.client
import json
import re
import socket
import time

import pytest

from helpers.server import MODEL, Server, metrics, raw, wait_idle

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def server_args():
    return ("--ctx", "1024", "--threads", "2", "--parallel", "4")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=120)


def test_input_items_become_chat_messages():
    """The conversion itself (no server): an earlier turn's reasoning, text and calls join one
    assistant message, as llama.cpp's server-chat.cpp joins them; outputs are tool messages; a
    reasoning item without text is skipped; instructions go first, not into the conversation."""
    from infer.cli.server.responses_input import chat_request

    items = [{"role": "user", "content": "q"},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                                                   {"type": "refusal", "refusal": "b"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
             {"type": "function_call_output", "call_id": "c1", "output": "one"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": "zz"},
             {"role": "developer", "content": [{"type": "input_text", "text": "d"}]}]
    earlier = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "reply"}]
    req = chat_request({"input": items, "instructions": "sys", "max_output_tokens": 7, "text": {"format": {
        "type": "json_object"}}, "reasoning": {"effort": "minimal"}, "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"}}, earlier)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
             {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]
    assert req.conversation == [*earlier, {"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a\nb", "reasoning_content": "think", "tool_calls": calls},
                                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                                {"role": "tool", "tool_call_id": "c2", "content": "two"},
                                {"role": "developer", "content": "d"}]
    f = req.fields
    assert f["messages"] == [{"role": "system", "content": "sys"}, *req.conversation]
    assert (f["max_tokens"], f["response_format"], f["reasoning_effort"]) == (7, {"type": "json_object"}, "low")
    assert f["tools"] == [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description",
                                                                                     "parameters")}}]
    assert f["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}} and not req.no_thinking
    assert chat_request({"input": "x", "reasoning": {"effort": "none"}}, []).no_thinking
    # OpenAI's built-in tools (Codex CLI sends them beside its functions) are left out, as llama-server does
    builtin = chat_request({"input": "x", "tools": [{"type": "web_search"}, WEATHER, {"type": "custom", "name": "p"}]}, [])
    assert builtin.fields["tools"] == f["tools"]


def post(server, body: dict):
    return raw(server.port, "POST", "/v1/responses", json.dumps(body).encode())


def test_text_input_matches_the_chat_route(client):
    """A string input is one user message: the same prompt and the same greedy reply as the chat route."""
    r = client.responses.create(model=MODEL, input="Name three colours.", max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name three colours."}],
                                          max_tokens=12, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert [o.type for o in r.output] == ["message"] and r.output[0].id.startswith("msg_")
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.temperature == 0 and r.max_output_tokens == 12 and r.tools == [] and r.tool_choice == "auto"


def test_items_and_instructions(client):
    """Message items (string content or input_text parts, system and developer roles) and
    instructions (a system message first) reach the template: the prompt grows by their tokens
    and the reply is the chat route's for the same messages."""
    base = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}], max_output_tokens=4,
                                   temperature=0)
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    r = client.responses.create(model=MODEL, input=items, instructions="Be brief.", max_output_tokens=8, temperature=0,
                                metadata={"run": "t1"})
    chat = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert r.output_text == chat.choices[0].message.content and r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.input_tokens > base.usage.input_tokens + 2
    developer = client.responses.create(model=MODEL, input=[{"role": "developer", "content": "Be brief."}, *items],
                                        max_output_tokens=8, temperature=0)  # developer is a system message
    assert (developer.output_text, developer.usage.input_tokens) == (r.output_text, r.usage.input_tokens)
    assert r.instructions == "Be brief." and r.metadata == {"run": "t1"}
    # an earlier assistant turn as an output message item
    turn = [{"role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there!"}]},
            {"role": "user", "content": "Again"}]
    r2 = client.responses.create(model=MODEL, input=turn, max_output_tokens=4, temperature=0)
    chat2 = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there!"},
        {"role": "user", "content": "Again"}])
    assert r2.usage.input_tokens == chat2.usage.prompt_tokens and r2.output_text == chat2.choices[0].message.content


def test_streaming(client):
    """The event sequence (created, in_progress, the message's item and part, text deltas, their
    done events, completed), numbered in order; the deltas add up to the final text, which is the
    reply unstreamed; the client's stream helper reads the same response."""
    kw = dict(model=MODEL, input="Name three colours.", max_output_tokens=40, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    end = "response.incomplete" if whole.status == "incomplete" else "response.completed"
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", end]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    rid, mid = events[0].response.id, events[2].item.id
    assert rid.startswith("resp_") and mid.startswith("msg_") and events[-1].response.id == rid
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(e.item_id == mid and e.output_index == 0 and e.content_index == 0 for e in deltas)
    text = "".join(e.delta for e in deltas)
    assert text == whole.output_text == events[-4].text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    with client.responses.stream(**kw) as s:  # the client's helper reads the same events
        assert [e.type for e in s] == types


def test_max_output_tokens_incomplete(client, server):
    r = client.responses.create(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5,
                                temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete" and r.output_text
    events = list(client.responses.create(model=MODEL, input="Write a long story about a dragon.",
                                          max_output_tokens=5, temperature=0, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-1].response.output_text == r.output_text
    # past the context: a 400 that names the Responses field
    status, _, err = post(server, {"model": MODEL, "input": "Hi", "max_output_tokens": 5000})
    assert status == 400 and err["error"]["param"] == "max_output_tokens", err


def test_function_call_round_trip(client):
    """tool_choice forcing the function: a parsed function_call item (and, streamed, its arguments in
    a delta); its output sent back with the call continues the conversation."""
    q = "What is the weather in Paris?"
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = client.responses.create(model=MODEL, input=q, tools=[WEATHER], tool_choice=choice, max_output_tokens=80,
                                    parallel_tool_calls=False, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and len(calls) == 1 and not r.output_text
        call = calls[0]
        assert call.id.startswith("fc_") and call.call_id and call.name == "get_weather" and call.status == "completed"
        assert set(json.loads(call.arguments)) == {"city"}
    events = list(client.responses.create(model=MODEL, input=q, tools=[WEATHER], tool_choice="required",
                                          max_output_tokens=80, parallel_tool_calls=False, temperature=0, stream=True))
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(added) == 1 and added[0].item.name == "get_weather" and added[0].item.arguments == ""
    assert "".join(d.delta for d in deltas) == done[0].arguments == call.arguments
    assert all(d.item_id == added[0].item.id for d in deltas + done)
    assert events[-1].type == "response.completed" and events[-1].response.output[0].arguments == call.arguments
    with client.responses.stream(model=MODEL, input=q, tools=[WEATHER], tool_choice="required", max_output_tokens=80,
                                 parallel_tool_calls=False, temperature=0) as s:
        final = s.get_final_response()  # the helper's own reading of the events (response.completed)
    assert [(o.type, o.name, o.arguments) for o in final.output] == [("function_call", call.name, call.arguments)]
    # the call and its output back: a reply (text or another call), on a longer prompt than the question's
    items = [{"role": "user", "content": q},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 25 C"}]
    r2 = client.responses.create(model=MODEL, input=items, tools=[WEATHER], max_output_tokens=40, temperature=0)
    assert r2.output and r2.usage.input_tokens > r.usage.input_tokens
    chat = client.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, messages=[
        {"role": "user", "content": q},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 25 C"}],
        tools=[{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}])
    assert r2.usage.input_tokens == chat.usage.prompt_tokens
    # the agents' loop: only the call's output, after the response that made the call
    r3 = client.responses.create(model=MODEL, input=items[2:], previous_response_id=r.id, tools=[WEATHER],
                                 max_output_tokens=40, temperature=0)
    assert (r3.usage.input_tokens, r3.output_text) == (r2.usage.input_tokens, r2.output_text)


def test_previous_response_id(client, server):
    """previous_response_id puts the earlier turn (its input and reply) before the new input: the
    prompt is the chat route's for the whole conversation; the instructions are not carried over
    (OpenAI's rule); a response not stored, deleted or unknown is OpenAI's 400; GET returns one."""
    first = client.responses.create(model=MODEL, input="My name is Ada.", instructions="Be brief.",
                                    max_output_tokens=8, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens and second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    third = client.responses.create(model=MODEL, input="And again?", previous_response_id=second.id,
                                    max_output_tokens=4, temperature=0)
    assert third.usage.input_tokens > second.usage.input_tokens + 10  # both earlier turns
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.status == first.status
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_nope")
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    loose = client.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="Hi", previous_response_id=loose.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(loose.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    status, _, err = raw(server.port, "DELETE", f"/v1/responses/{first.id}")
    assert status == 404 and err["error"]["message"].startswith("Response with id")


def test_disconnect_frees_blocks(server):
    """A streamed or a whole response whose client hangs up is cancelled at once (its KV blocks freed)."""
    body = {"model": MODEL, "input": "Write a long story about a dragon.", "max_output_tokens": 800, "temperature": 0}
    for stream in (True, False):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/responses", json.dumps({**body, "stream": stream}))
        if stream:
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
            lines = [resp.readline() for _ in range(15)]  # event, data, blank: five events
            assert lines[0] == b"event: response.created\n" and lines[1].startswith(b"data: {")
        else:
            deadline = time.time() + 10
            while metrics(server.port)["infer_kv_blocks_used"] == 0 and time.time() < deadline:
                time.sleep(0.02)
        assert metrics(server.port)["infer_requests_running"] == 1
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        t0 = time.time()
        after = wait_idle(server.port, timeout=5)
        assert after["infer_kv_blocks_used"] == 0 and time.time() - t0 < 3  # 800 tokens would take far longer


BAD = {
    "no input": ({}, "input"),
    "input a number": ({"input": 3}, "input"),
    "an image part": ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                      "input[0].content[0]"),
    "an unknown item": ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    "a bad role": ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    "a call without arguments": ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
                                 "input[0].arguments"),
    "a tool without a type": ({"input": "Hi", "tools": [{"name": "f"}]}, "tools[0]"),
    "a tool without a name": ({"input": "Hi", "tools": [{"type": "function"}]}, "tools"),
    "tool_choice of a missing tool": ({"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function",
                                                                                          "name": "other"}}, "tool_choice"),
    "tool_choice allowed_tools": ({"input": "Hi", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    "max_output_tokens 0": ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    "a bad effort": ({"input": "Hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    "a bad format": ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
    "a bad schema": ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": 5}}},
                     "text.format"),
    "background": ({"input": "Hi", "background": True}, "background"),
    "store not a boolean": ({"input": "Hi", "store": "yes"}, "store"),
    "bad metadata": ({"input": "Hi", "metadata": {"k": 1}}, "metadata"),
    # any model name is the one model served (as llama-server), but a name must be a string
    "a model not a string": ({"input": "Hi", "model": 42}, "model"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_requests_are_openai_errors(server, case):
    body, param = BAD[case]
    status, _, err = post(server, {"model": MODEL, **body})
    assert status in (400, 404), err
    assert err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error", err


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Pick a colour.", max_output_tokens=30, temperature=0,
                                text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
    assert json.loads(r.output_text)["colour"] in ("red", "green", "blue")
    assert r.text.format.type == "json_schema" and r.status == "completed"
    with client.responses.stream(model=MODEL, input="Pick a colour.", max_output_tokens=30, temperature=0, text={
            "format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}}) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == r.output_text


def test_llama_cpp_checks(client):
    """What llama.cpp's test_compat_oai_responses.py checks of its server, on this one: ids, the
    message item first, and the streamed events' item ids and text."""
    items = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    res = client.responses.create(model="gemma-3-270m-q4_k_m", input=items, max_output_tokens=8, temperature=0.8)
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_") and res.output_text
    gathered, resp_id, msg_id = "", "", ""
    for r in client.responses.create(model=MODEL, input=items, max_output_tokens=8, temperature=0.8, stream=True):
        if r.type == "response.created":
            resp_id = r.response.id
            assert resp_id.startswith("resp_")
        if r.type == "response.in_progress":
            assert r.response.id == resp_id
        if r.type == "response.output_item.added":
            msg_id = r.item.id
            assert msg_id.startswith("msg_")
        if r.type in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                      "response.content_part.done"):
            assert r.item_id == msg_id
        if r.type == "response.output_item.done":
            assert r.item.id == msg_id
        if r.type == "response.output_text.delta":
            gathered += r.delta
        if r.type in ("response.completed", "response.incomplete"):
            assert r.response.output[0].id == msg_id and gathered == r.response.output_text and gathered


# ---------------------------------------------------------------- a thinking model: reasoning items

THINKING = """{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is not defined or enable_thinking %}<think>
{% endif %}{% endif %}"""
THOUGHT = 'root ::= [a-z ]{3,12} "</think>" "\\n\\n" "yes"'  # what the reply must be when it starts thinking


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-responses")
    path = write_tiny_model(d / "tiny-qwen2.gguf", "qwen2", seed=5, chat_template=THINKING, n_ctx=1024)
    s = Server(path, d, "--ctx", "1024", "--threads", "2", "--parallel", "2")
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x", max_retries=0, timeout=120)
    assert s.stop() == 0, s.output()


@pytest.mark.e2e
def test_reasoning_items(thinking):
    """The template opens <think>: the thought comes back as a reasoning item before the message,
    streamed as reasoning_text deltas; reasoning.effort "none" turns thinking off (the template
    closes no thought: the whole reply is the message); a reasoning item sent back is the turn's
    reasoning_content."""
    c = thinking
    model = c.models.list().data[0].id
    kw = dict(model=model, input="hi", max_output_tokens=60, extra_body={"seed": 4, "grammar": THOUGHT})
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "yes"
    thought = r.output[0].content[0].text
    assert re.fullmatch(r"[a-z ]{3,12}", thought) and r.output[0].content[0].type == "reasoning_text"
    assert r.output[0].id.startswith("rs_") and 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(c.responses.create(**kw, stream=True))
    said = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert said == thought == done[0].text and events[-1].response.output_text == "yes"
    assert [e.item.type for e in events if e.type == "response.output_item.added"] == ["reasoning", "message"]
    off = c.responses.create(model=model, input="hi", max_output_tokens=10, reasoning={"effort": "none"},
                             extra_body={"seed": 4, "grammar": 'root ::= "yes"'})
    assert [o.type for o in off.output] == ["message"] and off.output_text == "yes"
    # continuing after the reasoning turn: its thought and text go back to the template
    again = c.responses.create(model=model, input="and?", previous_response_id=r.id, max_output_tokens=60,
                               extra_body={"seed": 4, "grammar": THOUGHT})
    assert again.output_text == "yes" and again.usage.input_tokens > r.usage.input_tokens


@pytest.mark.e2e
def test_several_models_server(tmp_path):
    """Without MODEL (model_router.py): the request goes to the model it names, previous_response_id
    continues there, and GET / DELETE /v1/responses/{id} find the response among the loaded models."""
    pytest.importorskip("schemathesis")  # helpers.api_fuzz's import; its serve() stands a tiny model in
    from helpers.api_fuzz import serve

    server, name = serve(tmp_path, several=True)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=120)
        first = c.responses.create(model=name, input="Hi", max_output_tokens=3, temperature=0)
        second = c.responses.create(model=name, input="Again", previous_response_id=first.id, max_output_tokens=3,
                                    temperature=0)
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        assert c.responses.retrieve(first.id).output_text == first.output_text
        c.responses.delete(first.id)
        for rid in (first.id, "resp_unknown"):
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(rid)
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model=name, input="Hi", previous_response_id=first.id)
    finally:
        assert server.stop() == 0, server.output()
