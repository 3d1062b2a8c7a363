"""Tool calls (engine/tool_calls.py) and reasoning (engine/reasoning.py): each family's replies
parsed whole and streamed in pieces, each family's forcing grammar run on a real model, and the
tools rendered through templates."""
from __future__ import annotations

import json
import re

import pytest

from infer.engine.chat_template import ChatTemplate
from infer.engine.engine import EngineConfig
from infer.engine.llm import LLM
from infer.engine.reasoning import ThinkStream, opened_in_prompt, thinks
from infer.engine.sampler import SamplingParams
from infer.engine.tool_calls import (
    DS_BEGIN,
    DS_CALL,
    DS_CALL_END,
    DS_END,
    DS_SEP,
    FAMILIES,
    ReplyStream,
    ToolError,
    family,
    grammar,
    parse_reply,
    parse_tool_choice,
    parse_tools,
    prepare,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"]}}}

# what each family's model writes (from the families' chat templates and model cards)
REPLIES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "Let me check."),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, '
                '{"name": "add", "arguments": {"a": 1, "b": 2}}]', ""),
    "mistral_args": ('Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
                     "Let me check."),
    "deepseek": (f'{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{DS_CALL_END}'
                 f'{DS_CALL}function{DS_SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{DS_CALL_END}{DS_END}', ""),
    "deepseek_v31": (f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"}}{DS_CALL_END}'
                     f'{DS_CALL}add{DS_SEP}{{"a": 1, "b": 2}}{DS_CALL_END}{DS_END}', ""),
    "qwen3coder": ('Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
                   '</function>\n</tool_call>\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n'
                   '<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>', "Let me check."),
    "glm45": ('Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n'
              '</tool_call>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>\n'
              '<arg_value>2</arg_value>\n</tool_call>', "Let me check."),
    "gemma4": ('Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
               '<|tool_call>call:add{a:1,b:2}<tool_call|>', "Let me check."),
    "generic": ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 2}}]}', ""),
}
TWO_CALLS = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("fam", list(REPLIES))
def test_replies_parse_whole_and_streamed(fam):
    text, content = REPLIES[fam]
    got_content, calls = parse_reply(fam, text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == TWO_CALLS
    assert len({c.id for c in calls}) == 2
    if fam == "mistral":  # its templates take 9 letters and digits: the model's own id, or a new one
        assert calls[0].id == "abcDEF123" and re.fullmatch(r"[A-Za-z0-9]{9}", calls[1].id)
    elif fam == "mistral_args":
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls)
    else:
        assert all(c.id.startswith("call_") for c in calls)
    for size in (1, 3, 7):  # streamed in pieces: the same calls, the content before them passed on
        s = ReplyStream(fam)
        sent = "".join(s.feed(text[i:i + size]) for i in range(0, len(text), size))
        tail, calls = s.finish()
        assert (sent + tail).strip() == content and [(c.name, json.loads(c.arguments)) for c in calls] == TWO_CALLS


def test_llama3_and_plain_replies():
    content, calls = parse_reply("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    for fam in FAMILIES:  # text that is no call stays content, whole and streamed
        for text in ("The weather is fine.", "Use <tool_call> tags, e.g. {not json}.", '{"name": 3}'):
            if fam == "generic" and text.startswith("{"):
                continue
            assert parse_reply(fam, text) == (text, [])
            s = ReplyStream(fam)
            sent = "".join(s.feed(ch) for ch in text)
            tail, calls = s.finish()
            assert sent + tail == text and calls == []
    assert parse_reply("generic", '{"response": "Hello!"}') == ("Hello!", [])


def test_family_from_the_template():
    assert family("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert family("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]") == "mistral"
    assert family("<｜tool▁calls▁begin｜>function<｜tool▁sep｜>{{ name }}\n```json\n") == "deepseek"
    assert family("[TOOL_CALLS]{{ name }}[ARGS]{{ args }}") == "mistral_args"  # Mistral Small 3.2, Ministral 3
    # formats not read here fall back to the generic one
    assert family("<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>") == "qwen3coder"  # Qwen3-Coder, 3.5
    assert family("{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>") == "glm45"  # GLM-4.5, 4.6, 4.7
    assert family("'<tool_call><function=' ~ name ~ '>' <parameter=") == "generic"  # no newlines between tags
    assert family("<｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>{{ args }}") == "deepseek_v31"  # DeepSeek V3.1
    assert family('<|start_header_id|>{{ tools }} "parameters"') == "llama3"
    assert family("{{ '<start_of_turn>' }}") == "generic"


def test_bad_tools_and_choices():
    tools = parse_tools([WEATHER, ADD])
    assert [t.name for t in tools] == ["get_weather", "add"]
    for bad, msg in [("x", "must be an array"), ([{"type": "function"}], "tools[0] must be"),
                     ([{"type": "function", "function": {"name": ""}}], "name must be"),
                     ([WEATHER, WEATHER], "two tools are named"),
                     ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "'parameters' an object")]:
        with pytest.raises(ToolError, match=re.escape(msg)):
            parse_tools(bad)
    assert parse_tool_choice(None, tools) == ("auto", None)
    assert parse_tool_choice({"type": "function", "function": {"name": "add"}}, tools) == ("required", "add")
    for bad, msg in [("sometimes", "must be"), ({"type": "function", "function": {"name": "nope"}}, "not among"),
                     ("required", "no tools")]:
        with pytest.raises(ToolError, match=re.escape(msg)):
            parse_tool_choice(bad, tools if bad != "required" else [])


