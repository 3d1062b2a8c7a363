"""The OpenAPI document of `infer serve` (cli/server/openapi.py, GET /openapi.json): a valid document,
naming exactly the routes both apps have (so the two cannot drift apart), served without the API
key, and true enough to fuzz from: schemathesis sends requests that fit it and requests that break
it to a real server over HTTP (tests/helpers/api_fuzz.py), one-model and several-models, and every one
must get a 2xx or a documented 4xx in its route's error shape (or a documented 501: llama-server's
answer to what it was not started to do), never another 5xx, a dropped connection or a hang;
afterwards the server still answers.  A bounded budget here; scripts/fuzz_api.py runs thousands of
requests per operation."""
from __future__ import annotations

import json
from importlib.metadata import version
from types import SimpleNamespace

import pytest

schemathesis = pytest.importorskip("schemathesis")

from starlette.testclient import TestClient  # noqa: E402

from helpers import api_fuzz  # noqa: E402
from helpers.server import raw  # noqa: E402
from helpers.tiny_models import write_tiny_model  # noqa: E402
from infer.cli.server.model_pool import ModelPool  # noqa: E402
from infer.cli.server.model_router import MODEL_ROUTES, Catalog, ModelRouter  # noqa: E402
from infer.cli.server.ollama_api import OPTIONS  # noqa: E402
from infer.cli.server.openai_request import CHAT_ROLES  # noqa: E402
from infer.cli.server.openai_server import FrontDoor, ServerConfig, create_app  # noqa: E402
from infer.cli.server.openapi import document  # noqa: E402
from infer.cli.server.rerank_api import ROUTES as RERANK_ROUTES  # noqa: E402
from infer.cli.server.server_metrics import Metrics  # noqa: E402

EXAMPLES = 50  # requests per operation and kind (fitting the document, breaking it): about 35 s per server


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("openapi") / "tiny.gguf", "qwen2")


def one_model_app(path, api_key: str | None = None):
    """create_app as `infer serve MODEL` builds it; the routes need no loaded engine to be listed."""
    llm = SimpleNamespace(engine=None, tokenizer=None, model=SimpleNamespace(path=path))
    return create_app(llm, ServerConfig(model_id=path.stem, api_key=api_key))


def router(path) -> ModelRouter:
    pool = ModelPool(lambda name, p: None, lambda p: 0)
    return ModelRouter(pool, Catalog(path), Metrics(), max_body=2**20, n_ctx=256)


def documented() -> set[tuple[str, str]]:
    return {(path, method.upper()) for path, ops in document()["paths"].items() for method in ops}


def without_head(routes: set[tuple[str, str]]) -> set[tuple[str, str]]:
    # Starlette answers HEAD on every GET route; the document names HEAD only where clients use it (GET /)
    return {(p, m) for p, m in routes if m != "HEAD"}


def test_the_document_is_valid_openapi():
    doc = document()
    schemathesis.openapi.from_dict(doc).validate()  # against the OpenAPI 3.1 meta-schema
    try:
        from openapi_spec_validator import validate
    except ImportError:  # not a dependency: a second opinion where it is installed
        pass
    else:
        validate(doc)
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == version("infer")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    text = json.dumps(doc)
    unused = [name for name in doc["components"]["schemas"] if f'"#/components/schemas/{name}"' not in text]
    assert not unused, unused  # every shared schema is used


def test_the_document_follows_the_validators_lists():
    schemas = document()["components"]["schemas"]
    roles = [v["properties"]["role"] for v in schemas["ChatMessage"]["anyOf"]]
    assert sorted(r for role in roles for r in role.get("enum", [role.get("const")])) == sorted(CHAT_ROLES)
    assert set(OPTIONS) <= set(schemas["OllamaOptions"]["properties"])


def test_the_document_names_every_route_of_both_apps(tiny):
    one = {(r.path, m) for r in one_model_app(tiny).routes for m in r.methods}
    several = {(r.path, m) for r in router(tiny).app.routes for m in r.methods} | {(p, "POST") for p in MODEL_ROUTES}
    doc = documented()
    assert without_head(one) == without_head(doc)
    assert without_head(several) == without_head(doc)
    heads = {r for r in doc if r[1] == "HEAD"}
    assert heads and heads <= one and heads <= several


def test_served_without_the_api_key(tiny):
    for app in (one_model_app(tiny, api_key="sk-k"), FrontDoor(router(tiny), api_key="sk-k", metrics=Metrics())):
        client = TestClient(app)  # not entered: no lifespan, no engine to start
        r = client.get("/openapi.json")
        assert r.status_code == 200 and r.json() == document()
        assert client.get("/v1/models").status_code == 401  # while the API itself needs the key


@pytest.fixture(scope="module")
def one_model(tmp_path_factory):
    server, name = api_fuzz.serve(tmp_path_factory.mktemp("fuzz-one"), several=False)
    yield server, name
    assert server.stop() == 0, server.output()


@pytest.fixture(scope="module")
def several_models(tmp_path_factory):
    server, name = api_fuzz.serve(tmp_path_factory.mktemp("fuzz-several"), several=True)
    yield server, name
    assert server.stop() == 0, server.output()


@pytest.mark.e2e
@pytest.mark.parametrize("served", ["one_model", "several_models"])
def test_fuzzed_requests_get_a_2xx_or_a_documented_4xx(served, request):
    server, name = request.getfixturevalue(served)
    base = f"http://127.0.0.1:{server.port}"
    report = api_fuzz.fuzz(api_fuzz.load(base), base, EXAMPLES, model=name, seed=0)
    assert not report.failures, report.summary()
    for path in MODEL_ROUTES - set(RERANK_ROUTES):  # the fuzz went past validation to the model on every route
        assert report.by_operation[f"POST {path} positive"][200], report.summary()  # that has one
    for path in RERANK_ROUTES:  # the fuzzed model is no reranker: its 400 says so (test_rerank.py: a reranker's)
        assert report.by_operation[f"POST {path} positive"][400], report.summary()
    assert "Traceback" not in server.output(), server.output()[-5000:]
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, _, reply = raw(server.port, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200 and reply["usage"]["completion_tokens"] == 4, reply  # and it still serves


def deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


CHAT = '"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2'
HOSTILE = {  # path, body: requests the fuzz seldom writes, each once a 500
    "an integer past float's range": ("/v1/chat/completions", '{%s, "temperature": 1%s}' % (CHAT, "0" * 400)),
    "a schema nested 900 deep": ("/v1/chat/completions", '{%s, "json_schema": %s}' % (CHAT, deep(900))),
    "the same as JSON text": ("/v1/chat/completions", '{%s, "json_schema": %s}' % (CHAT, json.dumps(deep(900)))),
    "tool parameters nested 900 deep": ("/v1/chat/completions", '{%s, "tools": [{"type": "function", "function": '
                                        '{"name": "f", "parameters": %s}}]}' % (CHAT, deep(900))),
    "an ollama format nested 900 deep": ("/api/chat", '{"model": "MODEL", "messages": [{"role": "user", "content": '
                                         '"Hi"}], "format": %s}' % deep(900)),
}


@pytest.mark.e2e
@pytest.mark.parametrize("served", ["one_model", "several_models"])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_requests_the_fuzz_seldom_writes_are_a_400(case, served, request):
    server, name = request.getfixturevalue(served)
    path, body = HOSTILE[case]
    status, _, answer = raw(server.port, "POST", path, body.replace("MODEL", name).encode())
    assert status == 400, answer
