"""llama-server's unversioned paths (/chat/completions, /models) on `infer serve`: the /v1 routes
under llama.cpp's names, behind the same API key and counted as the /v1 route; and its --host
with several addresses."""
from __future__ import annotations

import http.client
import socket

import pytest

from helpers.tiny_models import write_tiny_model
from infer.engine.config import EngineConfig
from infer.engine.llm import LLM

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from starlette.testclient import TestClient

    from infer.cli.server.openai_server import ServerConfig, create_app

    path = write_tiny_model(tmp_path_factory.mktemp("paths") / "tiny.gguf", "llama", seed=3, chat_template=TEMPLATE)
    llm = LLM.load(path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=2))
    with TestClient(create_app(llm, ServerConfig(model_id="tiny", api_key="k"))) as c:
        yield c


def test_unversioned_paths_are_the_v1_routes(client):
    key = {"Authorization": "Bearer k"}
    models = client.get("/models", headers=key)
    assert models.status_code == 200 and models.json() == client.get("/v1/models", headers=key).json()
    chat = client.post("/chat/completions", json=CHAT, headers=key)
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == \
        client.post("/v1/chat/completions", json=CHAT, headers=key).json()["choices"][0]["message"]["content"]
    metrics = client.get("/metrics").text
    assert 'route="/v1/chat/completions",status="200"} 2' in metrics  # counted as the /v1 route


def test_unversioned_paths_need_the_api_key(client):
    for method, path in (("GET", "/models"), ("POST", "/chat/completions")):
        r = client.request(method, path, json=CHAT if method == "POST" else None)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)


def test_host_takes_several_addresses(tmp_path):
    from helpers.server import Server

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", seed=3, chat_template=TEMPLATE)
    server = Server(path, tmp_path, "--host", "127.0.0.1,::1", "--threads", "1", "--ctx", "256", "--parallel", "1")
    try:
        for host in ("127.0.0.1", "::1"):
            conn = http.client.HTTPConnection(host, server.port, timeout=60)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200, host
            conn.close()
    finally:
        assert server.stop() == 0
