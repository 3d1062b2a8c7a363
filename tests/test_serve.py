"""`infer serve` as clients use it: the real server in a subprocess, the official openai client,
and raw HTTP for the requests no well-behaved client would send."""
from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.server import HELLO, MODEL, Server, metrics, raw, wait_idle

openai = pytest.importorskip("openai")

KEY = "sk-test-key"
CTX = 1024


@pytest.fixture(scope="module")
def server_args():
    return ("--api-key", KEY, "--parallel", "8", "--ctx", str(CTX), "--threads", "2", "--max-body", "64K")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY, max_retries=0, timeout=120)


LONGER = [{"role": "system", "content": "You are a careful assistant who answers in one short sentence, "
                                        "without lists, and never repeats the question back."},
          {"role": "user", "content": "Name three colours."}]  # more than two full KV blocks of prompt


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model"


def test_chat_and_streaming_agree(client):
    full = client.chat.completions.create(model=MODEL, messages=LONGER, max_tokens=12, temperature=0)
    assert full.id.startswith("chatcmpl-") and full.object == "chat.completion" and full.model == MODEL
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = full.usage
    assert u.prompt_tokens > 32 and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    chunks = list(client.chat.completions.create(model=MODEL, messages=LONGER, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == u.completion_tokens
    assert last.usage.prompt_tokens == u.prompt_tokens
    assert last.usage.prompt_tokens_details.cached_tokens >= 32  # the same prompt came just before
    assert all(c.usage is None for c in body)
    assert body[-1].choices[0].finish_reason == choice.finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in body) == choice.message.content


def test_completions(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    assert full.choices[0].text and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 10
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_stop_sequences(client):
    prompt = "1, 2, 3, 4, 5,"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    stop = free[len(free) // 2:][:3]
    assert stop.strip(), free  # something to stop at, in the middle of the reply
    for stops in (stop, [stop, "never-generated-zzz"]):
        c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=stops).choices[0]
        assert c.text == free[:free.index(stop)]
        assert c.finish_reason == "stop"


def test_seed_reproducible(client):
    def once(seed):
        r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=1.0, top_p=1.0,
                                           extra_body={"min_p": 0.0, "top_k": 0}, seed=seed)
        return r.choices[0].message.content

    a = once(1234)
    assert a and once(1234) == a
    assert len({once(s) for s in (1, 2, 3)} | {a}) > 1  # the seed matters at all


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for lp in content:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        top = [t.logprob for t in lp.top_logprobs]
        assert top == sorted(top, reverse=True)
        assert lp.token == lp.top_logprobs[0].token and abs(lp.logprob - top[0]) < 1e-9  # greedy took the top
        assert bytes(lp.bytes).decode("utf-8", "replace") == lp.token
    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0


def test_streaming_never_splits_a_character(client):
    # rare hieroglyphs: the model writes each as four byte tokens, so most tokens end mid-character
    prompt = "𓀀𓀁𓀂𓀃𓀄𓀅𓀆𓀇𓀈𓀉𓀊𓀋𓀌𓀍"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logprobs=0)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                            logprobs=0))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == full.choices[0].text and "\ufffd" not in "".join(texts)
    assert any(len(c.choices[0].logprobs.tokens) > 1 for c in chunks)  # tokens were held back, then sent together
    # each token's bytes (in the chat format) rebuild the text exactly
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=16,
                                       temperature=0, logprobs=True)
    raw_bytes = b"".join(bytes(t.bytes) for t in r.choices[0].logprobs.content)
    assert raw_bytes.decode("utf-8", "replace").strip() == r.choices[0].message.content.strip()


def test_api_key_enforced(server, client):
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    status, _, body = raw(server.port, "POST", "/v1/chat/completions", json.dumps({"messages": HELLO}).encode())
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert raw(server.port, "GET", "/health")[0] == 200  # health and metrics stay open
    assert client.models.list().data  # the right key works


