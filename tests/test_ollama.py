"""ollama's native API on `infer serve` (cli/server/ollama_api.py), driven by the official ollama Python
client as a real client: chat, generate, streaming, format, list, show, ps, version, pull against
the local fake Hub, delete, and ollama-shaped errors."""
from __future__ import annotations

import json

import pytest

from helpers.fake_hub import FakeHub, FakeRepo
from helpers.server import raw

ollama = pytest.importorskip("ollama")

KEY = "sk-ollama-test"
MODEL = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def hub(gemma_path):
    with FakeHub({"acme/gemma-GGUF": FakeRepo({"gemma-3-270m-it-Q4_K_M.gguf": gemma_path})}) as h:
        yield h


@pytest.fixture(scope="module")
def server_args():
    return ("--api-key", KEY, "--parallel", "4", "--ctx", "1024", "--threads", "2")


@pytest.fixture(scope="module")
def server_env(hub, tmp_path_factory):
    d = tmp_path_factory.mktemp("ollama")
    # pulls go to the fake Hub, into this test's own HF cache and store
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(d / "hf"), "INFER_HOME": str(d / "infer"), "HF_HUB_OFFLINE": "0"}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=f"http://127.0.0.1:{server.port}", headers={"Authorization": f"Bearer {KEY}"})


HELLO = [{"role": "user", "content": "Name three colours."}]


def test_chat_streamed_and_not(client):
    r = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 12})
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant" and r.message.content
    assert 0 < r.eval_count <= 12 and r.prompt_eval_count > 0
    for f in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(getattr(r, f), int) and getattr(r, f) > 0
    parts = list(client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 12}, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == r.eval_count
    assert "".join(p.message.content for p in parts) == r.message.content


def test_generate(client):
    r = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                        options={"temperature": 0, "num_predict": 6, "seed": 3})
    assert r.done and r.response and len(r.context) > 6
    parts = list(client.generate(model=MODEL, prompt="The capital of France is", raw=True, stream=True,
                                 options={"temperature": 0, "num_predict": 6}))
    assert "".join(p.response for p in parts) == r.response
    r = client.generate(model=MODEL, prompt="Say hi.", system="You answer in one word.",
                        options={"temperature": 0, "num_predict": 4, "stop": ["\n"]})
    assert r.done and r.eval_count <= 4
    assert client.generate(model=MODEL, prompt="").done_reason == "load"  # ollama's way to load a model


def test_format_json_and_schema(client):
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "A cat as JSON."}], format="json",
                    options={"temperature": 0, "num_predict": 200})
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}}, "required": ["colour"]}
    r = client.chat(model=MODEL, messages=HELLO, format=schema, options={"seed": 1, "num_predict": 60})
    assert json.loads(r.message.content)["colour"] in ("red", "green")


def test_tools_through_api_chat(client):
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool],
                    options={"seed": 2, "num_predict": 80})
    if r.message.tool_calls:  # the generic format holds the reply to a call or an answer
        call = r.message.tool_calls[0].function
        assert call.name == "get_weather" and set(call.arguments) == {"city"}
    else:
        assert r.message.content


def test_models_list_show_ps_version(client, server):
    names = [m.model for m in client.list().models]
    assert names == [MODEL]
    m = client.list().models[0]
    assert m.size > 100_000_000 and m.details.format == "gguf" and m.details.family == "gemma3"
    info = client.show(MODEL)
    assert "completion" in info.capabilities and info.details.quantization_level
    ps = client.ps().models
    assert ps[0].model == MODEL and ps[0].size >= m.size and ps[0].expires_at
    status, _, body = raw(server.port, "GET", "/api/version", None, {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and body["version"]
    status, _, text = raw(server.port, "GET", "/")
    assert status == 200 and text == "Ollama is running"
    assert raw(server.port, "HEAD", "/")[0] == 200


def test_errors_are_ollama_shaped(client, server):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama9:70b", messages=HELLO)
    assert e.value.status_code == 404 and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=HELLO, options={"temperature": -1})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=HELLO, format={"type": "nonsense"})
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=f"http://127.0.0.1:{server.port}").list()  # no key
    assert e.value.status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    for path, body in [("/api/chat", b"{not json"), ("/api/chat", b"[1]"),
                       ("/api/generate", json.dumps({"model": MODEL, "prompt": 5}).encode()),
                       ("/api/chat", json.dumps({"model": MODEL, "messages": "hi"}).encode()),
                       ("/api/generate", json.dumps({"model": MODEL, "prompt": "x", "options": []}).encode()),
                       ("/api/chat", json.dumps({"model": MODEL, "messages": 5}).encode()),
                       ("/api/chat", json.dumps({"model": MODEL, "messages": {}}).encode()),
                       ("/api/chat", json.dumps({"model": "~nosuchuser/x", "messages": HELLO}).encode()),
                       ("/api/chat", b'{"model": "' + MODEL.encode() + b'", "messages": [], "options": {"seed": '
                        + b"9" * 400 + b"}}"),
                       ("/api/chat", json.dumps({"model": MODEL, "messages": HELLO, "options": {"top_k": 40.0}}).encode()),
                       ("/api/generate", json.dumps({"model": MODEL, "prompt": "x", "raw": "yes"}).encode()),
                       ("/api/generate", json.dumps({"model": MODEL, "prompt": "x", "suffix": "y"}).encode()),
                       ("/api/pull", json.dumps({"model": "a/b", "stream": "no"}).encode()),
                       ("/api/nothing", b"{}")]:
        status, _, resp = raw(server.port, "POST", path, body, auth)
        assert 400 <= status < 500 and set(resp) == {"error"} and isinstance(resp["error"], str), (path, resp)
    assert client.chat(model=MODEL, messages=HELLO, options={"num_predict": 2}).done  # still serving
    # Continue asks num_predict 4096 of a 1024-token context: ollama stops at the end, no error
    r = client.chat(model=MODEL, messages=HELLO, format={"enum": ["red", "blue"]}, options={"num_predict": 4096})
    assert r.done and json.loads(r.message.content) in ("red", "blue")


def test_pull_and_delete(client, server):
    events = list(client.pull("acme/gemma-GGUF:Q4_K_M", stream=True))
    assert events[-1].status == "success" and any(e.completed for e in events if e.completed)
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("acme/missing-GGUF")
    assert e.value.status_code == 400
    client.delete("acme/gemma-GGUF:Q4_K_M")
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("acme/gemma-GGUF:Q4_K_M")
    assert e.value.status_code == 404