@pytest.fixture(scope="module")
def llm(gemma_path):
    return LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=2))


@pytest.mark.parametrize("fam", FAMILIES)
def test_forcing_grammars_give_calls_that_parse(llm, fam):
    """tool_choice "required" / a named function: whatever the model would write, the grammar
    makes it one call in that family's syntax (the grammar then ends the reply), which parses, with
    arguments that fit the schema."""
    tools = parse_tools([WEATHER, ADD])
    for name, seed in ((None, 1), ("add", 2), (None, 3)):
        g, triggers = grammar(tools, fam, "required", name, False, llm.tokenizer.token_id)
        assert triggers == ()
        params = SamplingParams(temperature=0.8, seed=seed, max_tokens=200, grammar=g, special=True)
        prompt = llm.encode_chat([{"role": "user", "content": "What is the weather in Paris, and 2 + 3?"}])
        events = list(llm.engine.generate(prompt, params))
        text = "".join(e.text for e in events)
        assert events[-1].finish_reason == "stop", text
        _, calls = parse_reply(fam, text)
        assert len(calls) == 1, text
        args = json.loads(calls[0].arguments)
        assert calls[0].name in ("get_weather", "add") and (name is None or calls[0].name == name)
        assert set(args) == ({"city"} if calls[0].name == "get_weather" else {"a", "b"})


@pytest.mark.parametrize("fam", list(REPLIES))
def test_parallel_grammars_take_several_calls(llm, fam):
    """With parallel_tool_calls the forcing grammar takes the family's two-call reply; without,
    it refuses the second call."""
    tools = parse_tools([WEATHER, ADD])
    text = REPLIES[fam][0]
    marker = {"hermes": "<tool_call>", "qwen3coder": "<tool_call>", "glm45": "<tool_call>",
              "mistral_args": "[TOOL_CALLS]", "gemma4": "<|tool_call>"}.get(fam)
    text = text[text.index(marker):] if marker else text  # no content first
    for parallel in (True, False):
        g, _ = grammar(tools, fam, "required", None, parallel, llm.tokenizer.token_id)
        compiled = llm.engine.grammars.compile(g)
        # tokens that spell the text back (Gemma's SentencePiece would read DeepSeek's U+2581 as spaces)
        ids = compiled.lltokenizer.tokenize_bytes(text.encode())
        m = compiled.matcher()
        ok = True
        for t in ids:
            if t not in set(m.allowed_ids().tolist()):
                ok = False
                break
            m.consume(t)
        assert ok == parallel and (not parallel or m.done or llm.tokenizer.eos_id in m.allowed_ids()), (fam, parallel)


