import datetime
import json

import pytest

from infer.engine.chat_template import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    LLAMA2_TEMPLATE,
    LLAMA3_TEMPLATE,
    NAMED_TEMPLATES,
    PHI3_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    MessageError,
    builtin_template,
    load_chat_template,
    validate_messages,
)

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]

# Gemma 3's tokenizer_config.json chat_template, as stored there (JSON-encoded).
GEMMA3_HF_JSON = r'''"{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"'''
GEMMA3_HF = json.loads(GEMMA3_HF_JSON)

# Qwen2.5-Instruct's chat template (decoded), with its tools branch.
QWEN25_HF = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


# ---------------------------------------------------------------- built-ins


def test_builtin_gemma3():
    t = load_chat_template(None, "gemma3", "llama", "default", "<bos>", "<eos>")
    assert t.render(CONVO) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert t.render(CONVO[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_builtin_chatml_qwen():
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    for arch in ("qwen2", "qwen3"):
        assert load_chat_template(None, arch, "gpt2", "qwen2", "", "<|im_end|>").render(CONVO) == expected


def test_builtin_llama3():
    t = load_chat_template(None, "llama", "gpt2", "llama-bpe", "<|begin_of_text|>", "<|eot_id|>")
    assert t.render(CONVO) == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_builtin_llama2():
    t = load_chat_template(None, "llama", "llama", None, "<s>", "</s>")
    assert t.render(CONVO) == (
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] How are you? [/INST]"
    )
    assert t.render(CONVO[1:]) == "<s>[INST] Hi [/INST] Hello! </s><s>[INST] How are you? [/INST]"


def test_builtin_selection():
    assert builtin_template("gemma3", "llama", None) is GEMMA_TEMPLATE
    assert builtin_template("qwen3", "gpt2", "qwen2") is CHATML_TEMPLATE
    assert builtin_template("llama", "gpt2", "llama-bpe") is LLAMA3_TEMPLATE
    assert builtin_template("llama", "gpt2", "smaug-bpe") is LLAMA2_TEMPLATE
    assert builtin_template("llama", "llama", None) is LLAMA2_TEMPLATE
    assert builtin_template("phi3", "llama", None) is PHI3_TEMPLATE
    with pytest.raises(ChatTemplateError, match="olmo2"):
        builtin_template("olmo2", "gpt2", None)
    # a file without a template of a family infer has none for still loads: ChatML, as llama.cpp's server
    assert load_chat_template(None, "olmo2", "gpt2", None, "", "").source == CHATML_TEMPLATE


def test_phi3_builtin_renders_as_llama_cpp():
    # llama.cpp's own phi3 format (llama_chat_apply_template(tmpl="phi3")) for the same conversation
    t = load_chat_template(None, "phi3", "llama", None, "<s>", "</s>")
    assert t.render(CONVO, add_generation_prompt=True) == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nHow are you?<|end|>\n<|assistant|>\n"
    )


def _llama_cpp_named(name: str, messages: list[dict], add_ass: bool) -> str:
    """llama.cpp's built-in format of that name (llama_chat_apply_template), no BOS."""
    llama_cpp = pytest.importorskip("llama_cpp")
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = bytes(8192)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_ass, buf, len(buf))
    assert 0 < n <= len(buf), name
    return buf[:n].decode()


@pytest.mark.parametrize("name", sorted(NAMED_TEMPLATES))
@pytest.mark.parametrize("gen", [True, False])
def test_named_templates_render_as_llama_cpp(name, gen):
    """--chat-template NAME is llama-server's format of that name: the same text for the same chat
    (with and without a system turn; untrimmed contents, except gemma's system turn, which llama.cpp
    trims and Google's template, infer's, does not)."""
    sys_content = "Be brief." if name == "gemma" else "Be brief. "
    convo = [{"role": "system", "content": sys_content}, {"role": "user", "content": " Hi"},
             {"role": "assistant", "content": "Hello!\n"}, {"role": "user", "content": "How are you?"}]
    for messages in (convo, convo[1:]):
        ours = ChatTemplate(NAMED_TEMPLATES[name], "", "").render(messages, add_generation_prompt=gen)
        assert ours == _llama_cpp_named(name, messages, gen), (name, messages)


def test_metadata_template_wins_over_builtin():
    t = load_chat_template("{{ bos_token }}X{{ messages[0]['content'] }}", "gemma3", "llama", None, "<b>", "")
    assert t.render(CONVO[1:2]) == "<b>XHi"
    blank = load_chat_template("  ", "qwen2", "gpt2", None, "", "")
    assert blank.source is CHATML_TEMPLATE


