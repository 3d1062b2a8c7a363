"""Pooling heads and reranking: rank pooling's classification head and the Dense projections
after pooling (models/pooling_head.py, engine/pooling.py) against llama.cpp's; the reranking
prompt (engine/rerank.py); embeddings prefilled beside decoding (engine/scheduler.py); the
rerank routes (cli/server/rerank_api.py), alone and through the several-models router; and
`infer embed` / `infer rerank` (cli/embed.py)."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from helpers.cli import assert_one_line_error, infer
from helpers.embeddings import embed, llama_cpp_embed
from helpers.tiny_encoders import write_tiny_gemma_embedding
from helpers.tiny_models import write_tiny_model
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.engine.pooling import PoolingError, normalize
from infer.engine.rerank import RERANK_TEMPLATE_KEY
from infer.engine.sampler import SamplingParams
from infer.models.loader import load_model
from infer.models.weights import ModelLoadError

D = 256  # the tiny models' n_embd
# Qwen3-Reranker's template as its converter writes it, the tiny vocabulary's EOS as its special token
# (the tiny vocabulary has a token for each letter pair after a space: texts of those stay short)
TEMPLATE = "Q: {query}\nD: {document}</s>\nA:"
QUERY, DOCS = "ab cd ef gh", ["ab cd ef", "xy zz qq rr", "ef gh ab", "mm nn"]


def head_rows(seed: int, shape: tuple[int, int], scale: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, shape).astype(np.float32)


def reranker(w: gguf.GGUFWriter) -> None:
    """Qwen3-Reranker's additions, as llama.cpp's converter writes them: rank pooling, two labels,
    cls.output (here random rows where the real one has lm_head's "yes" and "no"), the template."""
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_string(RERANK_TEMPLATE_KEY, TEMPLATE)
    w.add_tensor("cls.output.weight", head_rows(5, (2, D), 0.05))


def embedder(w: gguf.GGUFWriter) -> None:
    """Qwen3-Embedding's: last-token pooling, the end-of-text token added to every text."""
    w.add_pooling_type(gguf.PoolingType.LAST)
    w.add_add_eos_token(True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerank")
    return {"reranker": write_tiny_model(d / "tiny-reranker.gguf", "qwen3", extra=reranker),
            "embedder": write_tiny_model(d / "tiny-embedder.gguf", "qwen3", extra=embedder),
            "plain": write_tiny_model(d / "tiny-plain.gguf", "qwen3"),
            "encoder": write_tiny_gemma_embedding(d / "tiny-encoder.gguf", seed=23)}


# ---------------------------------------------------------------- heads against llama.cpp

def test_qwen3_reranker_scores_match_llama_cpp(models, llama_cpp):
    llm = LLM.load(models["reranker"], EngineConfig(n_ctx=128, n_threads=2))
    assert llm.engine.pooling == "rank" and llm.engine.n_out == 2
    prompts = [llm.encode_rerank(QUERY, d) for d in DOCS]
    # the prompt: the template filled in, special tokens parsed, none added (format_prompt_rerank)
    ref = llama_cpp.Llama(str(models["reranker"]), vocab_only=True, verbose=False)
    for d, p in zip(DOCS, prompts):
        text = TEMPLATE.replace("{query}", QUERY).replace("{document}", d)
        assert p == ref.tokenize(text.encode(), add_bos=False, special=True)
        assert 2 in p  # </s> as the EOS token
    ours = embed(llm, prompts)
    theirs = llama_cpp_embed(models["reranker"], "rank", prompts, n_ctx=128, n=2)
    for o, t in zip(ours, theirs):
        print("ours", o, "llama.cpp", t)
        assert abs(o.sum() - 1) < 1e-5  # the softmax over ("yes", "no") (qwen3's)
        # within the hidden states' own agreement (q8_0 matrices: llama.cpp rounds their inputs to
        # 8 bits, test_embeddings.py's bound), the score's logit moves 6e-5 at most here
        np.testing.assert_allclose(o, t, atol=2e-4)
    assert len({round(float(o[0]), 3) for o in ours}) == len(DOCS)  # scores that tell the documents apart


def test_qwen3_embedding_matches_llama_cpp(models, llama_cpp):
    """Qwen3-Embedding: qwen3 with last-token pooling over text and its end-of-text token."""
    llm = LLM.load(models["embedder"], EngineConfig(n_ctx=128, n_threads=2))
    assert llm.engine.pooling == "last" and llm.engine.head is None
    prompts = [llm.encode_raw(t) for t in DOCS]
    assert all(p[-1] == 2 for p in prompts)
    ours = embed(llm, prompts)
    theirs = llama_cpp_embed(models["embedder"], "last", prompts, n_ctx=128)
    for o, t in zip(ours, theirs):
        cos = float(normalize(o) @ normalize(t.astype(np.float32)))
        print(f"cosine distance {1 - cos:.2e}")
        assert 1 - cos < 1e-5


def test_dense_projection_after_pooling_matches_llama_cpp(tmp_path, llama_cpp):
    """sentence-transformers' Dense module after pooling (build_dense_out), as LFM2's files have it."""
    def dense(w):
        w.add_pooling_type(gguf.PoolingType.MEAN)
        w.add_uint32("lfm2.embedding_length_out", 128)
        w.add_tensor("dense_2.weight", head_rows(7, (128, D), 0.1))
        w.add_tensor("dense_2.bias", head_rows(8, (1, 128), 0.1).reshape(128))

    path = write_tiny_model(tmp_path / "tiny-lfm2-dense.gguf", "lfm2", extra=dense)
    llm = LLM.load(path, EngineConfig(n_ctx=128, n_threads=2))
    assert llm.engine.n_out == 128
    prompts = [llm.encode_raw(t) for t in DOCS[:2]]
    ours = embed(llm, prompts)
    theirs = llama_cpp_embed(path, "mean", prompts, n_ctx=128, n=128)
    for o, t in zip(ours, theirs):
        assert o.shape == (128,)
        np.testing.assert_allclose(o, t, atol=1e-5 * np.abs(t).max())


def test_classifier_head_as_llama_cpp_builds_it(tmp_path):
    """cls (+bias) -> tanh -> cls.norm -> cls.output (+bias), on the first row of a non-causal model
    (BERT rerankers; llama.cpp's build_pooling), computed here in float64 from the file's weights."""
    from dataclasses import replace

    from infer.engine.pooling import apply_head, row_pooling

    def head(w):
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_tensor("cls.weight", head_rows(1, (D, D), 0.05))
        w.add_tensor("cls.bias", head_rows(2, (1, D), 0.1).reshape(D))
        w.add_tensor("cls.norm.weight", 1 + head_rows(3, (1, D), 0.1).reshape(D))
        w.add_tensor("cls.output.weight", head_rows(4, (1, D), 0.2))
        w.add_tensor("cls.output.bias", np.array([0.25], np.float32))

    model = load_model(write_tiny_model(tmp_path / "tiny-cls.gguf", "llama", extra=head))
    h = model.weights.head
    assert h is not None and h.ranks and not h.softmax and h.out_dim(D, True) == 1
    x = np.random.default_rng(0).normal(0, 1, D).astype(np.float32)
    y = np.tanh(h.cls.astype(np.float64) @ x + h.cls_b)
    y = (y - y.mean()) / np.sqrt(y.var() + h.norm_eps) * h.cls_norm
    want = h.cls_out.astype(np.float64) @ y + h.cls_out_b
    np.testing.assert_allclose(apply_head(h, "rank", x), want, rtol=1e-5)
    np.testing.assert_array_equal(apply_head(h, "mean", x), x)  # the classifier is rank pooling's only
    assert row_pooling("rank", causal=True) == "last" and row_pooling("rank", causal=False) == "cls"
    assert row_pooling("rank", causal=False, pooling_cls="mean") == "mean" and row_pooling("cls", True) == "cls"
    gelu = apply_head(replace(h, gelu=True, cls_norm=None, cls_out=None, cls_out_b=None), "rank", x)
    z = h.cls.astype(np.float64) @ x + h.cls_b
    np.testing.assert_allclose(gelu, 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))), atol=1e-5)


