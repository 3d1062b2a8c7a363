"""Gemma 4's chat format through infer's built-in template (engine/gemma4_format.py, used for a
gemma4 file without tokenizer.chat_template): <|turn>ROLE ... <turn|> turns, the assistant's role
"model"; the system turn with <|think|> when thinking is on and the tool declarations in Gemma's
value syntax; an empty thought closed in the generation prompt when thinking is off; tool calls
as <|tool_call>call:NAME{...}<tool_call|> with their results in the same model turn; earlier
replies' thoughts dropped, a thought kept before the calls that follow the last user message.
The expected texts below were read off Google's template; where llama-cpp-python's vendored tree
has it (models/templates/google-gemma-4-31B-it.jinja) it renders every conversation here as ours
does.  The reply side: its calls and its thought channel parsed, whole and streamed."""
from __future__ import annotations

import json

import pytest

from helpers.llama_vocab import chat_template
from infer.engine import gemma4_format
from infer.engine.chat_template import ChatTemplate, builtin_template, load_chat_template
from infer.engine.reasoning import reply_stream, spelled_out, split_reply, style
from infer.engine.tool_calls import ReplyStream, family, parse_reply, parse_tools, prepare

BOS, EOS, Q = "<bos>", "<eos>", '<|"|>'
CONVO = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "Hi "},
    {"role": "assistant", "content": "<|channel>thought\ngreet back<channel|>Hello!"},
    {"role": "user", "content": "How are you?"},
]
HISTORY = ("<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nHow are you?<turn|>\n")
TOOLS = parse_tools([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
        "type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "City"}, "unit": {"type": "string", "enum": ["C", "F"]},
            "days": {"type": "array", "items": {"type": "integer"}},
            "Opt": {"type": "object", "properties": {"a": {"type": "boolean", "nullable": True}}, "required": ["a"]},
            "pts": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}},
                                              "required": ["x"]}},
            "free": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
])
DECLARATIONS = (
    f"<|tool>declaration:get_weather{{description:{Q}Weather now{Q},parameters:{{properties:{{"
    f"city:{{description:{Q}City{Q},type:{Q}STRING{Q}}},days:{{items:{{type:{Q}INTEGER{Q}}},type:{Q}ARRAY{Q}}},"
    f"free:{{properties:{{}},type:{Q}OBJECT{Q}}},"
    f"Opt:{{properties:{{a:{{nullable:true,type:{Q}BOOLEAN{Q}}}}},required:[{Q}a{Q}],type:{Q}OBJECT{Q}}},"
    f"pts:{{items:{{properties:{{x:{{type:{Q}NUMBER{Q}}}}},required:[{Q}x{Q}],type:{Q}OBJECT{Q}}},type:{Q}ARRAY{Q}}},"
    f"unit:{{enum:[{Q}C{Q},{Q}F{Q}],type:{Q}STRING{Q}}}}},required:[{Q}city{Q}],type:{Q}OBJECT{Q}}}}}<tool|>"
    f"<|tool>declaration:get_time{{description:{Q}{Q},parameters:{{type:{Q}OBJECT{Q}}}}}<tool|>")
ARGS = {"city": "Paris, {FR}: a:b", "days": [1, 2], "Opt": {"a": True, "b": None}, "x": -1.5e3}
TOOL_TURN = CONVO + [
    {"role": "assistant", "content": "", "reasoning_content": "need both", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}},
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "14:00"},
    {"role": "tool", "tool_call_id": "c1", "content": "22C"},
    {"role": "assistant", "content": "22C at 14:00."},
]
CALLS = (f"<|tool_call>call:get_weather{{city:{Q}Paris, {{FR}}: a:b{Q},days:[1,2],Opt:{{a:true,b:None}},"
         f"x:-1500.0}}<tool_call|><|tool_call>call:get_time{{tz:{Q}CET{Q}}}<tool_call|>")


def _ours() -> ChatTemplate:
    return ChatTemplate(builtin_template("gemma4", "gemma4", None), BOS, EOS)


