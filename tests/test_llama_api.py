"""llama-server's native routes on `infer serve` (cli/server/llama_api.py, llama_props.py):
/completion with its fields, streamed shape, n_probs and prompt shapes; /infill's prompt against
llama.cpp's format_prompt_infill, computed by hand; /props, /slots, /apply-template; the error
shape and the API key.  The embedded Gemma (no FIM tokens) and a tiny random model with FIM tokens
(for what needs a short context or FIM), each served by uvicorn in a thread of this process (a
real connection: TestClient would buffer a stream whole, and /slots is asked while one runs)."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from helpers.server import free_port
from helpers.tiny_models import FIM_IDS, add_fim_ids, write_tiny_model
from infer.cli.server.llama_infill import FIM_BATCH, infill_prompt
from infer.cli.server.openai_server import ServerConfig, create_app
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM

PROMPT = "I believe the meaning of life is"
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
           "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
FINAL = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
         "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word", "tokens_cached",
         "timings"}


@contextmanager
def live(app, **headers):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}", headers=headers, timeout=300) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@pytest.fixture(scope="module")
def gemma_llm(gemma_path):
    return LLM.load(gemma_path, EngineConfig(n_ctx=512, n_threads=2, max_seqs=2))


@pytest.fixture(scope="module")
def gemma(gemma_llm):
    with live(create_app(gemma_llm, ServerConfig(model_id="gemma"))) as client:
        yield client


@pytest.fixture(scope="module")
def fim_llm(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("fim") / "coder.gguf", "llama", extra=add_fim_ids)
    return LLM.load(path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=2))


@pytest.fixture(scope="module")
def tiny(fim_llm):
    with live(create_app(fim_llm, ServerConfig(model_id="coder", api_key="sk-k")), Authorization="Bearer sk-k") as client:
        yield client


def events(response) -> list[dict]:
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines]


def tokenize(client, text: str) -> list[int]:
    return client.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]


# -- /completion ------------------------------------------------------------------------------------


def test_completion_fields(gemma, gemma_llm):
    r = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True})
    assert r.status_code == 200
    b = r.json()
    assert FINAL <= set(b) and TIMINGS <= set(b["timings"])
    ids = tokenize(gemma, PROMPT)
    assert b["stop"] is True and b["stop_type"] == "limit" and b["stopping_word"] == "" and b["truncated"] is False
    assert b["model"] == "gemma" and b["index"] == 0 and b["id_slot"] in (0, 1)
    assert len(b["tokens"]) == b["tokens_predicted"] == b["timings"]["predicted_n"] == 8
    assert gemma_llm.tokenizer.decode(b["tokens"]) == b["content"]
    assert b["tokens_evaluated"] == len(ids) == b["timings"]["prompt_n"] + b["timings"]["cache_n"]
    assert b["tokens_cached"] == len(ids) + 7  # llama-server's: the last token is never fed back
    assert b["prompt"] == "<bos>" + PROMPT and b["has_new_line"] == ("\n" in b["content"])
    s = b["generation_settings"]
    assert s["n_predict"] == 8 and s["temperature"] == 0 and s["top_k"] == 40 and s["seed"] == 4294967295
    assert s["mirostat"] == 0 and "adaptive_target" in s and "adaptive_decay" in s
    t = b["timings"]
    assert t["predicted_ms"] > 0 and t["predicted_per_second"] == pytest.approx(8000 / t["predicted_ms"])
    # greedy: the same text OpenAI's /v1/completions gives
    openai = gemma.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
    assert openai["choices"][0]["text"] == b["content"]
    assert gemma.post("/completions", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0}).json()["content"] \
        == b["content"]
    assert gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 8}).json()["tokens"] == []  # not asked


def test_streamed_as_llama_server(gemma):
    body = {"prompt": PROMPT, "n_predict": 10, "temperature": 0}
    whole = gemma.post("/completion", json=body).json()
    with gemma.stream("POST", "/completion", json={**body, "stream": True, "return_tokens": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = events(r)
    *parts, last = chunks
    assert parts and all(c["stop"] is False and set(c) >= {"content", "tokens", "id_slot", "tokens_predicted",
                                                           "tokens_evaluated", "index"} for c in parts)
    assert all(len(c["tokens"]) == 1 for c in parts)
    assert "".join(c["content"] for c in parts) == whole["content"]
    assert last["stop"] is True and FINAL <= set(last) and last["content"] == "" and last["stop_type"] == "limit"
    assert last["timings"]["predicted_n"] == 10 and last["generation_settings"]["stream"] is True
    assert last["tokens_predicted"] == 10 and parts[-1]["tokens_predicted"] <= 10


def test_logit_bias(gemma):
    """logit_bias on /completion as llama.cpp's test_logit_bias sends it: texts or ids, llama's pairs
    or OpenAI's object; a banned greedy token never comes, and the reply changes."""
    greedy = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                             "return_tokens": True}).json()
    first = greedy["tokens"][0]
    for bias in ([[first, False]], {str(first): -100}):
        r = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 12, "temperature": 0, "logit_bias": bias,
                                            "return_tokens": True})
        assert r.status_code == 200, r.text
        assert first not in r.json()["tokens"] and r.json()["content"] != greedy["content"]
    words = ["the", "a", "to", "be"]
    r = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 24, "temperature": 0,
                                        "logit_bias": [[f" {w} ", -100] for w in words]})
    assert r.status_code == 200 and all(f" {w} " not in r.json()["content"] for w in words), r.text