def test_disconnect_mid_stream_frees_blocks(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 500, "temperature": 0, "stream": True,
            "extra": "ignored"}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    for _ in range(3):
        assert resp.readline().startswith(b"data: ")
        resp.readline()
    during = metrics(server.port)
    assert during["infer_requests_running"] == 1 and during["infer_kv_blocks_used"] > 0
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    after = wait_idle(server.port, timeout=5)
    assert after["infer_kv_blocks_used"] == 0 and after["infer_requests_running"] == 0
    assert after["infer_generation_tokens_total"] >= during["infer_generation_tokens_total"]

    # a client waiting for a whole (non-streamed) reply that hangs up is noticed too
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": False, "max_tokens": 1000}),
                 {"Authorization": f"Bearer {KEY}"})
    deadline = time.time() + 10
    while metrics(server.port)["infer_kv_blocks_used"] == 0 and time.time() < deadline:
        time.sleep(0.02)
    assert metrics(server.port)["infer_requests_running"] == 1
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    t0 = time.time()
    after = wait_idle(server.port, timeout=5)
    assert after["infer_kv_blocks_used"] == 0 and time.time() - t0 < 3  # 1000 tokens would take far longer


def test_concurrent_clients_match_one_at_a_time(client, server):
    prompts = [f"Write the number {i} in words, then count to {i + 3}." for i in range(8)]

    def ask(p):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=10,
                                           temperature=0)
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone
    assert wait_idle(server.port)["infer_kv_blocks_used"] == 0


# ---------------------------------------------------------------- hostile requests

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
OK_MSGS = [{"role": "user", "content": "hi"}]


def j(**kw) -> bytes:
    return json.dumps(kw).encode()