def test_turns_and_generation_prompt():
    system = "<|turn>system\nBe brief.<turn|>\n"
    assert _ours().render(CONVO) == BOS + system + HISTORY + "<|turn>model\n<|channel>thought\n<channel|>"
    assert _ours().render(CONVO, enable_thinking=False) == _ours().render(CONVO)
    thinking = "<|turn>system\n<|think|>\nBe brief.<turn|>\n"
    assert _ours().render(CONVO, enable_thinking=True) == BOS + thinking + HISTORY + "<|turn>model\n"
    assert _ours().render(CONVO[1:2], add_generation_prompt=False) == BOS + "<|turn>user\nHi<turn|>\n"
    # a file without a template: the architecture's built-in one
    loaded = load_chat_template(None, "gemma4", "gemma4", None, BOS, EOS)
    assert loaded.source == gemma4_format.TEMPLATE


def test_tools_calls_results_and_thought_before_calls():
    msgs, variables = prepare(TOOL_TURN, TOOLS, "gemma4", "auto")
    out = _ours().render(msgs, **variables)
    assert out == (BOS + "<|turn>system\nBe brief." + DECLARATIONS + "<turn|>\n" + HISTORY
                   + "<|turn>model\n<|channel>thought\nneed both\n<channel|>" + CALLS
                   + f"<|tool_response>response:get_time{{value:{Q}14:00{Q}}}<tool_response|>"
                   + f"<|tool_response>response:get_weather{{value:{Q}22C{Q}}}<tool_response|>"
                   + "22C at 14:00.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
    # results not in yet: the turn stays open at the response marker, no new generation prompt
    assert _ours().render(msgs[:5], **variables).endswith(CALLS + "<|tool_response>")
    # results in, no answer yet: the model goes on in the same turn
    assert _ours().render(msgs[:7], **variables).endswith(f"{Q}22C{Q}}}<tool_response|>")


def test_family_style_and_calls_parsed():
    src = gemma4_format.TEMPLATE
    assert family(src) == "gemma4" and style(src) == "gemma4" and spelled_out("gemma4")
    reply = "Let me look." + CALLS.replace("b:None", "b:null")  # the model writes null (the template: None)
    content, calls = parse_reply("gemma4", reply, TOOLS)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {**ARGS, "x": -1500.0}),
                                                                   ("get_time", {"tz": "CET"})]
    assert parse_reply("gemma4", f"<|tool_call>call:f{{ {Q}k{Q}: [ ] , n :{{}} }}<tool_call|>")[1][0].arguments == \
        '{"k": [], "n ": {}}'  # quoted keys, spaces after separators as llama.cpp's parser takes them
    for size in (1, 2, 5):  # streamed: the content passed on, the calls parsed at the end
        s = ReplyStream("gemma4", TOOLS)
        sent = "".join(s.feed(reply[i:i + size]) for i in range(0, len(reply), size))
        tail, streamed = s.finish()
        assert (sent + tail).strip() == "Let me look." and [c.name for c in streamed] == ["get_weather", "get_time"]
    for broken in ("No call here.", "<|tool_call>call:get_time{tz:CET}<tool_call|>",
                   f"<|tool_call>call:get_time{{tz:{Q}CET{Q}}}", f"<|tool_call>call:{{tz:{Q}CET{Q}}}<tool_call|>"):
        assert parse_reply("gemma4", broken, TOOLS) == (broken, [])


@pytest.mark.parametrize("size", [1, 3, 100])
def test_thought_channel_split(size):
    reply = "<|channel>thought\nFirst, the weather.\n<channel|>It is sunny."
    assert split_reply("gemma4", reply) == ("First, the weather.\n", "It is sunny.")
    s = reply_stream("gemma4")
    parts = [s.feed(reply[i:i + size]) for i in range(0, len(reply), size)] + [s.finish()]
    assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == ("First, the weather.\n", "It is sunny.")
    assert split_reply("gemma4", "Just an answer.") == ("", "Just an answer.")