def test_head_tensors_that_do_not_fit_are_refused(tmp_path):
    def bad(w):
        w.add_tensor("cls.output.weight", head_rows(1, (2, D + 1)))

    with pytest.raises(ModelLoadError, match="'cls.output.weight' has shape"):
        load_model(write_tiny_model(tmp_path / "bad.gguf", "qwen3", extra=bad))

    def orphan(w):
        w.add_tensor("dense_2.bias", np.zeros(8, np.float32))

    with pytest.raises(ModelLoadError, match="'dense_2.bias' without 'dense_2.weight'"):
        load_model(write_tiny_model(tmp_path / "orphan.gguf", "qwen3", extra=orphan))

    def unhead(w):
        w.add_pooling_type(gguf.PoolingType.RANK)

    llm = LLM.load(write_tiny_model(tmp_path / "nohead.gguf", "qwen3", extra=unhead), EngineConfig(n_ctx=64))
    with pytest.raises(PoolingError, match="rank pooling needs a classification head"):
        llm.engine.add_embedding([1, 2, 3])


def test_rerank_prompt_without_a_template(tmp_path):
    """[BOS] query [EOS] [SEP] document [EOS], each where the vocabulary's flags ask for it."""
    from infer.engine.rerank import rerank_prompt

    def flags(w):
        w.add_add_eos_token(True)
        w.add_add_sep_token(True)
        w.add_sep_token_id(3)

    llm = LLM.load(write_tiny_model(tmp_path / "sep.gguf", "qwen3", extra=flags), EngineConfig(n_ctx=64))
    tok = llm.tokenizer
    q, d = tok.encode("ab cd", add_special=False), tok.encode("ef", add_special=False)
    assert llm.encode_rerank("ab cd", "ef") == [1, *q, 2, 3, *d, 2]
    tok.add_bos = tok.add_eos = tok.add_sep = False
    assert rerank_prompt(tok, None, "ab cd", "ef") == [*q, *d]
    assert rerank_prompt(tok, "{query}|{document}|{query}", "x{document}", "y") == \
        tok.encode("xy|y|xy", add_special=False, parse_special=True)  # {query} first, then {document}