QWEN_LIKE = """{%- if tools %}<|im_start|>system
You may call functions. <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_tools_and_earlier_calls_reach_the_template():
    tools = parse_tools([WEATHER])
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    prepared, variables = prepare(msgs, tools, "hermes", "auto")
    text = ChatTemplate(QWEN_LIKE).render(prepared, **variables)
    assert '"name": "get_weather"' in text and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nSunny\n</tool_response>" in text
    # a template that knows no tools: described in the system turn, calls and results as JSON text
    prepared, variables = prepare(msgs, tools, "generic", "auto")
    assert variables == {} and prepared[0]["role"] == "system" and "get_weather" in prepared[0]["content"]
    assert json.loads(prepared[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert json.loads(prepared[3]["content"])["tool_response"]["content"] == "Sunny"


def test_thinking_is_split_off():
    def run(chunks, inside=False):
        t, r, c = ThinkStream(inside), "", ""
        for ch in chunks:
            a, b = t.feed(ch)
            r, c = r + a, c + b
        a, b = t.finish()
        return r + a, c + b

    text = "<think>\nThe user wants colours. </think>\n\nRed, green and blue."
    for size in (1, 2, 5, len(text)):
        assert run([text[i:i + size] for i in range(0, len(text), size)]) == (
            "\nThe user wants colours. ", "Red, green and blue.")
    assert run(["Just an answer."]) == ("", "Just an answer.")
    assert run(["still thinking"], inside=True) == ("still thinking", "")
    assert run(["so", "</think>Done"], inside=True) == ("so", "Done")
    assert thinks("{{ '<think>\\n' }}") and not thinks("{{ messages }}")
    assert opened_in_prompt("<｜Assistant｜><think>\n") and not opened_in_prompt("<|im_start|>assistant\n")


def test_harmony_channels_are_split():
    """gpt-oss's replies (harmony): the analysis channel is the thinking, final (and commentary) the
    answer, the markers dropped, whatever the chunking."""
    from infer.engine.reasoning import reply_stream, split_reply, style

    def run(chunks):
        t, r, c = reply_stream("harmony"), "", ""
        for ch in chunks:
            a, b = t.feed(ch)
            r, c = r + a, c + b
        a, b = t.finish()
        return r + a, c + b

    text = ("<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant"
            "<|channel|>final<|message|>2 + 2 = 4.")
    for size in (1, 2, 3, 7, len(text)):
        assert run([text[i:i + size] for i in range(0, len(text), size)]) == ("User asks 2+2. Answer 4.", "2 + 2 = 4.")
    assert run(["Just an answer."]) == ("", "Just an answer.")  # no header at all
    assert run(["<|channel|>analysis<|message|>cut short"]) == ("cut short", "")
    assert split_reply("harmony", "<|channel|>commentary<|message|>Looking it up.<|end|>") == ("", "Looking it up.")
    assert split_reply("harmony", "<|channel|>analysis<|message|>a < b <|im<|end|>") == ("a < b <|im", "")
    assert split_reply("harmony", "<|channel|> <|constrain|>json<|message|>hi") == ("", "hi")  # no channel named
    assert style("<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>") == "harmony"
    assert style("{{ '<think>' }}") == "think" and style("{{ messages }}") == ""


HARMONY = ("{%- for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
           "<|message|>{{ m.content }}<|end|>{% endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %}")


def test_harmony_models_spell_markers_out_and_keep_the_answer(tmp_path):
    """A harmony template: chat requests detokenize with the markers spelled out (the splitter needs
    them), reasoning_effort reaches the template, and a conversation keeps the final answer (and
    the thinking apart) for the next turn, not the raw channels."""
    from helpers.tiny_models import write_tiny_model
    from infer.cli.server import openai_chat
    from infer.cli.server.openai_request import parse_job
    from infer.engine.conversation import Conversation, TurnStats
    from infer.engine.request import Event, Usage

    job = parse_job({"messages": [{"role": "user", "content": "hi"}]}, None)
    plan, _ = openai_chat.plan({"reasoning_effort": "high"}, [{"role": "user", "content": "hi"}], HARMONY,
                               "deepseek", job, lambda text: None)
    assert plan.reasoning == "harmony" and plan.variables["reasoning_effort"] == "high"
    constrained, _ = openai_chat.constrain(job, plan, None, False)
    assert constrained.params.special
    plain, _ = openai_chat.plan({}, [{"role": "user", "content": "hi"}], HARMONY, "none", job, lambda text: None)
    assert plain.reasoning == "" and openai_chat.constrain(job, plain, None, False)[0].params.special
    path = write_tiny_model(tmp_path / "h.gguf", "gpt-oss", seed=3, chat_template=HARMONY, n_ctx=512)
    llm = LLM.load(path, EngineConfig(n_ctx=512, n_threads=2))
    raw = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hello"
    real = llm.generate
    # the conversation spells the markers out itself (with special off they would not be in the text)
    llm.generate = lambda ids, params: iter([Event(0, raw if params.special else "thinkHello", None, "stop", Usage())])
    conv = Conversation(llm)
    list(conv.turn("hi", SamplingParams(), TurnStats()))
    llm.generate = real
    assert conv.messages[-1] == {"role": "assistant", "content": "Hello", "thinking": "think"}
    assert "<|channel|>final<|message|>Hello<|end|>" in llm.template.render(conv.messages)


DS_LIKE = ("{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
           "{% elif m.tool_calls %}{% for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
           "{{ c.function.name + '\\n```json\\n' + c.function.arguments + '\\n```' }}<｜tool▁call▁end｜>{% endfor %}"
           "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{% endif %}"
           "{% endfor %}<｜Assistant｜><think>\n")


def test_templates_that_take_arguments_as_text():
    """DeepSeek-R1's template concatenates the arguments as a string: objects fail to render
    there, so the call is rendered again with the arguments as JSON text."""
    from infer.cli.server.openai_chat import ChatPlan, encode

    class Stub:  # "tokens" are the rendered text, whole
        template = ChatTemplate(DS_LIKE)

        class tokenizer:
            @staticmethod
            def decode(ids, special):
                return "".join(ids)

        def encode_chat(self, messages, **variables):
            return [self.template.render(messages, **variables)]

    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    prepared, variables = prepare(msgs, parse_tools([WEATHER]), family(DS_LIKE), "auto")
    assert family(DS_LIKE) == "deepseek" and isinstance(prepared[1]["tool_calls"][0]["function"]["arguments"], dict)
    (text,), opened = encode(Stub(), ChatPlan(prepared, variables, "deepseek", "think"))
    assert opened  # the template opens <think>: the reply starts inside it
    assert 'get_weather\n```json\n{"city": "Paris"}\n```' in text and text.endswith("<think>")


def test_mistral_space_before_the_array():
    # Mistral Small 3.1's template writes "[TOOL_CALLS] [" with a space, and its models do too
    content, calls = parse_reply("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("fam, before, call", [
    ("hermes", "Let me look that up. ", '<tool_call>\n{"name": "add", "arguments": {"a": 1'),
    ("mistral", "", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1'),
    ("mistral_args", "Sure.", '[TOOL_CALLS]add[ARGS]{"a": 1'),
    ("llama3", "  ", '{"name": "add", "parameters": {"a": 1'),
    ("qwen3coder", "Sure. ", '<tool_call>\n<function=add>\n<parameter=a>\n1'),
    ("glm45", "Sure. ", '<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1'),
    ("gemma4", "Sure. ", '<|tool_call>call:add{a:1'),
])
def test_auto_is_free_until_a_call_starts(llm, fam, before, call):
    """tool_choice "auto": no grammar until the reply shows the family's call marker; from there the
    call must parse (the text written so far is fed to the grammar, which then masks the rest)."""
    from infer.engine.grammar import LazyGrammar

    tools = parse_tools([WEATHER, ADD])
    g, triggers = grammar(tools, fam, "auto", None, True, llm.tokenizer.token_id)
    assert triggers
    lazy = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers)
    assert not lazy.seen(before)  # still free
    assert lazy.seen(call)
    allowed = {llm.tokenizer.token_to_piece(int(i), special=True) for i in lazy.started.allowed_ids()}
    # after {"a": 1 only digits, a separator, whitespace or the end of the object can follow (XML: the close)
    follow = b"0123456789<" if fam in ("qwen3coder", "glm45") else b"0123456789,}"
    assert allowed and all(p.strip(b" \t\n")[:1] in follow for p in allowed), allowed
    near_miss = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers)
    miss = ((before + call).replace('"name"', '"nom"').replace("<function=", "<funktion=")
            .replace("add[", "sub[").replace(">add", ">sub").replace("call:add", "call:sub"))
    assert not near_miss.seen(miss)  # a marker, then no call: free
    assert not near_miss.seen('{"name": "add"}') and near_miss.started is None


def test_mistral_args_call_ids_and_malformed_calls():
    # Small 3.2's template writes [CALL_ID] before [ARGS]: a 9-character id is kept
    content, calls = parse_reply("mistral_args", '[TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{"a": 1, "b": 2}')
    assert content == "" and [(c.name, json.loads(c.arguments), c.id) for c in calls] == [
        ("add", {"a": 1, "b": 2}, "abcDEF123")]
    for bad in ('[TOOL_CALLS]add{"a": 1}', '[TOOL_CALLS]add[ARGS]{"a": 1', '[TOOL_CALLS]add[ARGS]{"a": 1} more',
                '[TOOL_CALLS]a b[ARGS]{}'):
        assert parse_reply("mistral_args", "Hi." + bad) == ("Hi." + bad, [])


def test_held_text_goes_out_once_it_cannot_be_a_marker():
    s = ReplyStream("hermes")
    assert [s.feed(p) for p in ("Use a <", "b> tag and more", " text.")] == ["Use a ", "<b> tag and more", " text."]
    assert s.finish() == ("", [])
    s = ReplyStream("mistral")
    assert [s.feed(p) for p in ("See [", "1] and [TOOL", "_CALLS] [")] == ["See ", "[1] and ", ""]


def test_hostile_tool_choices_and_pydantic_schemas(llm):
    with pytest.raises(ToolError, match="not among"):
        parse_tool_choice({"type": "function", "function": {"name": ["x"]}}, parse_tools([ADD]))
    # Pydantic writes nested models as $defs and $ref: every family's grammar keeps them resolvable
    nested = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"who": {"$ref": "#/$defs/Person"}}, "required": ["who"],
        "$defs": {"Person": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "required": ["age"]}}}}}
    old_style = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"t": {"$ref": "#/definitions/Person"}}, "required": ["t"],
        "definitions": {"Person": {"enum": ["a", "b"]}}}}}
    tools = parse_tools([nested, old_style])
    for fam in FAMILIES:
        for mode in ("required", "auto"):
            g, _ = grammar(tools, fam, mode, None, True, llm.tokenizer.token_id)
            llm.engine.grammars.compile(g)  # raises GrammarError if a reference does not resolve
    g, _ = grammar(tools, "generic", "required", "book", False)
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=120, grammar=g)
    events = list(llm.engine.generate(llm.encode_chat([{"role": "user", "content": "Book for a 5 year old."}]), params))
    _, calls = parse_reply("generic", "".join(e.text for e in events))
    assert calls[0].name == "book" and 0 <= json.loads(calls[0].arguments)["who"]["age"] <= 9


def test_lazy_grammars_wait_past_thinking_and_plain_json(llm):
    from infer.engine.grammar import LazyGrammar

    tools = parse_tools([ADD])
    g, triggers = grammar(tools, "hermes", "auto", None, True, llm.tokenizer.token_id)
    lazy = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers, thinking=True)
    assert not lazy.seen("I could write <tool_call> here, but")  # still thinking: not the answer
    assert not lazy.seen(" no.</think>\n\nThe sum is ")
    assert lazy.seen('<tool_call>\n{"name": "add"')
    g, triggers = grammar(tools, "mistral_args", "auto", None, True, llm.tokenizer.token_id)
    lazy = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers)  # Mistral's thought: [THINK] tags
    assert not lazy.seen("[THINK]I could write [TOOL_CALLS]add here, but")
    assert not lazy.seen(" no.[/THINK]The sum is ")
    assert lazy.seen('[TOOL_CALLS]add[ARGS]{"a"')
    g, triggers = grammar(tools, "llama3", "auto", None, True, llm.tokenizer.token_id)
    lazy = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers)
    assert not lazy.seen('{"answer": 5}') and not lazy.given_up  # JSON that is no call stays free
    lazy = LazyGrammar(llm.engine.grammars.compile(g).matcher(), triggers)
    assert lazy.seen(' {"name": "add", "parameters": {')


def test_xml_values_typed_by_schema():
    """qwen3coder's values are text: a string parameter keeps it (even "42"), others parse as JSON,
    Python's True/None as JSON's; an unknown tool's values are JSON where they parse."""
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
        "e": {"enum": ["x", "y"]}, "u": {"type": ["string", "null"]}}}}}])
    reply = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in (
        ("s", "42"), ("n", "1.5"), ("b", "True"), ("o", '{"k": [1]}'), ("e", "y"), ("u", "None"))) + "</function>\n</tool_call>"
    content, calls = parse_reply("qwen3coder", reply, tools)
    assert content == "" and json.loads(calls[0].arguments) == {"s": "42", "n": 1.5, "b": True, "o": {"k": [1]},
                                                                 "e": "y", "u": None}
    _, calls = parse_reply("qwen3coder", reply.replace("=f>", "=g>"), tools)
    assert json.loads(calls[0].arguments)["s"] == 42
    for broken in (reply.replace("</function>", ""), reply.replace("<parameter=n>", "stray <parameter=n>")):
        assert parse_reply("qwen3coder", broken, tools) == (broken, [])


