"""llama-server's compatibility details on OpenAI's routes and the server's front door (issue 37):
logit_bias in OpenAI's and llama.cpp's forms, n > 1, several prompts in one /v1/completions
request, --alias and any model name, --chat-template(-file), the CORS origins rule, X-Api-Key, and
max_tokens past the context ending at the context.  A tiny random qwen2 served by `infer serve`
(and its engine in-process for the sampler's bias), so greedy outputs are arbitrary but exact."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from helpers.server import Server, raw
from infer.cli.server.cors import Cors
from infer.cli.server.openai_request import MAX_CHOICES
from infer.engine.chat_template import CHATML_TEMPLATE, ChatTemplateError, template_source
from infer.engine.sampler import InvalidSamplingParams, SamplingParams

KEY = "sk-compat"
CTX = 128
TEMPLATE = "PROMPT:{% for m in messages %}{{ m['content'] }}{% endfor %}\n"
AUTH = {"X-Api-Key": KEY, "Content-Type": "application/json"}


def j(**kw) -> bytes:
    return json.dumps(kw).encode()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-compat")
    return write_tiny_model(d / "tiny-compat.gguf", "qwen2", seed=5, n_ctx=1024)


@pytest.fixture(scope="module")
def srv(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("compat-serve")
    (d / "t.jinja").write_text(TEMPLATE)
    s = Server(tiny, d, "--ctx", str(CTX), "--threads", "2", "--parallel", "4", "--api-key", KEY,
               "--alias", "tiny-a,tiny-b", "--chat-template-file", str(d / "t.jinja"),
               "--cors", "localhost", "--cors", "http://web.example")
    yield s
    assert s.stop() == 0, s.output()
    assert "Traceback" not in s.output(), s.output()


def post(srv, path: str, **body) -> dict:
    status, _, r = raw(srv.port, "POST", path, j(**body), AUTH)
    assert status == 200, r
    return r


def refused(srv, path: str, **body) -> dict:
    status, _, r = raw(srv.port, "POST", path, j(**body), AUTH)
    assert status == 400 and set(r["error"]) == {"message", "type", "param", "code"}, r
    return r["error"]


def tokens(srv, text: str, add_special: bool = False) -> list[int]:
    return post(srv, "/tokenize", content=text, add_special=add_special)["tokens"]


def greedy(srv, **kw) -> dict:
    return post(srv, "/v1/completions", temperature=0, ignore_eos=True, **kw)


# -- logit_bias ------------------------------------------------------------------------------------


def test_sampling_params_logit_bias_rules():
    assert SamplingParams(logit_bias=[[3, 1], (4, float("-inf"))]).logit_bias == ((3, 1.0), (4, float("-inf")))
    for bad in ([(-1, 1.0)], [(1, float("nan"))], [(1, float("inf"))], [(1,)], [("a", 1.0)], 5, [(True, 1.0)]):
        with pytest.raises(InvalidSamplingParams):
            SamplingParams(logit_bias=bad)


@pytest.fixture(scope="module")
def llm(tiny):
    """The served model in-process, as the server loads it: what its replies must equal."""
    from infer.engine.config import EngineConfig
    from infer.engine.llm import LLM

    llm = LLM.load(tiny, EngineConfig(n_ctx=CTX, max_seqs=2))
    llm.override_template(TEMPLATE)
    return llm


def run(llm, prompt: list[int], n: int = 12, **kw) -> tuple[list[int], str]:
    events = list(llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)))
    return events[-1].token_ids, "".join(e.text for e in events)


def test_engine_logit_bias_bans_and_forces(llm):
    prompt = llm.encode_raw("hello world")
    base, _ = run(llm, prompt)
    banned, _ = run(llm, prompt, logit_bias=((base[0], float("-inf")),))
    assert banned[0] != base[0] and base[0] not in banned
    assert base[0] not in run(llm, prompt, logit_bias=((base[0], -100.0),))[0]
    forced = next(t for t in range(50, 300) if t not in base)
    assert run(llm, prompt, logit_bias=((forced, 100.0),))[0] == [forced] * 12
    assert run(llm, prompt, logit_bias=((forced, 1e-30),))[0] == base  # a bias too small to matter changes nothing
    with pytest.raises(InvalidSamplingParams, match="past the vocabulary"):
        llm.engine.add_request(prompt, SamplingParams(logit_bias=((llm.tokenizer.vocab_size, 1.0),)))


def test_logit_bias_as_llama_cpp_applies_it(llm, tiny, llama_cpp):
    """The biased greedy tokens equal llama.cpp's with the same biases added to its logits."""
    ref = llama_cpp.Llama(str(tiny), n_ctx=CTX, verbose=False)

    def theirs(prompt: list[int], bias: dict[int, float]) -> list[int]:
        def add(_ids, scores):
            for t, b in bias.items():
                scores[t] += b
            return scores

        ref.reset()
        out = []
        for t in ref.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0,
                              logits_processor=llama_cpp.LogitsProcessorList([add])):
            out.append(t)
            if len(out) == 12:
                return out
        return out

    for text in ("hello world", "once upon a time"):
        prompt = llm.encode_raw(text)
        base = run(llm, prompt)[0]
        for bias in ({}, {base[0]: -100.0}, {50: 4.0, 7: 3.5, 200: 3.0}):
            assert run(llm, prompt, logit_bias=tuple(bias.items()))[0] == theirs(prompt, bias), (text, bias)


