"""A forced tool call (tool_choice "required" or a named function) of a model that thinks: its
grammar lets one thought in the family's markers come first (or, where the prompt opened the
thought, its rest up to the close), then holds the call as before; free text after the thought is
refused.  As llama.cpp's per-format parsers (common/chat-auto-parser-generator.cpp's optional
reasoning before the tools, common/parsers/gemma4.cpp, ministral3.cpp, gpt-oss.cpp)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from infer.cli.server import openai_chat
from infer.cli.server.openai_request import parse_job
from infer.engine import gemma4_format
from infer.engine.engine import EngineConfig
from infer.engine.grammar import Grammar, GrammarError, with_thought
from infer.engine.llm import LLM
from infer.engine.tool_calls import grammar, marker, parse_tools

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"]}}}
# per reasoning style: a tool-call family its models write, a thought, and one call
CASES = {
    "think": ("hermes", "<think>2 and 3 make 5.</think>\n\n",
              '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'),
    "mistral": ("mistral_args", "[THINK]2 and 3 make 5.[/THINK]", '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'),
    "gemma4": ("gemma4", "<|channel>thought\n2 and 3 make 5.<channel|>", "<|tool_call>call:add{a:2,b:3}<tool_call|>"),
    "harmony": ("generic", "<|channel|>analysis<|message|>2 and 3 make 5.<|end|><|start|>assistant<|channel|>final"
                "<|message|>", '{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}'),
}
# a Qwen3-like template with tools, thinking (opened: the generation prompt opens the <think>)
QWEN_THINKS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{%- if tools %}<tool_call></tool_call>{% endif %}"
               "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if opened %}<think>\n{% endif %}{% endif %}"
               "{# </think> #}")


@pytest.fixture(scope="module")
def llm(gemma_path):
    return LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=2))


def _takes(compiled, text: str, tok) -> tuple[bool, bool]:
    """(whether the grammar takes the text token by token, as sampling would, whether it is then done)."""
    m = compiled.matcher()
    for t in tok.encode(text, add_special=False, parse_special=True):
        if t not in set(m.allowed_ids().tolist()):
            return False, False
        m.consume(t)
    return True, m.done


def _follows(compiled, text: str) -> tuple[bool, bool]:
    m = compiled.matcher()
    return m.follow(text), m.done


@pytest.mark.parametrize("kind", list(CASES))
def test_forced_grammar_takes_a_thought_then_the_call(llm, kind):
    """Thought + call and a bare call are taken (and end the grammar); free text after the thought,
    or before the call, is refused."""
    fam, thought, call = CASES[kind]
    tok = llm.tokenizer
    g, _ = grammar(parse_tools([ADD]), fam, "required", None, False, tok.token_id)
    compiled = llm.engine.grammars.compile(with_thought(g, kind, False, lambda t: marker(t, tok.token_id)))
    assert _follows(compiled, thought + call) == (True, True)
    assert _follows(compiled, call) == (True, True)
    assert not _follows(compiled, thought + "The sum is 5.")[0]
    assert not _follows(compiled, "Sure. " + call)[0]
    assert not _follows(compiled, thought + thought + call)[0]  # one thought


def test_prompt_opened_thought_must_close_first(llm):
    """Where the prompt opened the <think>, the reply is its rest up to </think>, then the call: a
    call written before the close is still thinking (the grammar is not done)."""
    tok = llm.tokenizer
    fam, _, call = CASES["think"]
    g, _ = grammar(parse_tools([ADD]), fam, "required", None, False, tok.token_id)
    compiled = llm.engine.grammars.compile(with_thought(g, "think", True, lambda t: marker(t, tok.token_id)))
    assert _follows(compiled, "2 and 3.</think>\n\n" + call) == (True, True)
    assert _follows(compiled, "</think>" + call) == (True, True)
    assert _follows(compiled, call) == (True, False)
    assert not _follows(compiled, "2 and 3.</think>\n\nThe sum is 5.")[0]


@pytest.mark.reference
def test_with_gemma4s_own_tokens():
    """With Gemma 4's vocabulary (llama.cpp's ggml-vocab-gemma-4.gguf) the channel markers are tokens
    of their own: the grammar takes them as such, the thought's text between them free."""
    from helpers.llama_vocab import vocab_dir
    from infer.engine.grammar import GrammarCompiler
    from infer.engine.tokenizer import Tokenizer
    from infer.models.gguf_file import read_gguf

    tok = Tokenizer.from_metadata(read_gguf(vocab_dir() / "ggml-vocab-gemma-4.gguf").metadata)
    assert all(tok.token_id(m) is not None for m in ("<|channel>", "<channel|>", gemma4_format.OPEN))
    g, _ = grammar(parse_tools([ADD]), "gemma4", "required", None, False, tok.token_id)
    g = with_thought(g, "gemma4", False, lambda t: marker(t, tok.token_id))
    assert f"<[{tok.token_id('<channel|>')}]>" in g.source
    compiled = GrammarCompiler(tok).compile(g)
    _, thought, call = CASES["gemma4"]
    assert _takes(compiled, thought.replace("make", "<make>") + call, tok) == (True, True)
    assert _takes(compiled, call, tok) == (True, True)
    assert not _takes(compiled, thought + "The sum", tok)[0]