# ---------------------------------------------------------------- embeddings beside decoding

def test_a_decoding_sequence_gets_its_token_every_step_beside_64_embeddings(models):
    llm = LLM.load(models["embedder"], EngineConfig(n_ctx=128, n_threads=2, max_seqs=2, max_batch_tokens=48))
    eng = llm.engine
    gen = eng.add_request([1, 5, 77, 300], SamplingParams(max_tokens=60, temperature=0), keep_events=False)
    eng.step()  # its prompt; it decodes from now on
    rids = {eng.add_embedding([1, *range(10 + i, 20 + i), 2]) for i in range(64)}  # 12 tokens each
    done: set[int] = set()
    per_step = []
    while rids - done:
        events = eng.step()
        assert [e.request_id for e in events if e.token_id is not None] == [gen]  # its token, every step
        finished = {e.request_id for e in events if e.embedding is not None}
        per_step.append(len(finished))
        done |= finished
    # 47 tokens of the budget left beside the decoding one: 3 whole prompts a step (max_seqs 2 held by
    # nothing but the decoding sequence and one), 64 in 22 steps
    assert max(per_step) == 3 and len(per_step) == 22, per_step
    assert eng.num_running() == 1


def test_the_inputs_of_one_request_prefill_in_one_step(models):
    # the KV pool (--parallel 2 contexts of 512) holds the 8 prompts at once, the budget their tokens
    llm = LLM.load(models["reranker"], EngineConfig(n_ctx=512, n_threads=2, max_seqs=2, max_batch_tokens=512))
    eng = llm.engine
    prompts = [llm.encode_rerank(QUERY, d) for d in DOCS * 2]
    assert sum(map(len, prompts)) <= 512
    rids = [eng.add_embedding(p) for p in prompts]
    events = eng.step()
    assert sorted(e.request_id for e in events if e.embedding is not None) == rids  # 8 > max_seqs, one step
    alone = embed(LLM.load(models["reranker"], EngineConfig(n_ctx=128, n_threads=2)), prompts[:1])[0]
    first = next(e for e in events if e.request_id == rids[0])
    np.testing.assert_array_equal(first.embedding, alone)  # side by side is the same as alone