def test_server_seed(gemma_path):
    """--seed (ServerConfig.seed): requests without a seed sample with the server's, so the same
    request gets the same reply, as llama-server's --seed; a request's own seed still wins.  Its own
    LLM: a server's lifespan stops its engine when it ends."""
    body = {"prompt": PROMPT, "n_predict": 16, "temperature": 1.5, "top_k": 0, "top_p": 1.0}
    llm = LLM.load(gemma_path, EngineConfig(n_ctx=512, n_threads=2, max_seqs=2))
    with live(create_app(llm, ServerConfig(model_id="gemma", seed=42))) as client:
        replies = [client.post("/completion", json=body).json()["content"] for _ in range(3)]
        chats = [client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                            "max_tokens": 16, "temperature": 1.5}).json()
                 for _ in range(2)]
        own = client.post("/completion", json={**body, "seed": 42}).json()["content"]
    assert replies[0] == replies[1] == replies[2] == own
    assert chats[0]["choices"][0]["message"] == chats[1]["choices"][0]["message"]


def test_n_probs(gemma, gemma_llm):
    b = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 5, "temperature": 0, "n_probs": 4,
                                        "return_tokens": True}).json()
    probs = b["completion_probabilities"]
    assert [p["id"] for p in probs] == b["tokens"]
    for p in probs:
        assert p["token"] == gemma_llm.tokenizer.decode([p["id"]]) and p["logprob"] <= 0
        assert bytes(p["bytes"]).decode() == p["token"]
        top = p["top_logprobs"]
        assert len(top) == 4 and top[0]["id"] == p["id"]  # greedy: the likeliest
        assert top[0]["logprob"] == pytest.approx(p["logprob"])
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert all({"id", "token", "bytes", "logprob"} <= set(t) for t in top)
    with gemma.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 3, "n_probs": 2, "stream": True,
                                                   "temperature": 0}) as r:
        *parts, last = events(r)
    assert all(len(c["completion_probabilities"]) == 1 for c in parts) and "completion_probabilities" not in last
    assert [c["completion_probabilities"][0]["id"] for c in parts] == [p["id"] for p in probs[:3]]
    post = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "n_probs": 3, "temperature": 0,
                                           "post_sampling_probs": True}).json()["completion_probabilities"]
    for p, q in zip(post, probs):
        assert p["id"] == q["id"] and 0 < p["prob"] <= 1 and len(p["top_probs"]) == 3 and "logprob" not in p
        assert sum(t["prob"] for t in p["top_probs"]) <= 1 + 1e-9


