"""Constrained output (engine/grammar.py): JSON mode, JSON Schema, GBNF and regex through the
engine on the embedded model; every output parses and validates; the allowed tokens agree with
llama.cpp's grammar sampler along real paths."""
from __future__ import annotations

import ctypes
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer.engine.engine import EngineConfig
from infer.engine.grammar import Grammar, GrammarError, with_thought
from infer.engine.llm import LLM
from infer.engine.sampler import SamplingParams

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def llm(gemma_path):
    return LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=4))


def generate(llm, prompt: str, grammar: Grammar, seed: int = 0, temperature: float = 0.8, max_tokens: int = 400):
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, grammar=grammar)
    events = list(llm.engine.generate(llm.encode_chat([{"role": "user", "content": prompt}]), params))
    return "".join(e.text for e in events), events[-1].finish_reason


# -------------------------------------------------------------------- schemas, generated

names = st.sampled_from(["id", "name", "city", "count", "tags", "ok", "score", "kind", "items", "note"])
scalars = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 1000)),
    # numbers on a grid (multipleOf) too; free decimals are capped at 16 digits, as llama.cpp's JSON
    # grammars cap them (test_json_numbers_take_at_most_16_digits_a_part)
    st.builds(lambda lo, span: {"type": "number", "minimum": lo, "maximum": lo + span, "multipleOf": 0.25},
              st.integers(-10, 10), st.integers(1, 100)),
    st.just({"type": "boolean"}),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["red", "green", "blue", 1, 2, None, True]),
                                                 min_size=1, max_size=4, unique=True)),
)


def objects(values):
    def build(props, n_required):
        keys = list(props)
        return {"type": "object", "properties": props, "required": keys[:n_required], "additionalProperties": False}
    return st.builds(build, st.dictionaries(names, values, min_size=1, max_size=4), st.integers(0, 4))


def arrays(values):
    return st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, values, st.integers(0, 4))


schemas = st.recursive(scalars, lambda inner: st.one_of(objects(inner), arrays(inner)), max_leaves=6).filter(
    lambda s: s.get("type") in ("object", "array"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**31))
def test_every_schema_output_validates(llm, schema, seed):
    text, finish = generate(llm, "Give an example value as JSON.", Grammar.json_schema(schema), seed=seed)
    assert finish == "stop", (schema, text)
    jsonschema.validate(json.loads(text), schema)


def test_json_mode_gives_an_object(llm):
    text, finish = generate(llm, "Describe a cat as JSON with a name and an age.", Grammar("json"), seed=3,
                            max_tokens=200)
    assert text.lstrip().startswith("{")
    if finish == "stop":  # any object: a small model may write one longer than max_tokens
        assert isinstance(json.loads(text), dict)


def test_gbnf_and_regex(llm):
    text, finish = generate(llm, "Is the sky blue?", Grammar("gbnf", 'root ::= ("yes" | "no") "." '), seed=1)
    assert text in ("yes.", "no.") and finish == "stop"
    for seed in range(3):
        text, finish = generate(llm, "Give a code.", Grammar("regex", r"[A-Z]{2}-[0-9]{3}"), seed=seed)
        assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", text) and finish == "stop"


def test_constrained_and_free_streams_share_a_batch(llm):
    # constraints are per request inside continuous batching: a free stream beside them is unchanged
    eng = llm.engine
    free = SamplingParams(temperature=0.0, max_tokens=24)
    prompt = llm.encode_chat([{"role": "user", "content": "Name three colours."}])
    alone = list(eng.generate(prompt, free))[-1].token_ids
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    ids = [eng.add_request(prompt, free), *(eng.add_request(prompt, SamplingParams(
        temperature=0.8, seed=s, max_tokens=24, grammar=Grammar.json_schema(schema))) for s in range(3))]
    while eng.has_work():
        eng.step()
    finals = [list(eng.stream(i))[-1] for i in ids]
    assert finals[0].token_ids == alone
    for f in finals[1:]:
        assert json.loads(llm.tokenizer.decode(f.token_ids))["n"] in range(10)