# ---------------------------------------------------------------- over HTTP

def app_of(path, model_id: str, llm: LLM | None = None):
    """`infer serve MODEL`'s app, in this process (TestClient runs its lifespan: the engine's loop)."""
    from infer.cli.server.openai_server import ServerConfig, create_app

    llm = llm or LLM.load(path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=2))
    return create_app(llm, ServerConfig(model_id=model_id))


@pytest.fixture(scope="module")
def reranking(models):
    from starlette.testclient import TestClient

    with TestClient(app_of(models["reranker"], "tiny-reranker")) as client:
        yield client


def reference_scores(models) -> list[float]:
    llm = LLM.load(models["reranker"], EngineConfig(n_ctx=256, n_threads=2))
    return [float(v[0]) for v in embed(llm, [llm.encode_rerank(QUERY, d) for d in DOCS])]


def test_rerank_routes(reranking, models):
    scores = reference_scores(models)
    best = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    n_tokens = sum(len(LLM.load(models["reranker"], EngineConfig(n_ctx=256)).encode_rerank(QUERY, d)) for d in DOCS)
    r = reranking.post("/v1/rerank", json={"model": "tiny-reranker", "query": QUERY, "documents": DOCS, "top_n": 3,
                                           "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny-reranker" and body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert [x["index"] for x in body["results"]] == best[:3]  # best first, the first top_n
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(scores[x["index"]], abs=1e-6)
        assert x["document"] == {"text": DOCS[x["index"]]}
    for path in ("/rerank", "/v1/reranking", "/reranking"):  # llama-server's other names; Jina's {"text"} documents
        r = reranking.post(path, json={"query": QUERY, "documents": [{"text": d} for d in DOCS]})
        assert r.status_code == 200, (path, r.text)
        results = r.json()["results"]
        assert [x["index"] for x in results] == best and all("document" not in x for x in results)
    tei = reranking.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [x["index"] for x in tei] == best  # TEI's: a list of {index, score, text}
    assert all(set(x) == {"index", "score", "text"} and x["text"] == DOCS[x["index"]] for x in tei)


def test_rerank_refusals(reranking, models):
    from starlette.testclient import TestClient

    def refused(body, status: int = 400, path: str = "/v1/rerank") -> dict:
        r = reranking.post(path, json=body)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
        return r.json()["error"]

    assert refused({"documents": DOCS})["param"] == "query"
    assert refused({"query": 5, "documents": DOCS})["param"] == "query"
    for docs in ([], "x", [5], [{"txt": "a"}], None):
        assert refused({"query": QUERY, "documents": docs})["param"] == "documents"
    assert refused({"query": QUERY, "texts": []})["param"] == "texts"
    assert refused({"query": QUERY, "documents": DOCS, "top_n": 0})["param"] == "top_n"
    assert refused({"query": QUERY, "documents": DOCS, "return_documents": "yes"})["param"] == "return_documents"
    assert refused({"query": QUERY, "documents": ["ab " * 200]})["code"] == "context_length_exceeded"
    assert refused({"model": 5, "query": QUERY, "documents": DOCS})["param"] == "model"
    # one model served: any name is it, as llama-server takes it (tests/test_server_compat.py)
    r = reranking.post("/v1/rerank", json={"model": "nope", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200 and r.json()["model"] == "tiny-reranker"
    # a reranker's outputs are scores: the embeddings routes send its clients to /v1/rerank
    assert "/v1/rerank" in refused({"input": "ab"}, path="/v1/embeddings")["message"]
    r = reranking.post("/api/embed", json={"model": "tiny-reranker", "input": "ab"})
    assert r.status_code == 400 and "tiny-reranker" in r.json()["error"]
    # a model that is no reranker: a 400 that names it
    with TestClient(app_of(models["plain"], "tiny-plain")) as plain:
        r = plain.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
        assert "'tiny-plain' is not a reranker" in r.json()["error"]["message"]


def test_an_encoder_is_served_for_embeddings_and_refuses_to_generate(models):
    """An encoder (EmbeddingGemma's gemma-embedding, ModelConfig.causal False) served alone:
    /v1/embeddings gives the engine's vectors, the generation routes are a 400."""
    from starlette.testclient import TestClient

    llm = LLM.load(models["encoder"], EngineConfig(n_ctx=256, n_threads=2))
    assert not llm.model.config.causal
    want = [normalize(v) for v in embed(llm, [llm.encode_raw(t) for t in DOCS])]
    with TestClient(app_of(models["encoder"], "tiny-encoder")) as client:
        r = client.post("/v1/embeddings", json={"input": DOCS})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], want, atol=1e-6)
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "ab"})):
            r = client.post(path, json=body)
            assert r.status_code == 400 and "is an embedding model" in r.json()["error"]["message"], r.text
        r = client.post("/api/generate", json={"model": "tiny-encoder", "prompt": "ab", "stream": False})
        assert r.status_code == 400 and "is an embedding model" in r.json()["error"]