def test_prompt_shapes(gemma):
    ids = tokenize(gemma, PROMPT)
    one = gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0}).json()
    by_ids = gemma.post("/completion", json={"prompt": ids, "n_predict": 4, "temperature": 0}).json()
    assert by_ids["content"] == one["content"] and by_ids["tokens_evaluated"] == len(ids)
    several = gemma.post("/completion", json={"prompt": [ids, PROMPT, {"prompt_string": PROMPT}], "n_predict": 4,
                                              "temperature": 0}).json()
    assert isinstance(several, list) and [r["index"] for r in several] == [0, 1, 2]
    assert [r["content"] for r in several] == [one["content"]] * 3
    # ids and text in one prompt: BOS only before a first string
    mixed = gemma.post("/completion", json={"prompt": [*ids, " and", " so"], "n_predict": 2}).json()
    assert mixed["tokens_evaluated"] == len(ids) + len(tokenize(gemma, " and")) - 1 + len(tokenize(gemma, " so")) - 1
    with gemma.stream("POST", "/completion", json={"prompt": [PROMPT, PROMPT], "n_predict": 3, "stream": True,
                                                   "temperature": 0}) as r:
        chunks = events(r)
    finals = [c for c in chunks if c["stop"]]
    assert [c["index"] for c in finals] == [0, 1]
    assert "".join(c["content"] for c in chunks if c["index"] == 1) == \
        gemma.post("/completion", json={"prompt": PROMPT, "n_predict": 3, "temperature": 0}).json()["content"]


def test_stop_types(gemma):
    b = gemma.post("/completion", json={"prompt": "1, 2, 3, 4, 5,", "n_predict": 20, "temperature": 0,
                                        "stop": [" 8", " 7"]}).json()
    assert b["stop_type"] == "word" and b["stopping_word"] == " 7" and b["content"] == " 6,"
    eos = gemma.post("/completion", json={"prompt": "Answer:", "n_predict": 20, "grammar": 'root ::= "yes"'}).json()
    assert eos["content"] == "yes" and eos["stop_type"] == "eos" and eos["stopping_word"] == ""


def test_n_predict_zero_fills_the_cache(gemma):
    prompt = "A prompt to warm the cache with, of a few tokens more than a block of the cache holds"
    b = gemma.post("/completion", json={"prompt": prompt, "n_predict": 0}).json()
    assert b["content"] == "" and b["tokens_predicted"] == 0 and b["timings"]["predicted_n"] == 0
    assert b["stop_type"] == "limit" and b["timings"]["prompt_n"] > 0
    again = gemma.post("/completion", json={"prompt": prompt, "n_predict": 1}).json()
    assert again["timings"]["cache_n"] >= 16 and again["timings"]["prompt_n"] < b["timings"]["prompt_n"]


def test_n_predict_minus_one_runs_to_the_context(tiny, fim_llm):
    b = tiny.post("/completion", json={"prompt": "ab cd", "n_predict": -1, "ignore_eos": True}).json()
    n = len(fim_llm.encode_raw("ab cd"))
    assert b["tokens_predicted"] == 256 - n and b["stop_type"] == "limit" and b["truncated"] is True
    far = tiny.post("/completion", json={"prompt": "ab cd", "n_predict": 100000, "ignore_eos": True}).json()
    assert far["tokens_predicted"] == 256 - n and far["truncated"] is True  # ends at the context, as llama-server
    exact = tiny.post("/completion", json={"prompt": "ab cd", "n_predict": 256 - n, "ignore_eos": True}).json()
    assert exact["tokens_predicted"] == 256 - n and exact["truncated"] is False  # n_predict's limit, not the context