@pytest.mark.parametrize("grammar, message", [
    (lambda: Grammar("gbnf", 'root ::= "('), "invalid GBNF grammar"),
    (lambda: Grammar("gbnf", "root ::= missing"), "Rule 'missing' not found"),
    (lambda: Grammar("regex", "[0-9"), "invalid regex"),
    (lambda: Grammar.json_schema({"type": "nonsense"}), "invalid json schema"),
    (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.json_schema([1, 2]), "must be an object"),
    (lambda: Grammar("yaml", "x"), "unknown grammar kind"),
    (lambda: Grammar("gbnf", "  "), "is empty"),
])
def test_bad_grammars_are_clear_errors(llm, grammar, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        llm.engine.grammars.compile(grammar())


# -------------------------------------------------------------------- against llama.cpp's sampler

GBNF_CASES = {
    "object": ('root ::= "{" ws "\\"a\\"" ws ":" ws num ws "}"\nnum ::= [0-9]+\nws ::= [ ]?', '{ "a": 12 }'),
    "choice": ('root ::= ("yes" | "no" | "maybe") (", " word)*\nword ::= [a-z]+', "maybe, yes, no"),
    "list": ('root ::= item ("\\n" item){0,3}\nitem ::= "- " [A-Za-z ]{1,20}', "- Apples\n- Pears and plums"),
}


@pytest.mark.reference
@pytest.mark.parametrize("case", list(GBNF_CASES))
def test_allowed_tokens_agree_with_llama_cpp(llm, gemma_path, case):
    """At every state along a path through the grammar, the token spellings llama.cpp's grammar
    sampler allows are the ones we allow.  Spellings, not ids: where a vocabulary spells the same
    bytes twice (Gemma's byte token <0x61> and its 'a'), llguidance offers only one of them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    text, path_text = GBNF_CASES[case]
    tok = llm.tokenizer
    ref = llama_cpp.Llama(model_path=str(gemma_path), n_ctx=64, n_threads=2, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    V = llama_cpp.llama_vocab_n_tokens(vocab)
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    cells = (llama_cpp.llama_token_data * V)()

    def reference() -> np.ndarray:
        for i in range(V):
            cells[i].id, cells[i].logit, cells[i].p = i, 0.0, 0.0
        cur = llama_cpp.llama_token_data_array(data=cells, size=V, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        return np.array([cells[i].logit != float("-inf") for i in range(V)])

    spell = lambda ids: {tok.token_to_piece(int(i), special=True) for i in ids}
    matcher = llm.engine.grammars.compile(Grammar("gbnf", text)).matcher()
    states = 0
    for t in tok.encode(path_text, add_special=False) + [None]:
        ours, theirs = matcher.allowed_ids(), np.flatnonzero(reference())
        assert spell(ours) == spell(theirs), (case, states)
        states += 1
        if t is None:
            break
        llama_cpp.llama_sampler_accept(smpl, t)
        matcher.consume(t)
    assert states > 3
    llama_cpp.llama_sampler_free(smpl)


@pytest.mark.parametrize("fraction", [0.0005, 0.97])
def test_sampling_from_allowed_equals_sampling_masked_logits(fraction):
    """Sampling from a grammar's allowed ids draws exactly what the whole vocabulary with the
    others at -inf draws, for every stage (the engine masks wide sets so; few tokens: ids)."""
    from infer.engine.sampler import make_rng, make_sampler

    rng = np.random.default_rng(0)
    V = 5000
    for trial in range(20):
        logits = rng.normal(size=V).astype(np.float32) * 3
        mask = rng.random(V) < fraction
        mask[rng.integers(V)] = True
        masked = np.where(mask, logits, np.float32(-np.inf))
        history = rng.integers(0, V, 30).astype(np.int32)
        for params in (SamplingParams(temperature=0.0, repeat_penalty=1.3),
                       SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, seed=trial)):
            s = make_sampler(params)
            want = s(masked, history, make_rng(trial))
            assert mask[want]
            assert s(logits, history, make_rng(trial), np.flatnonzero(mask)) == want


def test_a_grammar_failing_mid_reply_ends_only_its_request(llm, monkeypatch):
    # llguidance may refuse mid-reply (one of its limits): that request stops, the others go on
    from infer.engine import grammar as gm

    real, seen = gm.GrammarMatcher.consume, []

    def flaky(self, token):
        seen.append(token)
        if len(seen) == 3:
            raise GrammarError("a limit was hit")
        return real(self, token)

    monkeypatch.setattr(gm.GrammarMatcher, "consume", flaky)
    eng = llm.engine
    prompt = llm.encode_chat([{"role": "user", "content": "Name three colours."}])
    ids = [eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)),
           eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=10,
                                                  grammar=Grammar("regex", "[A-Za-z ,.]{1,80}")))]
    while eng.has_work():
        eng.step()
    free, held = (list(eng.stream(i))[-1] for i in ids)
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    assert held.finish_reason == "stop" and len(held.token_ids) == 2


# -------------------------------------------------------------------- JSON numbers, bounded

CONFIDENCE = {"type": "object", "properties": {"answer": {"type": "string"},
                                               "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
              "required": ["answer", "confidence"], "additionalProperties": False}


def follows(llm, grammar: Grammar, text: str) -> bool:
    return llm.engine.grammars.compile(grammar).matcher().follow(text)


def test_json_numbers_take_at_most_16_digits_a_part(llm):
    """As llama.cpp's JSON grammars (json-schema-to-grammar's integral-part and decimal-part): 16
    digits before the point, 16 after it, 16 in the exponent; llguidance alone takes any number."""
    g = Grammar.json_schema(CONFIDENCE)
    head = '{"answer": "yes", "confidence": 0.'
    assert follows(llm, g, head + "7" * 16 + "}")
    assert not follows(llm, g, head + "7" * 17)
    m = llm.engine.grammars.compile(g).matcher()
    assert m.follow(head + "7" * 16)
    pieces = {llm.tokenizer.token_to_piece(int(i), special=True) for i in m.allowed_ids()}
    assert pieces and not any(p[:1].isdigit() for p in pieces) and b"}" in pieces  # no 17th digit; it can end
    assert follows(llm, g, head + "5, ") is False  # the schema still holds (no other keys)
    for text, ok in (('{"a": -1234567890123456.25e-1234567890123456}', True), ('{"a": 12345678901234567}', False),
                     ('{"a": 1.5e12345678901234567}', False), ('{"a": "0.12345678901234567890123"}', True),
                     ('{"a": [0.1234567890123456, {"b": 0.12345678901234567', False)):
        assert follows(llm, Grammar("json"), text) is ok, text  # JSON mode: numbers bounded, strings not
    # a schema inside a Lark grammar, and after a thought
    lark = Grammar("lark", 'start: "x=" value\nvalue: %json ' + json.dumps(CONFIDENCE))
    assert follows(llm, lark, "x=" + head + "7" * 16 + "}") and not follows(llm, lark, "x=" + head + "7" * 17)
    thought = with_thought(g, "think", False, json.dumps)
    assert follows(llm, thought, "<think>1234567890123456789</think>" + head + "7" * 16 + "}")
    assert not follows(llm, thought, "<think>hm</think>" + head + "7" * 17)
    with pytest.raises(GrammarError, match="infer_json"):
        llm.engine.grammars.compile(Grammar("lark", 'start: infer_json_value\ninfer_json_value: %json {"type": "number"}'))


def test_a_number_schema_ends_within_max_tokens(llm):
    """The held-out case: {"type": "number", "minimum": 0, "maximum": 1} let the embedded model
    write 0.8491691854554206760150969... until max_tokens (this seed, without the bound)."""
    text, finish = generate(llm, "Is the sky blue? Answer with your confidence.", Grammar.json_schema(CONFIDENCE),
                            seed=3, max_tokens=100)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), CONFIDENCE)
    assert len(re.search(r'"confidence":\s*[01]\.?([0-9]*)', text).group(1)) <= 16