def test_with_thought_wraps_json_and_refuses_what_it_cannot():
    """A JSON grammar goes inside as %json (the generic family's forced call); a regex or GBNF
    grammar, or a Lark one that already names the rules, is refused with a clear error."""
    g = with_thought(Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}), "think",
                     False, lambda t: json.dumps(t))
    assert g.kind == "lark" and "held: %json" in g.source and '"additionalProperties": false' in g.source
    for bad in (Grammar("regex", "a+"), Grammar("gbnf", 'root ::= "a"'), Grammar("lark", "start: thought\nthought: \"a\"")):
        with pytest.raises(GrammarError):
            with_thought(bad, "think", False, lambda t: json.dumps(t))


def _plan(body: dict, template: str, fmt: str = "deepseek"):
    msgs = body["messages"]
    return openai_chat.plan(body, msgs, template, fmt, parse_job(body, None), lambda t: None)


def test_only_held_replies_of_thinking_models_with_thinking_on():
    """The thought is let in for "required", a named function and a JSON response format, with
    --reasoning-format deepseek and thinking not turned off; "auto", "none", reasoning-format none,
    enable_thinking false and models that do not think keep their grammars as they were."""
    msgs = [{"role": "user", "content": "2 + 3?"}]
    base = {"messages": msgs, "tools": [ADD]}
    named = {"type": "function", "function": {"name": "add"}}
    for choice in ("required", named):
        assert _plan({**base, "tool_choice": choice}, QWEN_THINKS)[0].thought
    assert not _plan({**base, "tool_choice": "auto"}, QWEN_THINKS)[0].thought
    assert not _plan({**base, "tool_choice": "none"}, QWEN_THINKS)[0].thought
    assert not _plan({**base, "tool_choice": "required"}, QWEN_THINKS, "none")[0].thought
    off = {**base, "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": False}}
    assert not _plan(off, QWEN_THINKS)[0].thought
    plain = QWEN_THINKS.replace("<think>", "").replace("</think>", "")
    plan, g = _plan({**base, "tool_choice": "required"}, plain)
    assert not plan.thought
    job = parse_job({**base, "tool_choice": "required"}, None)
    assert openai_chat.constrain(job, plan, g, False)[0].params.grammar == g  # unchanged
    # a JSON response format takes a thought first too (llama.cpp's parsers put the optional reasoning
    # before the response format's JSON); a GBNF grammar stays the client's whole reply, thought included
    fmt = {"messages": msgs, "response_format": {"type": "json_object"}}
    plan, g = _plan(fmt, QWEN_THINKS)
    assert g is None and plan.thought
    job, opened = openai_chat.constrain(parse_job(fmt, None), plan, g, True)
    assert job.params.grammar.kind == "lark" and "held: %json" in job.params.grammar.source and opened
    assert not _plan({**fmt, "chat_template_kwargs": {"enable_thinking": False}}, QWEN_THINKS)[0].thought
    gbnf = {"messages": msgs, "grammar": 'root ::= "yes"'}
    plan, g = _plan(gbnf, QWEN_THINKS)
    job, opened = openai_chat.constrain(parse_job(gbnf, None), plan, g, True)
    assert not plan.thought and job.params.grammar.kind == "gbnf" and opened  # it spells the thought itself