def test_glm_values_typed_by_schema_with_or_without_newlines():
    """GLM's values are text as qwen3coder's: a string keeps it, others parse as JSON; GLM-4.7 writes
    no newlines between the tags, GLM-4.5/4.6 do, and both parse; a broken call is content."""
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "number"}, "o": {"type": "object"}}}}}])
    args = (("s", "42\nlines"), ("n", "1.5"), ("o", '{"k": [1]}'))
    for sep in ("", "\n"):
        reply = "Hm.<tool_call>f" + "".join(f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>"
                                            for k, v in args) + f"{sep}</tool_call>"
        content, calls = parse_reply("glm45", reply, tools)
        assert content == "Hm." and json.loads(calls[0].arguments) == {"s": "42\nlines", "n": 1.5, "o": {"k": [1]}}
        for broken in (reply.replace("</tool_call>", ""), reply.replace("</arg_value>", "", 1)):
            assert parse_reply("glm45", broken, tools) == (broken, [])


def test_glm_grammar_takes_either_spacing(llm):
    """GLM-4.7 writes its calls without the newlines GLM-4.5/4.6 put between the tags: the forcing
    grammar takes both, and nothing else between them."""
    tools = parse_tools([WEATHER, ADD])
    text = REPLIES["glm45"][0]
    text = text[text.index("<tool_call>"):]
    g, _ = grammar(tools, "glm45", "required", None, True, llm.tokenizer.token_id)
    compiled = llm.engine.grammars.compile(g)

    def takes(reply: str) -> bool:
        m = compiled.matcher()
        for t in compiled.lltokenizer.tokenize_bytes(reply.encode()):
            if t not in set(m.allowed_ids().tolist()):
                return False
            m.consume(t)
        return True

    compact = text.replace(">\n<", "><").replace("weather\n<", "weather<").replace("add\n<", "add<")
    assert "\n<arg" not in compact and takes(compact) and takes(text)
    assert not takes(text.replace("\n<arg_value>", " <arg_value>", 1))


