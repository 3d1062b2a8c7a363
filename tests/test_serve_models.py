"""`infer serve` without MODEL: every pulled model (and the default one) served by the name a
request gives, loaded on demand, kept while in use, unloaded after keep_alive or to make room
(cli/server/model_router.py, cli/server/model_pool.py); `infer ps`."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.fake_hub import FakeHub, FakeRepo
from helpers.server import Server, raw
from helpers.tiny_models import write_tiny_model
from infer.models.default import CHAT_MODEL, stamp_verified

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

DEFAULT = CHAT_MODEL.file.removesuffix(".gguf")  # the default chat model's name
TINY = "acme/tiny-GGUF:Q8_0"
BROKEN = "acme/broken-GGUF:Q4_K_M"


def ModelsServer(tmp_path, *args: str, env_extra: dict | None = None) -> Server:
    """A several-models server: no MODEL argument."""
    return Server(None, tmp_path, *args, env_extra=env_extra)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def hub(home):
    tiny = write_tiny_model(home / "tiny-Q8_0.gguf", "qwen2")
    broken = home / "broken-Q4_K_M.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)  # a header that lies about its counts
    with FakeHub({"acme/tiny-GGUF": FakeRepo({"tiny-Q8_0.gguf": tiny}),
                  "acme/broken-GGUF": FakeRepo({"broken-Q4_K_M.gguf": broken})}) as h:
        yield h


@pytest.fixture(scope="module")
def env(home, hub, chat_model_path):
    # the default chat model where the server's INFER_HOME keeps it, copied from this machine's
    # (fetched once), with the stamp that says it was checked
    target = home / "infer" / "models" / "default" / CHAT_MODEL.file
    target.parent.mkdir(parents=True)
    shutil.copyfile(chat_model_path, target)
    stamp_verified(target, CHAT_MODEL.sha256)
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home / "hf"), "INFER_HOME": str(home / "infer"),
            "HF_HUB_OFFLINE": "0"}


@pytest.fixture(scope="module")
def server_model():
    return None  # several models: no MODEL argument


@pytest.fixture(scope="module")
def server_args():
    return ("--threads", "2", "--ctx", "256", "--parallel", "2", "--max-models", "1")


@pytest.fixture(scope="module")
def server_env(env):
    return env


@pytest.fixture(scope="module")
def client(server):
    c = ollama.Client(host=f"http://127.0.0.1:{server.port}")
    for name in (TINY, BROKEN):  # through the router's /api/pull, as ollama clients pull
        assert c.pull(name).status == "success"
    return c


def loaded(client) -> list[str]:
    return [m.model for m in client.ps().models]


def wait_for(pred, timeout: float = 20) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def chat(client, model: str, **kw):
    return client.chat(model=model, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3}, **kw)


def test_every_pulled_model_is_listed(server, client):
    names = {m.model for m in client.list().models}
    assert {DEFAULT, TINY} <= names
    oa = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    assert {DEFAULT, TINY} <= {m.id for m in oa.models.list().data}
    status, headers, page = raw(server.port, "GET", "/", headers={"Accept": "text/html"})
    assert status == 200 and "<html" in page.lower() and "script-src 'self'" in headers["content-security-policy"]
    assert raw(server.port, "GET", "/")[2] == "Ollama is running"  # ollama's clients probe GET /
    shown = client.show(TINY)
    assert shown.details.family == "qwen2" and shown.modelinfo["qwen2.context_length"] == 256
    assert loaded(client) == []  # listing and showing load nothing


def test_loaded_on_first_use_and_swapped_at_max_models(server, client):
    assert chat(client, TINY).done
    assert loaded(client) == [TINY]
    oa = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    r = oa.chat.completions.create(model=DEFAULT, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].message.content is not None and r.model == DEFAULT
    assert loaded(client) == [DEFAULT]  # --max-models 1: the idle tiny model made room
    ps = subprocess.run([sys.executable, "-m", "infer.cli", "ps", "--port", str(server.port)],
                        capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0 and DEFAULT in ps.stdout and "minutes from now" in ps.stdout, ps.stdout + ps.stderr
    # the same model by another of its names: the bare repo of a single quant
    assert chat(client, "acme/tiny-GGUF").done and loaded(client) == [TINY]


def test_requests_wait_for_one_load(server, client):
    client.generate(model=TINY, prompt="", keep_alive=0)
    assert wait_for(lambda: loaded(client) == [])
    with ThreadPoolExecutor(4) as ex:
        replies = list(ex.map(lambda _: chat(client, TINY), range(4)))
    assert all(r.done for r in replies)
    assert loaded(client) == [TINY]


def test_keep_alive(server, client):
    r = client.generate(model=TINY, prompt="", keep_alive=0)  # ollama's unload: an empty prompt, keep_alive 0
    assert r.done_reason == "unload"
    assert wait_for(lambda: loaded(client) == [])
    chat(client, TINY, keep_alive="1s")
    assert loaded(client) == [TINY]
    assert wait_for(lambda: loaded(client) == [], timeout=10)  # idle for 1 s: unloaded
    chat(client, TINY, keep_alive=-1)
    (m,) = client.ps().models
    assert m.expires_at.year > time.gmtime().tm_year + 5  # kept
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, TINY, keep_alive="soon")
    assert e.value.status_code == 400 and "keep_alive" in e.value.error
    chat(client, TINY, keep_alive="5m")


def test_a_model_that_fails_to_load_leaves_the_others_serving(server, client):
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, BROKEN)
    assert e.value.status_code == 400 and "failed to load" in e.value.error
    status, _, err = raw(server.port, "POST", "/v1/chat/completions",
                         b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}]}' % BROKEN.encode())
    assert status == 400 and err["error"]["code"] == "model_load_failed"
    assert chat(client, TINY).done
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, "acme/never-pulled")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        chat(client, str(server.log.name))  # a path is never read from a request
    assert e.value.status_code == 404


def test_a_client_gone_while_its_model_loads(server, client):
    """A request that leaves while it waits for a load takes nothing with it: the load goes on for
    the requests still waiting, and no lease is left held (the model can still expire)."""
    client.generate(model=DEFAULT, prompt="", keep_alive=0)
    client.generate(model=TINY, prompt="", keep_alive=0)
    assert wait_for(lambda: loaded(client) == [])
    with ThreadPoolExecutor(1) as ex:
        staying = ex.submit(client.generate, model=DEFAULT, prompt="Hi", options={"num_predict": 2})
        time.sleep(0.2)  # its load has started
        body = b'{"model": "%s", "prompt": "Hi", "options": {"num_predict": 2}}' % DEFAULT.encode()
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert staying.result(timeout=120).done
    assert loaded(client) == [DEFAULT]
    assert wait_for(lambda: raw(server.port, "GET", "/health")[2]["running"] == 0)
    (m,) = client.ps().models
    assert m.expires_at.year <= time.gmtime().tm_year + 1  # idle: it has an expiry, no one holds it


def test_embeddings_and_tokenize_through_the_router(server, client):
    assert len(client.embed(model=TINY, input="Hi").embeddings[0]) == 256
    status, _, tok = raw(server.port, "POST", "/tokenize", b'{"content": "Hi"}')  # no model: the loaded one
    assert status == 200 and tok["tokens"]


@pytest.mark.e2e
def test_memory_budget(home, env):
    s = ModelsServer(home, "--threads", "2", "--ctx", "256", "--memory", "64M", "--api-key", "k", "--no-webui",
                     env_extra=env)
    try:
        assert raw(s.port, "GET", "/", headers={"Accept": "text/html"})[2] == "Ollama is running"  # --no-webui
        assert raw(s.port, "GET", "/api/ps")[0] == 401  # the API key guards every route of the router too
        assert raw(s.port, "POST", "/api/chat", b'{"model": "%s"}' % TINY.encode())[0] == 401
        c = ollama.Client(host=f"http://127.0.0.1:{s.port}", headers={"Authorization": "Bearer k"})
        with pytest.raises(ollama.ResponseError) as e:
            chat(c, DEFAULT)
        assert e.value.status_code == 400 and "--memory allows 64 MiB" in e.value.error
        assert chat(c, TINY).done  # a few MiB: fits
    finally:
        assert s.stop() == 0, s.output()