@pytest.mark.parametrize("opened", [False, True])
def test_chat_plan_end_to_end(llm, opened):
    """Through the chat endpoint's steps (plan, encode, constrain, the reply split as streamed): the
    real model's reply under the forced grammar parses to one call; a reply that thinks first, fed
    token by token through the same compiled grammar, is taken, and comes apart into reasoning_content
    and the call, with no content."""
    tok = llm.tokenizer
    msgs = [{"role": "user", "content": "What is 2 + 3? Call add."}]
    body = {"messages": msgs, "tools": [ADD], "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 80, "seed": 1}
    from infer.engine.chat_template import ChatTemplate

    real = llm.template
    llm.template = ChatTemplate(QWEN_THINKS)
    try:
        job = parse_job(body, None)
        plan, g = openai_chat.plan(body, msgs, QWEN_THINKS, "deepseek", job, tok.token_id)
        plan = replace(plan, variables={**plan.variables, "opened": opened})
        ids, was_opened = openai_chat.encode(llm, plan)
        assert was_opened == opened and plan.thought
        job, now_opened = openai_chat.constrain(job, plan, g, was_opened, tok.token_id)
        assert now_opened == opened and job.params.grammar_triggers == () and job.params.special
        compiled = llm.engine.grammars.compile(job.params.grammar)
        _, thought, call = CASES["think"]
        scripted = (thought[len("<think>"):] if opened else thought) + call
        assert _takes(compiled, scripted, tok) == (True, True)
        replies = [scripted]
        if not opened:  # the model alone (it does not close a thought it starts within the budget)
            events = list(llm.engine.generate(ids, job.params))
            assert events[-1].finish_reason == "stop"
            replies.append("".join(e.text for e in events))
    finally:
        llm.template = real
    for text in replies:
        for size in (1, 5, 1000):
            r = openai_chat.ChatReply(plan, now_opened)
            parts = [r.feed(text[i:i + size]) for i in range(0, len(text), size)]
            reasoning, content, calls = r.finish()
            reasoning = "".join(p[0] for p in parts) + reasoning
            assert "".join(p[1] for p in parts) + content == "", text
            assert [c.name for c in calls] == ["add"] and set(json.loads(calls[0].arguments)) == {"a", "b"}
            if text is scripted:
                assert reasoning == "2 and 3 make 5." and json.loads(calls[0].arguments) == {"a": 2, "b": 3}


@pytest.mark.parametrize("kind", ["gemma4", "harmony"])
def test_chat_plan_other_styles(llm, kind):
    """Gemma 4's template (thinking on) and a harmony one through plan and constrain: the forced grammar
    takes the style's thought and the call, and the reply comes apart into reasoning_content and the call."""
    from test_tool_calls import HARMONY

    tok = llm.tokenizer
    template = gemma4_format.TEMPLATE if kind == "gemma4" else HARMONY
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    body = {"messages": msgs, "tools": [ADD], "tool_choice": "required", "parallel_tool_calls": False,
            "chat_template_kwargs": {"enable_thinking": True}}
    job = parse_job(body, None)
    plan, g = openai_chat.plan(body, msgs, template, "deepseek", job, tok.token_id)
    assert plan.reasoning == kind and plan.thought
    job, opened = openai_chat.constrain(job, plan, g, False, tok.token_id)
    compiled = llm.engine.grammars.compile(job.params.grammar)
    fam, thought, call = CASES[kind]
    assert plan.family == fam and _takes(compiled, thought + call, tok) == (True, True)
    assert not _takes(compiled, thought + "Five.", tok)[0]
    r = openai_chat.ChatReply(plan, opened)
    text = thought + call
    parts = [r.feed(text[i:i + 3]) for i in range(0, len(text), 3)]
    reasoning, content, calls = r.finish()
    assert "".join(p[0] for p in parts) + reasoning == "2 and 3 make 5."
    assert "".join(p[1] for p in parts) + content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]


@pytest.mark.reference
@pytest.mark.parametrize("opened", [False, True])
def test_with_qwen35s_tokens(opened):
    """With Qwen3.5's vocabulary (llama.cpp's ggml-vocab-qwen35.gguf), token by token as sampling
    goes: thought + XML call taken and done, a bare call taken (done only where no thought is open),
    text after the thought refused."""
    from helpers.llama_vocab import vocab_dir
    from infer.engine.grammar import GrammarCompiler
    from infer.engine.tokenizer import Tokenizer
    from infer.models.gguf_file import read_gguf

    tok = Tokenizer.from_metadata(read_gguf(vocab_dir() / "ggml-vocab-qwen35.gguf").metadata)
    g, _ = grammar(parse_tools([ADD]), "qwen3coder", "required", None, False, tok.token_id)
    compiled = GrammarCompiler(tok).compile(with_thought(g, "think", opened, lambda t: marker(t, tok.token_id)))
    call = ("<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
            "</function>\n</tool_call>")
    thought = ("" if opened else "<think>") + "2 <and> 3.</think>\n\n"
    assert _takes(compiled, thought + call, tok) == (True, True)
    assert _takes(compiled, call, tok) == (True, not opened)
    assert not _takes(compiled, thought + "The sum", tok)[0]