RATE = {"type": "function", "function": {"name": "rate", "parameters": {"type": "object", "properties": {
    "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["confidence"]}}}


@pytest.mark.parametrize("fam", ["generic", "hermes", "mistral", "deepseek_v31", "llama3"])
def test_call_grammars_bound_numbers_and_calls(llm, fam):
    """A number in a tool's parameters takes at most 16 fractional digits (llama.cpp's JSON grammars);
    a named function is called once, parallel_tool_calls or not; without parallel_tool_calls the
    generic family makes one call (llama-server's default: its template renders no calls), the
    others several."""
    tools = parse_tools([WEATHER, ADD, RATE])
    call = {"generic": '{"tool_calls": [{"name": "rate", "arguments": {"confidence": 0.%s}}]}',
            "hermes": '<tool_call>\n{"name": "rate", "arguments": {"confidence": 0.%s}}\n</tool_call>',
            "mistral": '[TOOL_CALLS][{"name": "rate", "arguments": {"confidence": 0.%s}}]',
            "deepseek_v31": f'{DS_BEGIN}{DS_CALL}rate{DS_SEP}{{"confidence": 0.%s}}{DS_CALL_END}{DS_END}',
            "llama3": '{"name": "rate", "parameters": {"confidence": 0.%s}}'}[fam]

    def follows(name, parallel, text):
        g, _ = grammar(tools, fam, "required", name, parallel, llm.tokenizer.token_id)
        compiled = llm.engine.grammars.compile(g)
        m = compiled.matcher()
        for t in compiled.lltokenizer.tokenize_bytes(text.encode()):
            if t not in set(m.allowed_ids().tolist()):
                return False
            m.consume(t)
        return True

    assert follows("rate", False, call % ("7" * 16)) and not follows("rate", False, call % ("7" * 17))
    assert not follows(None, True, call % ("7" * 17))
    if fam in ("llama3", "deepseek_v31"):
        return
    two = REPLIES[fam][0]
    two = two[two.index("<tool_call>"):] if fam == "hermes" else two
    twice = two.replace('"name": "add", "arguments": {"a": 1, "b": 2}', '"name": "get_weather", "arguments": {"city": "Rome"}')
    assert follows(None, True, twice) and not follows("get_weather", True, twice)
    assert follows(None, None, two) is (fam != "generic")