@pytest.mark.parametrize("form", ["openai", "llama-ids", "llama-false"])
def test_logit_bias_forms_ban_on_completions_and_chat(srv, llm, form):
    prompt = tokens(srv, "hello world")
    base, text = run(llm, prompt)
    assert greedy(srv, prompt=prompt, max_tokens=12)["choices"][0]["text"] == text
    first = base[0]
    bias = {"openai": {str(first): -100}, "llama-ids": [[first, -100]], "llama-false": [[first, False]]}[form]
    ids, want = run(llm, prompt, logit_bias=((first, -100.0 if form != "llama-false" else float("-inf")),))
    assert first not in ids and want != text
    assert greedy(srv, prompt=prompt, max_tokens=12, logit_bias=bias)["choices"][0]["text"] == want
    msgs = [{"role": "user", "content": "hi"}]
    chat_prompt = llm.encode_chat(msgs)
    base, text = run(llm, chat_prompt, 6)
    ids, want = run(llm, chat_prompt, 6, logit_bias=((base[0], float("-inf")),))
    assert base[0] not in ids and want != text
    chat = post(srv, "/v1/chat/completions", messages=msgs, max_tokens=6, temperature=0, ignore_eos=True,
                logit_bias={str(base[0]): False} if form == "openai" else [[base[0], False]])
    assert chat["choices"][0]["message"]["content"] == want


def test_logit_bias_text_biases_each_of_its_tokens(srv, llm):
    text = "xyz"
    ids = tokens(srv, text)
    assert ids == llm.tokenizer.encode(text, add_special=False, parse_special=False)
    prompt = tokens(srv, "hello")
    want = run(llm, prompt, 6, logit_bias=tuple((t, 100.0) for t in ids))
    assert set(want[0]) <= set(ids)
    for bias in ([[text, 100]], {text: 100}):  # llama.cpp's array form, and an object key that is not an id
        assert greedy(srv, prompt=prompt, max_tokens=6, logit_bias=bias)["choices"][0]["text"] == want[1]


def test_bad_logit_bias_is_a_400(srv):
    for bias in ({"999999": 1}, [[-1, 1]], [[5, True]], [[5, "x"]], [5], "x", [[5, 1, 2]], {"5": None}):
        assert refused(srv, "/v1/completions", prompt="hi", max_tokens=1, logit_bias=bias)["param"] == "logit_bias"
    assert refused(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                   logit_bias={"999999": 1})["param"] == "logit_bias"


# -- n > 1 and several prompts -----------------------------------------------------------------------


def test_n_choices_each_its_own_sequence(srv):
    kw = dict(prompt="once upon", max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)
    r = post(srv, "/v1/completions", n=3, **kw)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["completion_tokens"] == 24 and r["usage"]["prompt_tokens"] == len(tokens(srv, "once upon", True))
    # choice j is the request with seed + j: each its own sequence, not copies of one
    alone = [post(srv, "/v1/completions", **{**kw, "seed": 11 + i})["choices"][0]["text"] for i in range(3)]
    assert [c["text"] for c in r["choices"]] == alone and len(set(alone)) > 1
    chat = post(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
                temperature=0, ignore_eos=True)
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert all(c["message"]["role"] == "assistant" and c["finish_reason"] == "length" for c in chat["choices"])
    assert chat["choices"][0]["message"]["content"] == chat["choices"][1]["message"]["content"]  # greedy: equal
    assert chat["usage"]["completion_tokens"] == 8