def test_an_embeddings_request_counts_once_against_the_queue(models):
    """--max-queue counts requests: the inputs of an embeddings request wait in the engine as
    sequences of their own, yet the request is one (4 clients of 32 inputs each are not 128
    requests); one request past the queue is still a 503."""
    import asyncio

    from infer.cli.server.embeddings_api import EmbeddingsAPI
    from infer.cli.server.ollama_api import OllamaAPI
    from infer.cli.server.openai_request import APIError
    from infer.cli.server.service import EngineService, ServerConfig

    llm = LLM.load(models["embedder"], EngineConfig(n_ctx=256, n_threads=2, max_seqs=1))
    service = EngineService(llm, ServerConfig(model_id="tiny-embedder", max_queue=1))
    api = EmbeddingsAPI(service, OllamaAPI(service))
    prompts = [llm.encode_raw(t) for t in DOCS]

    class Staying:  # a client that stays connected
        async def receive(self):
            await asyncio.Event().wait()

    async def run():  # the engine is not started: every input waits
        first = asyncio.ensure_future(api.vectors(Staying(), prompts))
        await asyncio.sleep(0.05)
        assert llm.engine.num_waiting() == len(DOCS)
        second = asyncio.ensure_future(api.vectors(Staying(), prompts))  # the queue's one, beside the free slot's
        await asyncio.sleep(0.05)
        assert not second.done() and llm.engine.num_waiting() == 2 * len(DOCS)
        with pytest.raises(APIError) as refused:
            await api.vectors(Staying(), prompts)
        assert refused.value.status == 503
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        assert api.extra_inputs == 0

    asyncio.run(run())