@pytest.mark.parametrize("body,param", [
    ({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": [[1, 2], 7.5]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"), ({"prompt": "x", "n_probs": 99}, "n_probs"),
    ({"prompt": "x", "n_predict": -2}, "n_predict"), ({"prompt": "x", "mirostat": 2}, "mirostat"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"), ({"prompt": "x", "cache_prompt": 1}, "cache_prompt"),
    ({"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}, "prompt"),
])
def test_bad_input_in_llama_servers_shape(gemma, body, param):
    r = gemma.post("/completion", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"code", "message", "type"} and err["code"] == 400 and err["type"] == "invalid_request_error"


def test_a_prompt_past_the_context(gemma):
    r = gemma.post("/completion", json={"prompt": PROMPT * 200})
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"


# -- /infill ----------------------------------------------------------------------------------------


def test_infill_prompt_is_llama_cpps(fim_llm):
    """format_prompt_infill's repo-level pattern, written out by hand for this vocabulary (BOS 1, FIM ids)."""
    tok = fim_llm.tokenizer
    pre, suf, mid, rep, sep = (FIM_IDS[k] for k in ("fim_pre", "fim_suf", "fim_mid", "fim_rep", "fim_sep"))

    def enc(text):
        return tok.encode(text, add_special=False)

    extra = [{"filename": "util.py", "text": "ab cd"}, {"text": "ef"}]
    got = infill_prompt(tok, "gh ij", "kl", extra, "mn", n_batch=2048, n_ctx=4096)
    head = [rep, *enc("myproject\n"), sep, *enc("util.py\n"), *enc("ab cd"), sep, *enc("tmp\n"), *enc("ef"),
            sep, *enc("filename\n")]
    assert got == [*head, 1, pre, *enc("gh ij"), *enc("mn"), suf, *enc("kl"), mid]
    # the parts cut to the batch: the prefix's end (3/4 of it), the suffix's start (a quarter less 2 and the
    # prompt), the extra context's end (n_ctx less a batch and two replies of the default n_predict, -1)
    long_pre, long_suf = " ab" * 40, " cd" * 40
    got = infill_prompt(tok, long_pre, long_suf, extra, "mn", n_batch=32, n_ctx=40)
    p, s, m = enc(long_pre), enc(long_suf), enc("mn")
    assert got == [*head[-10:], 1, pre, *p[-24:], *m, suf, *s[:8 - 2 - len(m)], mid]
    assert infill_prompt(tok, "a", "b", [], "", n_batch=32, n_ctx=30)[:2] == [1, pre]  # no room: no extra context


def test_infill_route(tiny, fim_llm):
    body = {"input_prefix": "def f():\n", "input_suffix": "\n", "prompt": "  ret",
            "input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "n_predict": 4, "temperature": 0,
            "ignore_eos": True}
    b = tiny.post("/infill", json=body).json()
    want = infill_prompt(fim_llm.tokenizer, body["input_prefix"], body["input_suffix"], body["input_extra"],
                         body["prompt"], n_batch=FIM_BATCH, n_ctx=256)
    assert b["tokens_evaluated"] == len(want) and b["prompt"] == fim_llm.tokenizer.decode(want, special=True)
    assert b["tokens_predicted"] == 4 and b["stop_type"] == "limit"
    for bad in ({}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                {"filename": 123, "text": 456}):
        r = tiny.post("/infill", json={**body, "input_extra": [bad]})
        assert r.status_code == 400 and r.json()["error"]["code"] == 400
    assert tiny.post("/infill", json={"input_prefix": "a"}).status_code == 400  # no input_suffix


def test_infill_needs_fim_tokens(gemma):
    r = gemma.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501
    err = r.json()["error"]
    assert err["type"] == "not_supported_error" and "prefix token is missing" in err["message"]


# -- /props, /slots, /apply-template ----------------------------------------------------------------


def test_props(gemma, gemma_llm):
    p = gemma.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == 512 and p["total_slots"] == 2
    assert p["default_generation_settings"]["params"]["n_predict"] == -1
    assert p["default_generation_settings"]["params"]["temperature"] == 0.8
    assert p["model_path"] == str(gemma_llm.model.path) and p["chat_template"] == gemma_llm.template.source
    assert p["bos_token"] == "<bos>" and p["eos_token"] == "<eos>" and p["is_sleeping"] is False
    assert p["modalities"] == {"vision": False, "video": False, "audio": False} and p["build_info"]
    r = gemma.post("/props", json={})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


LONG = {"prompt": PROMPT, "n_predict": 120, "ignore_eos": True, "stream": True}  # a few seconds on Gemma


def test_slots(gemma):
    before = gemma.get("/slots").json()
    assert [s["id"] for s in before] == [0, 1] and not any(s["is_processing"] for s in before)
    assert all(s["n_ctx"] == 512 and s["speculative"] is False for s in before)
    assert gemma.get("/slots?fail_on_no_slot=1").status_code == 200
    with gemma.stream("POST", "/completion", json={**LONG, "id_slot": 1}) as r:
        lines = r.iter_lines()
        first = json.loads(next(line for line in lines if line)[6:])
        seen = {s["id"]: s["is_processing"] for s in gemma.get("/slots").json()}
        for _ in lines:
            pass
    assert first["id_slot"] == 1 and seen == {0: False, 1: True}
    after = {s["id"]: s for s in gemma.get("/slots").json()}
    assert after[1]["is_processing"] is False and after[1]["params"]["n_predict"] == 120
    assert after[1]["next_token"][0]["n_decoded"] == 120 and after[1]["n_prompt_tokens"] == len(tokenize(gemma, PROMPT))
    r = gemma.post("/slots/0?action=save", json={"filename": "x.bin"})
    assert r.status_code == 501 and r.json()["error"]["code"] == 501


def test_fail_on_no_slot(gemma):
    gate = threading.Barrier(3)
    statuses = []

    def busy():
        with gemma.stream("POST", "/completion", json=LONG) as r:
            lines = r.iter_lines()
            next(line for line in lines if line)
            gate.wait(timeout=60)
            gate.wait(timeout=60)
            for _ in lines:
                pass

    threads = [threading.Thread(target=busy) for _ in range(2)]
    for t in threads:
        t.start()
    gate.wait(timeout=60)
    statuses.append(gemma.get("/slots?fail_on_no_slot=1"))
    gate.wait(timeout=60)
    for t in threads:
        t.join()
    r = statuses[0]
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    assert gemma.get("/slots?fail_on_no_slot=1").status_code == 200


def test_apply_template(gemma, gemma_llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = gemma.post("/apply-template", json={"messages": messages})
    assert r.status_code == 200
    prompt = r.json()["prompt"]
    assert "Hi there" in prompt and prompt.endswith("<start_of_turn>model\n")
    ids = gemma_llm.tokenizer.encode(prompt, add_special=False, parse_special=True)
    assert ids == gemma_llm.encode_chat(messages)  # what /v1/chat/completions feeds the model
    bare = gemma.post("/apply-template", json={"messages": messages, "add_generation_prompt": False}).json()["prompt"]
    assert prompt.startswith(bare) and "<start_of_turn>model" not in bare
    bad = gemma.post("/apply-template", json={"messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400


# -- the front door ---------------------------------------------------------------------------------


def test_api_key_and_public_health(tiny):
    bare = {"Authorization": ""}
    for method, path in (("POST", "/completion"), ("POST", "/infill"), ("GET", "/props"), ("GET", "/slots"),
                         ("POST", "/apply-template"), ("POST", "/completions")):
        r = tiny.request(method, path, json={"prompt": "x"}, headers=bare)  # type: ignore[arg-type]
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == 401
    assert tiny.get("/v1/health", headers=bare).json()["status"] == "ok"
    assert tiny.get("/health", headers=bare).status_code == 200


# -- several models ---------------------------------------------------------------------------------


def test_several_models(tmp_path):
    """Without MODEL (model_router.py): /completion names its model in the body, /props and /slots in
    the query (llama-server's router); without one, /props is the router's and /slots a 400."""
    from helpers.api_fuzz import serve
    from helpers.server import raw

    server, name = serve(tmp_path, several=True)
    try:
        port = server.port
        status, _, props = raw(port, "GET", "/props")
        assert status == 200 and props["role"] == "router"
        status, _, props = raw(port, "GET", f"/props?model={name}")
        assert status == 200 and props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
        status, _, slots = raw(port, "GET", f"/slots?model={name}")
        assert status == 200 and [s["id"] for s in slots] == [0, 1]
        status, _, err = raw(port, "GET", "/slots")
        assert status == 400 and err["error"]["code"] == 400
        body = {"model": name, "prompt": "ab cd", "n_predict": 3, "ignore_eos": True}
        status, _, done = raw(port, "POST", "/completion", json.dumps(body).encode())
        assert status == 200 and done["tokens_predicted"] == 3 and done["stop_type"] == "limit"
        status, _, err = raw(port, "POST", "/completion", json.dumps({**body, "model": "nope"}).encode())
        assert status == 404 and err["error"]["type"] == "not_found_error"
        status, _, err = raw(port, "POST", "/infill", b"{not json")
        assert status == 400 and err["error"]["type"] == "invalid_request_error"
    finally:
        assert server.stop() == 0, server.output()