def sse(srv, path: str, **body) -> list[dict]:
    status, _, text = raw(srv.port, "POST", path, j(stream=True, **body), AUTH)
    assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_n_choices_streamed_carry_their_index(srv):
    kw = dict(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True, n=2, stream_options={"include_usage": True})
    whole = post(srv, "/v1/completions", prompt="abc", **{k: v for k, v in kw.items() if k != "stream_options"})
    chunks = sse(srv, "/v1/completions", prompt="abc", **kw)
    *parts, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12
    for i in (0, 1):
        mine = [c["choices"][0] for c in parts if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == whole["choices"][i]["text"]
        assert mine[-1]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in parts)
    chat = sse(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], **kw)
    for i in (0, 1):
        mine = [c["choices"][0] for c in chat if c["choices"] and c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant" and mine[-1]["finish_reason"] == "length"
    assert chat[-1]["usage"]["completion_tokens"] == 12 and chat[-1]["object"] == "chat.completion.chunk"


def test_several_prompts_prompt_major(srv):
    ids = tokens(srv, "the cat")
    r = greedy(srv, prompt=["hello there", ids], n=2, max_tokens=5)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    one = greedy(srv, prompt="hello there", max_tokens=5)["choices"][0]["text"]
    two = greedy(srv, prompt=ids, max_tokens=5)["choices"][0]["text"]
    assert [c["text"] for c in r["choices"]] == [one, one, two, two]
    assert r["usage"]["prompt_tokens"] == len(tokens(srv, "hello there", True)) + len(ids)
    assert r["usage"]["completion_tokens"] == 20


def test_choices_are_bounded(srv):
    assert refused(srv, "/v1/completions", prompt="hi", n=MAX_CHOICES + 1)["param"] == "n"
    assert refused(srv, "/v1/completions", prompt=["a", "b", "c"], n=6)["param"] == "n"
    assert refused(srv, "/v1/completions", prompt=["a", 5])["param"] == "prompt"  # neither prompts nor ids
    assert refused(srv, "/v1/completions", prompt=["a", [10**9]])["param"] == "prompt[1]"
    assert refused(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], n=0)["param"] == "n"


# -- the model's names, the chat template ----------------------------------------------------------------