BAD = {
    "bad json": (CHAT, b'{"messages": [', 400),
    "empty body": (CHAT, b"", 400),
    "body is an array": (CHAT, b"[1, 2]", 400),
    "no messages": (CHAT, j(model=MODEL), 400),
    "empty messages": (CHAT, j(messages=[]), 400),
    "messages is a string": (CHAT, j(messages="hi"), 400),
    "message not an object": (CHAT, j(messages=["hi"]), 400),
    "unknown role": (CHAT, j(messages=[{"role": "wizard", "content": "hi"}]), 400),
    "content is a number": (CHAT, j(messages=[{"role": "user", "content": 42}]), 400),
    "image content part": (CHAT, j(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400),
    "max_tokens a string": (CHAT, j(messages=OK_MSGS, max_tokens="10"), 400),
    "max_tokens negative": (CHAT, j(messages=OK_MSGS, max_tokens=-5), 400),
    "max_tokens zero": (CHAT, j(messages=OK_MSGS, max_completion_tokens=0), 400),
    "negative temperature": (CHAT, j(messages=OK_MSGS, temperature=-1), 400),
    "temperature a string": (CHAT, j(messages=OK_MSGS, temperature="hot"), 400),
    "NaN temperature": (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400),
    "Infinity max_tokens (not JSON)": (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}', 400),
    "temperature past float32": (CHAT, j(messages=OK_MSGS, temperature=1e300), 400),
    "top_p zero": (CHAT, j(messages=OK_MSGS, top_p=0), 400),
    "frequency_penalty a list": (CHAT, j(messages=OK_MSGS, frequency_penalty=[1]), 400),
    "stop a number": (CHAT, j(messages=OK_MSGS, stop=42), 400),
    "stop list of ints": (CHAT, j(messages=OK_MSGS, stop=[1, 2]), 400),
    "n past its bound": (CHAT, j(messages=OK_MSGS, n=17), 400),
    "n zero": (CHAT, j(messages=OK_MSGS, n=0), 400),
    "logit_bias past the vocabulary": (CHAT, j(messages=OK_MSGS, logit_bias={"99999999": 5}), 400),
    "stream not a bool": (CHAT, j(messages=OK_MSGS, stream="yes"), 400),
    "stream_options without stream": (CHAT, j(messages=OK_MSGS, stream_options={"include_usage": True}), 400),
    "top_logprobs without logprobs": (CHAT, j(messages=OK_MSGS, top_logprobs=2), 400),
    "top_logprobs too many": (CHAT, j(messages=OK_MSGS, logprobs=True, top_logprobs=50), 400),
    "negative seed": (CHAT, j(messages=OK_MSGS, seed=-1), 400),
    "model not a string": (CHAT, j(model=5, messages=OK_MSGS), 400),
    "invalid UTF-8": (CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe bad"}]}', 400),
    "lone surrogate": (CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    "5000-digit number": (CHAT, b'{"messages": [], "max_tokens": ' + b"9" * 5000 + b"}", 400),
    "deeply nested": (CHAT, b"[" * 30_000 + b"]" * 30_000, 400),
    "oversize body": (CHAT, j(messages=[{"role": "user", "content": "x" * 100_000}]), 413),
    "completion prompt an object": (COMP, j(prompt={"text": "hi"}), 400),
    "prompts times n past the bound": (COMP, j(prompt=["a", "b"], n=9), 400),
    "token id out of range": (COMP, j(prompt=[1, 10**9]), 400),
    "completion logprobs too many": (COMP, j(prompt="hi", logprobs=100), 400),
    "echo": (COMP, j(prompt="hi", echo=True), 400),
    "prompt over the context": (COMP, j(prompt="hello " * 2000), 400),
    "response_format unknown type": (CHAT, j(messages=OK_MSGS, response_format={"type": "yaml"}), 400),
    "response_format a string": (CHAT, j(messages=OK_MSGS, response_format="json"), 400),
    "json_schema without an object": (CHAT, j(messages=OK_MSGS, response_format={"type": "json_schema",
                                                                                   "json_schema": 5}), 400),
    "invalid schema": (CHAT, j(messages=OK_MSGS, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}), 400),
    "grammar syntax error": (COMP, j(prompt="hi", grammar='root ::= "('), 400),
    "grammar not a string": (COMP, j(prompt="hi", grammar=["root"]), 400),
    "grammar and json_schema": (COMP, j(prompt="hi", grammar='root ::= "a"', json_schema={"type": "object"}), 400),
    "tool without a name": (CHAT, j(messages=OK_MSGS, tools=[{"type": "function", "function": {}}]), 400),
    "tools not an array": (CHAT, j(messages=OK_MSGS, tools={"name": "f"}), 400),
    "tool_choice unknown function": (CHAT, j(messages=OK_MSGS, tools=[{"type": "function", "function": {"name": "f"}}],
                                             tool_choice={"type": "function", "function": {"name": "g"}}), 400),
    "tool_choice required without tools": (CHAT, j(messages=OK_MSGS, tool_choice="required"), 400),
    "parallel_tool_calls a string": (CHAT, j(messages=OK_MSGS, parallel_tool_calls="yes"), 400),
    "tools with a grammar": (CHAT, j(messages=OK_MSGS, tools=[{"type": "function", "function": {"name": "f"}}],
                                     tool_choice="required", grammar='root ::= "a"'), 400),
    "bad earlier tool call": (CHAT, j(messages=[{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "", "tool_calls": [{"x": 1}]}]), 400),
    "functions": (CHAT, j(messages=OK_MSGS, functions=[{"name": "f"}]), 400),
}


def test_tokenize_and_detokenize(server, gemma_path):
    # llama.cpp's server routes and shapes; ids as llama.cpp tokenizes (tests/test_tokenizer.py)
    from infer.engine.llm import LLM

    tok = LLM.load(gemma_path).tokenizer
    auth = {"Authorization": f"Bearer {KEY}"}
    text = "Hello <start_of_turn> wörld"
    status, _, r = raw(server.port, "POST", "/tokenize", j(content=text), auth)
    assert status == 200 and r["tokens"] == tok.encode(text, add_special=False, parse_special=True)
    _, _, r2 = raw(server.port, "POST", "/tokenize", j(content=text, add_special=True, parse_special=False,
                                                       with_pieces=True), auth)
    ids = [p["id"] for p in r2["tokens"]]
    assert ids == tok.encode(text, add_special=True, parse_special=False)
    assert "".join(p["piece"] for p in r2["tokens"] if isinstance(p["piece"], str)).endswith(" wörld")
    _, _, back = raw(server.port, "POST", "/detokenize", j(tokens=r["tokens"]), auth)
    assert back == {"content": text}
    for path, body in [("/tokenize", j(content=5)), ("/tokenize", j(content="x", parse_special="yes")),
                       ("/detokenize", j(tokens=[1, "2"])), ("/detokenize", j(tokens=[10**9]))]:
        status, _, resp = raw(server.port, "POST", path, body, auth)
        assert status == 400 and set(resp["error"]) == {"message", "type", "param", "code"}, (path, resp)
    assert raw(server.port, "POST", "/tokenize", j(content="x"))[0] == 401


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request(server, case):
    path, body, want = BAD[case]
    status, _, resp = raw(server.port, "POST", path, body,
                          {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert status == want, resp
    err = resp["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and 0 < len(err["message"]) <= 400 and "\n" not in err["message"]
    assert isinstance(err["type"], str) and err["code"]


def test_context_errors_give_token_counts(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    _, _, resp = raw(server.port, "POST", COMP, j(prompt="hello " * 2000), auth)
    assert re.search(r"the prompt has \d{4} tokens but the context holds 1024", resp["error"]["message"])
    assert resp["error"]["code"] == "context_length_exceeded"
    # max_tokens past the context ends at the context, as llama-server does (tests/test_server_compat.py)


def test_more_hostile_requests(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, resp = raw(server.port, "POST", CHAT, j(messages=[{"role": "user", "content": "x" * 100_000}]), auth,
                          chunked=True)  # no Content-Length: the limit is counted as the body arrives
    assert status == 413 and resp["error"]["code"] == "body_too_large"
    status, _, resp = raw(server.port, "GET", CHAT, None, auth)
    assert status == 405 and "error" in resp
    status, _, resp = raw(server.port, "POST", "/v1/nothing-here", b"{}", auth)
    assert status == 404 and "error" in resp


def test_still_serving_after_abuse(server, client):
    assert raw(server.port, "GET", "/health")[0] == 200
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    m = wait_idle(server.port)
    assert m["infer_kv_blocks_used"] == 0
    text = raw(server.port, "GET", "/metrics")[2]
    assert 'infer_requests_total{route="/v1/chat/completions",status="400"}' in text
    assert "infer_time_to_first_token_seconds_count" in text and "infer_inter_token_latency_seconds_bucket" in text


# ---------------------------------------------------------------- overload and shutdown


@pytest.mark.e2e
def test_overload_and_graceful_shutdown(gemma_path, tmp_path):
    s = Server(gemma_path, tmp_path, "--parallel", "1", "--max-queue", "1", "--ctx", "512", "--threads", "2",
               "--shutdown-timeout", "20", env_extra={"INFER_API_KEY": "env-key"})
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="env-key", max_retries=0, timeout=120)
        results = {}

        def long(name, n):
            chunks = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=n, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}))
            results[name] = chunks[-1].choices[0].finish_reason

        first = threading.Thread(target=long, args=("first", 60))
        first.start()
        deadline = time.time() + 30
        while metrics(s.port)["infer_requests_running"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        second = threading.Thread(target=long, args=("second", 8))  # waits for the only slot
        second.start()
        while metrics(s.port)["infer_requests_waiting"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        status, headers, body = raw(s.port, "POST", COMP, j(prompt="hi", max_tokens=2),
                                    {"Authorization": "Bearer env-key"})
        assert status == 503 and headers.get("retry-after") and body["error"]["code"] == "server_overloaded"
        with pytest.raises(openai.AuthenticationError):  # --api-key came from INFER_API_KEY
            openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x", max_retries=0).models.list()

        s.proc.send_signal(signal.SIGTERM)  # both running and waiting requests are finished first
        first.join(60)
        second.join(60)
        assert results == {"first": "length", "second": "length"}
        assert s.proc.wait(30) == 0
        with pytest.raises(OSError):
            raw(s.port, "GET", "/health", timeout=2)
    finally:
        s.stop()