def test_an_embedding_model_and_a_reranker_served_together(models, tmp_path, monkeypatch):
    """Several models (`infer serve` without MODEL): each request runs on the model it names, an
    encoder's and a reranker's beside a chat model's."""
    from datetime import datetime, timezone

    from starlette.testclient import TestClient

    from infer.cli.server.model_pool import ModelPool
    from infer.cli.server.model_router import Catalog, ModelRouter
    from infer.cli.server.openai_server import ServerConfig, create_app
    from infer.cli.server.server_metrics import Metrics
    from infer.models.store import ModelStore, StoredModel

    monkeypatch.setenv("INFER_HOME", str(tmp_path / "home"))
    store = ModelStore()
    for name in ("reranker", "embedder", "encoder", "plain"):
        path = models[name]
        store.add(StoredModel(f"acme/{name}:Q8_0", f"acme/{name}", "Q8_0", "0" * 40, "gguf", str(path),
                              (path.name,), path.stat().st_size, datetime.now(timezone.utc).isoformat()))
    metrics = Metrics()

    def build(name, path):
        llm = LLM.load(path, EngineConfig(n_ctx=256, n_threads=2, max_seqs=2))
        return llm, create_app(llm, ServerConfig(model_id=name, any_name=True), metrics, own_lifespan=False)

    router = ModelRouter(ModelPool(build, lambda p: 0, max_models=4), Catalog(models["plain"]), metrics,
                         max_body=2**20, n_ctx=256)
    with TestClient(router) as client:
        r = client.post("/v1/rerank", json={"model": "acme/reranker:Q8_0", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        assert [x["relevance_score"] for x in r.json()["results"]] == pytest.approx(
            sorted(reference_scores(models), reverse=True), abs=1e-6)
        r = client.post("/v1/embeddings", json={"model": "acme/embedder:Q8_0", "input": DOCS})
        assert r.status_code == 200 and len(r.json()["data"]) == len(DOCS)
        r = client.post("/rerank", json={"model": "acme/embedder:Q8_0", "query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and "'acme/embedder:Q8_0' is not a reranker" in r.json()["error"]["message"]
        r = client.post("/v1/embeddings", json={"model": "acme/encoder:Q8_0", "input": DOCS})
        assert r.status_code == 200 and len(r.json()["data"]) == len(DOCS)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = client.post("/v1/chat/completions", json={"model": "acme/plain:Q8_0", **chat})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
        r = client.post("/v1/chat/completions", json={"model": "acme/encoder:Q8_0", **chat})
        assert r.status_code == 400 and "is an embedding model" in r.json()["error"]["message"]


# ---------------------------------------------------------------- the command line

def test_infer_embed(models, tmp_path):
    llm = LLM.load(models["embedder"], EngineConfig(n_ctx=256, n_threads=2))
    want = [normalize(v) for v in embed(llm, [llm.encode_raw(t) for t in DOCS[:2]])]
    args = ("--ctx", "256", "--threads", "2")
    r = infer("embed", str(models["embedder"]), *DOCS[:2], *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    for line, w in zip(lines, want):
        np.testing.assert_allclose(np.array(line.split(), np.float64), w, atol=1e-7)
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{DOCS[0]}\n\n{DOCS[1]}\n")  # one a line, blank lines skipped
    from_file = infer("embed", str(models["embedder"]), "-f", str(texts), "--json", *args)
    assert from_file.returncode == 0, from_file.stderr
    out = json.loads(from_file.stdout)
    assert out["model"] == "tiny-embedder"
    np.testing.assert_allclose(out["embeddings"], want, atol=1e-7)
    raw = infer("embed", str(models["embedder"]), "--no-normalize", *args, input=DOCS[0] + "\n")
    v = np.array(raw.stdout.split(), np.float64)
    assert raw.returncode == 0 and np.linalg.norm(v) > 1.5
    np.testing.assert_allclose(v / np.linalg.norm(v), want[0], atol=1e-6)
    assert_one_line_error(infer("embed", str(models["embedder"]), *args, input="\n\n"), "nothing to embed")
    assert_one_line_error(infer("embed", str(models["reranker"]), "ab", *args), "is a reranker")
    assert_one_line_error(infer("embed", str(models["embedder"]), "ab " * 300, *args), "context holds")
    assert infer("embed", str(models["embedder"]), "ab", "-f", str(texts)).returncode == 2  # a usage error


def test_infer_rerank(models):
    scores = reference_scores(models)
    r = infer("rerank", str(models["reranker"]), QUERY, *DOCS, "--ctx", "256", "--threads", "2")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert [d for _, d in rows] == [DOCS[i] for i in order]
    assert [float(s) for s, _ in rows] == pytest.approx([scores[i] for i in order], abs=1e-6)
    j = json.loads(infer("rerank", str(models["reranker"]), QUERY, *DOCS, "--json", "--top-n", "1").stdout)
    assert j["results"] == [{"index": order[0], "relevance_score": pytest.approx(scores[order[0]], abs=1e-6),
                             "document": {"text": DOCS[order[0]]}}]
    assert_one_line_error(infer("rerank", str(models["plain"]), QUERY, "ab"), "is not a reranker")