@pytest.mark.reference
def test_real_template_renders_as_ours():
    text = chat_template("google-gemma-4-31B-it.jinja").read_text()  # llama.cpp's, from llama-cpp-python's sources
    real, ours = ChatTemplate(text, BOS, EOS), _ours()
    assert family(text) == "gemma4" and style(text) == "gemma4"
    msgs, variables = prepare(TOOL_TURN, TOOLS, "gemma4", "auto")
    again = [{"role": "user", "content": "a"}, {"role": "user", "content": "a"},
             {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}]
    for convo, kw in ((CONVO, {}), (CONVO, {"enable_thinking": True}), (CONVO, {"enable_thinking": False}),
                      (CONVO[1:], {}), (CONVO[1:2], {}), (again, {}), (msgs, variables), (msgs[1:], {}),
                      (msgs, {**variables, "enable_thinking": True})):
        for end in range(1, len(convo) + 1):
            for prompt in (True, False):
                assert real.render(convo[:end], add_generation_prompt=prompt, **kw) == \
                    ours.render(convo[:end], add_generation_prompt=prompt, **kw), (end, prompt, kw)
    # llama-cpp-python's own renderer of a GGUF's template (its Jinja2ChatFormatter) agrees too
    formatter = pytest.importorskip("llama_cpp.llama_chat_format").Jinja2ChatFormatter
    for convo, kw in ((CONVO, {}), (CONVO, {"enable_thinking": True}), (msgs, variables)):
        for prompt in (True, False):
            theirs = formatter(text, EOS, BOS, add_generation_prompt=prompt)(messages=convo, **kw).prompt
            assert theirs == ours.render(convo, add_generation_prompt=prompt, **kw), (prompt, kw)


@pytest.mark.reference
def test_grammar_with_gemma4s_own_tokens():
    """With Gemma 4's vocabulary (llama.cpp's ggml-vocab-gemma-4.gguf) the markers and the string
    quote are tokens of their own: a forcing grammar takes two calls written in them only where
    parallel calls are allowed; the file's own template reads as this family."""
    from helpers.llama_vocab import vocab_dir
    from infer.engine.grammar import GrammarCompiler
    from infer.engine.tokenizer import Tokenizer
    from infer.engine.tool_calls import grammar
    from infer.models.gguf_file import read_gguf

    meta = read_gguf(vocab_dir() / "ggml-vocab-gemma-4.gguf").metadata
    assert family(meta["tokenizer.chat_template"]) == "gemma4" and style(meta["tokenizer.chat_template"]) == "gemma4"
    tok = Tokenizer.from_metadata(meta)
    assert all(tok.token_id(m) is not None for m in (Q, gemma4_format.OPEN, gemma4_format.CLOSE))
    tools = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])
    text = (f"<|tool_call>call:get_weather{{city:{Q}Paris <3{Q}}}<tool_call|>"
            "<|tool_call>call:add{a:1,b:2}<tool_call|>")
    ids = tok.encode(text, add_special=False, parse_special=True)
    first = len(tok.encode(text[:text.index(gemma4_format.CLOSE) + len(gemma4_format.CLOSE)], add_special=False,
                           parse_special=True))
    compiler = GrammarCompiler(tok)
    for parallel in (True, False):
        m = compiler.compile(grammar(tools, "gemma4", "required", None, parallel, tok.token_id)[0]).matcher()
        taken = 0
        for t in ids:
            if t not in set(m.allowed_ids().tolist()):
                break
            m.consume(t)
            taken += 1
        assert taken == (len(ids) if parallel else first)  # one call alone: refused at the second
    assert parse_reply("gemma4", text, tools)[1][0].arguments == '{"city": "Paris <3"}'


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_server_reply_split_thought_content_and_calls(size):
    """The chat endpoint's path (cli/server/openai_chat.py): a Gemma 4 template plans the gemma4
    call family and reasoning style with its markers spelled out; a streamed reply comes apart
    into reasoning_content, content and tool_calls, in pieces of any size."""
    from infer.cli.server import openai_chat
    from infer.cli.server.openai_request import parse_job

    msgs = [{"role": "user", "content": "Weather?"}]
    body = {"messages": msgs, "tools": [t.as_openai() for t in TOOLS]}
    plan, g = openai_chat.plan(body, msgs, gemma4_format.TEMPLATE, "deepseek", parse_job(body, None), lambda t: None)
    assert plan.family == "gemma4" and plan.reasoning == "gemma4" and plan.markers and g is not None
    reply = (f"<|channel>thought\nCheck the weather.<channel|>On it.<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}"
             "<tool_call|>")
    r = openai_chat.ChatReply(plan, False)
    parts = [r.feed(reply[i:i + size]) for i in range(0, len(reply), size)]
    reasoning, content, calls = r.finish()
    assert "".join(p[0] for p in parts) + reasoning == "Check the weather."
    assert "".join(p[1] for p in parts) + content == "On it."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