def test_alias_and_any_model_name(srv):
    status, _, models = raw(srv.port, "GET", "/v1/models", None, AUTH)
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny-a"]
    for name in ("gpt-3.5-turbo", "tiny-b", "tiny-compat"):
        r = post(srv, "/v1/chat/completions", model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert r["model"] == "tiny-a"
    assert refused(srv, "/v1/completions", model=5, prompt="hi")["param"] == "model"


def test_chat_template_file_is_used(srv, llm):
    msgs = [{"role": "user", "content": "tell me"}]
    r = post(srv, "/v1/chat/completions", messages=msgs, max_tokens=1)
    assert r["usage"]["prompt_tokens"] == len(tokens(srv, "PROMPT:tell me\n")) == len(llm.encode_chat(msgs))
    llm.override_template("chatml")  # not a name here: Jinja source, which renders the text as it is
    assert llm.template.render(msgs) == "chatml"
    with pytest.raises(ChatTemplateError):
        llm.override_template("{{ raise_exception('no') }}")
    assert llm.template.render(msgs) == "chatml"  # a failed override changes nothing
    llm.override_template(TEMPLATE)


def test_template_names():
    assert template_source("chatml") == CHATML_TEMPLATE
    assert template_source("{{ x }}") == "{{ x }}"
    with pytest.raises(ChatTemplateError, match="unknown chat template"):
        template_source("nonsense")


def test_bad_chat_template_fails_at_startup(tiny):
    for flags, want in ((["--chat-template", "{% if %}"], "chat template syntax error"),
                        (["--chat-template", "{{ raise_exception('no') }}"], "no"),
                        (["--chat-template", "nonsense"], "unknown chat template"),
                        (["--chat-template-file", "/nonexistent/t.jinja"], "--chat-template-file")):
        p = subprocess.run([sys.executable, "-m", "infer.cli", "serve", str(tiny), "--port", "0", *flags],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and want in p.stderr, p.stderr
        assert "Traceback" not in p.stderr


# -- the front door ------------------------------------------------------------------------------------


def test_x_api_key_and_bearer(srv):
    body = j(prompt="hi", max_tokens=1)
    assert raw(srv.port, "POST", "/v1/completions", body, {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert raw(srv.port, "POST", "/v1/completions", body, {"X-Api-Key": KEY})[0] == 200
    for headers in ({"X-Api-Key": "wrong"}, {"Authorization": "Bearer wrong"}, {}):
        status, _, r = raw(srv.port, "POST", "/v1/completions", body, headers)
        assert status == 401 and r["error"]["code"] == "invalid_api_key"


def preflight(port: int, origin: str) -> tuple[int, dict]:
    status, headers, _ = raw(port, "OPTIONS", "/v1/completions", None, {
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"})
    return status, headers


def test_cors_served(srv):
    for origin in ("http://localhost:8080", "http://web.example"):
        status, h = preflight(srv.port, origin)
        assert status == 200 and h["access-control-allow-origin"] == origin, h
        assert h["access-control-allow-credentials"] == "true"
        assert h["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert h["access-control-allow-headers"] == "*"
    status, h = preflight(srv.port, "http://evil.example")
    assert status == 200 and "access-control-allow-origin" not in h
    status, h, _ = raw(srv.port, "POST", "/v1/completions", j(prompt="hi", max_tokens=1),
                       {**AUTH, "Origin": "http://web.example"})
    assert status == 200 and h["access-control-allow-origin"] == "http://web.example"


def cors_client(*origins: str) -> TestClient:
    app = Starlette(routes=[Route("/x", lambda r: PlainTextResponse("ok"), methods=["GET", "POST"])])
    return TestClient(Cors(app, origins))


LOOPBACK = ["http://localhost", "http://localhost:8080", "http://127.0.0.1", "http://127.0.0.1:3000", "http://[::1]",
            "http://[::1]:3000", "https://localhost:5173"]
FOREIGN = ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com",
           "http://localhost:8080.evil.com", "null"]


@pytest.mark.parametrize("origins", [(), ("localhost",)])
def test_cors_localhost_rule(origins):
    """llama-server's --cors-origins localhost (its test_security.py), and infer's default."""
    c = cors_client(*origins)
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
    for origin in LOOPBACK:
        r = c.options("/x", headers={"Origin": origin, **ask})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        assert c.get("/x", headers={"Origin": origin}).headers["access-control-allow-origin"] == origin
    for origin in FOREIGN:
        r = c.options("/x", headers={"Origin": origin, **ask})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        r = c.get("/x", headers={"Origin": origin})
        assert r.text == "ok" and "access-control-allow-origin" not in r.headers


def test_cors_any_and_exact():
    ask = {"Access-Control-Request-Method": "POST"}
    r = cors_client("*").options("/x", headers={"Origin": "web.mydomain.fr", **ask})
    assert r.headers["access-control-allow-origin"] == "web.mydomain.fr"  # llama-server reflects it
    assert r.headers["access-control-allow-credentials"] == "true"
    c = cors_client("http://a.example")
    assert c.options("/x", headers={"Origin": "http://a.example", **ask}).headers["access-control-allow-origin"]
    assert "access-control-allow-origin" not in c.options("/x", headers={"Origin": "http://localhost", **ask}).headers
    assert "access-control-allow-origin" not in c.get("/x").headers  # no Origin: not a CORS request


# -- max_tokens past the context -------------------------------------------------------------------------


def test_max_tokens_past_the_context_ends_at_it(srv):
    ids = tokens(srv, "hello")
    r = greedy(srv, prompt=ids, max_tokens=10**6)
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] == CTX
    chat = post(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], max_tokens=CTX,
                temperature=0, ignore_eos=True)
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"] == CTX
    status, _, r = raw(srv.port, "POST", "/v1/completions", j(prompt="hello " * 200, max_tokens=1), AUTH)
    assert status == 400 and r["error"]["code"] == "context_length_exceeded"  # the prompt alone: still refused