@pytest.mark.parametrize(
    "messages",
    [
        CONVO,
        CONVO[1:],
        CONVO[1:2],
        [{"role": "system", "content": "  S  "}, {"role": "user", "content": "  padded\n"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    ],
)
@pytest.mark.parametrize("gen", [True, False])
def test_builtin_gemma_matches_official_hf_template(messages, gen):
    ours = ChatTemplate(GEMMA_TEMPLATE, "<bos>", "<eos>").render(messages, add_generation_prompt=gen)
    theirs = ChatTemplate(GEMMA3_HF, "<bos>", "<eos>").render(messages, add_generation_prompt=gen)
    assert ours == theirs


def test_builtin_gemma_rejects_non_alternating_roles():
    with pytest.raises(ChatTemplateError, match="alternate"):
        load_chat_template(None, "gemma3", "llama", None, "<bos>", "").render(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )


# ---------------------------------------------------------------- real-world templates


def test_gemma3_official_with_multimodal_content():
    t = ChatTemplate(GEMMA3_HF, "<bos>", "<eos>")
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Sys"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]},
    ]
    assert t.render(messages) == (
        "<bos><start_of_turn>user\nSys\n\n<start_of_image>Describe.<end_of_turn>\n<start_of_turn>model\n"
    )


def test_qwen25_without_tools_uses_default_system():
    t = ChatTemplate(QWEN25_HF, "", "<|im_end|>")
    assert t.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert t.render(CONVO) == ChatTemplate(CHATML_TEMPLATE).render(CONVO)


def test_qwen25_with_tools_and_tool_calls():
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "22°C"},
    ]
    out = ChatTemplate(QWEN25_HF, "", "<|im_end|>").render(messages, tools=[tool])
    assert out == (
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Météo for a city", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n22°C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# ---------------------------------------------------------------- environment


def test_tojson_is_hf_flavoured():
    t = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ y | tojson(sort_keys=true) }}")
    out = t.render([], x={"a": "<é>"}, y={"b": 1, "a": 2})
    assert out == '{"a": "<é>"}|{\n  "a": "<é>"\n}|{"a": 2, "b": 1}'


def test_strftime_now_and_extra_kwargs():
    t = ChatTemplate("{{ strftime_now('%Y') }} {{ tools is none }} {{ custom }}")
    assert t.render([], custom="ok") == f"{datetime.datetime.now().year} True ok"


def test_trim_blocks_lstrip_blocks_and_loopcontrols():
    src = "{% for m in messages %}\n    {% if loop.index > 2 %}{% break %}{% endif %}\n[{{ m['content'] }}]\n{% endfor %}"
    msgs = [{"role": "user", "content": str(i)} for i in range(5)]
    assert ChatTemplate(src).render(msgs) == "[0]\n[1]\n"


def test_generation_tag_renders_body():
    src = "{% for m in messages %}{% generation %}<{{ m['content'] }}>{% endgeneration %}{% endfor %}"
    assert ChatTemplate(src).render([{"role": "assistant", "content": "x"}]) == "<x>"


def test_undefined_prints_empty_like_hf():
    assert ChatTemplate("[{{ nothing }}]").render([]) == "[]"
    with pytest.raises(ChatTemplateError, match="undefined"):
        ChatTemplate("{{ nothing.deeper }}").render([])


@pytest.mark.parametrize(
    "src",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append(1) }}",
        "{{ raise_exception.__globals__['os'] }}",
        "{% set d = {} %}{{ d.update({'a': 1}) }}",
    ],
)
def test_sandbox_blocks_unsafe_access(src):
    with pytest.raises(ChatTemplateError) as exc:
        ChatTemplate(src).render([{"role": "user", "content": "x"}])
    assert "\n" not in str(exc.value)


def test_sandbox_unsafe_attribute_alone_renders_nothing():
    # As in HF: the unsafe attribute is an Undefined that prints empty but raises on any use.
    assert ChatTemplate("[{{ raise_exception.__globals__ }}]").render([]) == "[]"


def test_raise_exception_gives_chat_template_error():
    t = ChatTemplate("{% if messages|length == 0 %}{{ raise_exception('need at least\none message') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="need at least one message") as exc:
        t.render([])
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("src", ["{% for m in messages %}", "{{ 1 + }}", "{% endif %}", "{{ x | no_such_filter }}"])
def test_syntax_error_is_one_line(src):
    with pytest.raises(ChatTemplateError) as exc:
        ChatTemplate(src)
    assert "\n" not in str(exc.value)


def test_non_string_source():
    with pytest.raises(ChatTemplateError, match="string"):
        ChatTemplate(None)  # type: ignore[arg-type]


def test_runtime_type_error_is_wrapped():
    with pytest.raises(ChatTemplateError, match="render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "x"}])


# ---------------------------------------------------------------- messages


def test_validate_messages_ok_and_copies():
    original = [{"role": "user", "content": "hi", "name": "bob"}]
    out = validate_messages(original)
    assert out == original
    assert out[0] is not original[0]
    assert validate_messages(tuple(CONVO)) == CONVO
    assert validate_messages([{"role": "tool", "content": "{}"}]) == [{"role": "tool", "content": "{}"}]


@pytest.mark.parametrize(
    "messages, pattern",
    [
        ("hello", "list"),
        ({"role": "user", "content": "x"}, "list"),
        (None, "list"),
        ([], "empty"),
        (["hi"], r"messages\[0\]"),
        ([{"content": "x"}], "role None"),
        ([{"role": "robot", "content": "x"}], "robot"),
        ([{"role": "user"}], "no 'content'"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": None}], r"messages\[1\].*string"),
        ([{"role": "user", "content": ["a"]}], "string"),
    ],
)
def test_validate_messages_errors(messages, pattern):
    with pytest.raises(MessageError, match=pattern) as exc:
        validate_messages(messages)
    assert isinstance(exc.value, ValueError)
    assert "\n" not in str(exc.value)
