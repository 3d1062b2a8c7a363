"""Chat template: render messages to a prompt the way Hugging Face's apply_chat_template does."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infer.models.arch import UnknownArchitecture, architecture
from infer.quant.errors import InferError

from . import gemma4_format

ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(InferError, ValueError):
    """A chat template failed to compile or render, or raised on purpose via raise_exception."""


class MessageError(InferError, ValueError):
    """The chat messages are malformed."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# ---------------------------------------------------------------- built-in templates
# Used when the GGUF has no tokenizer.chat_template (Gemma 3 270M ships without one).

# Gemma's official format; equivalent to Gemma 3's HF template for string contents.
GEMMA_TEMPLATE = r"""{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

CHATML_TEMPLATE = r"""{%- for message in messages -%}
    {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|im_start|>assistant\n' }}
{%- endif -%}
"""

# Command-R's format (llama.cpp's LLM_CHAT_TEMPLATE_COMMAND_R, --chat-template command-r): each
# turn's content trimmed, as llama.cpp writes it.
COMMAND_R_TEMPLATE = r"""{%- set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} -%}
{%- for message in messages if message['role'] in tokens -%}
    {{ '<|START_OF_TURN_TOKEN|>' + tokens[message['role']] + message['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}
{%- endif -%}
"""

# Phi-3's format (llama.cpp's LLM_CHAT_TEMPLATE_PHI_3).
PHI3_TEMPLATE = r"""{%- for message in messages -%}
    {{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|assistant|>\n' }}
{%- endif -%}
"""

# Llama 3's format; tool results go in its "ipython" role.
LLAMA3_TEMPLATE = r"""{{ bos_token }}
{%- for message in messages -%}
    {%- set role = 'ipython' if message['role'] == 'tool' else message['role'] -%}
    {{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif -%}
"""

# Llama 4's format (llama.cpp's LLM_CHAT_TEMPLATE_LLAMA4, after the BOS its HF template writes);
# tool results go in its "ipython" role, as its HF template puts them.
LLAMA4_TEMPLATE = r"""{{ bos_token }}
{%- for message in messages -%}
    {%- set role = 'ipython' if message['role'] == 'tool' else message['role'] -%}
    {{ '<|header_start|>' + role + '<|header_end|>\n\n' + message['content'] | trim + '<|eot|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|header_start|>assistant<|header_end|>\n\n' }}
{%- endif -%}
"""

# Llama 2's [INST] format, as Meta's HF template writes it (it has no generation prompt).
LLAMA2_TEMPLATE = r"""{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set loop_messages = messages[1:] -%}
    {%- set system_message = messages[0]['content'] -%}
{%- else -%}
    {%- set loop_messages = messages -%}
    {%- set system_message = none -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- if loop.index0 == 0 and system_message is not none -%}
        {%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] -%}
    {%- else -%}
        {%- set content = message['content'] -%}
    {%- endif -%}
    {%- if message['role'] == 'user' -%}
        {{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' -%}
        {{ ' ' + content | trim + ' ' + eos_token }}
    {%- endif -%}
{%- endfor -%}
"""

# Families of architectures only the llama.cpp backend runs (infer's own name theirs in models/arch).
_OTHER_FAMILIES = MappingProxyType({"gemma": "gemma", "gemma3n": "gemma", "qwen2moe": "chatml"})


def builtin_template(arch: str, tokenizer_model: str, pre: str | None) -> str:
    """Jinja source of the built-in template for a model without tokenizer.chat_template: the family
    its architecture names (models/arch)."""
    try:
        family = architecture(arch).chat_template
    except UnknownArchitecture:
        family = _OTHER_FAMILIES.get(arch, "")
    if family == "gemma":
        return GEMMA_TEMPLATE
    if family == "gemma4":
        return gemma4_format.TEMPLATE
    if family == "chatml":
        return CHATML_TEMPLATE
    if family == "phi3":
        return PHI3_TEMPLATE
    if family == "llama4":
        return LLAMA4_TEMPLATE
    if family == "llama":
        if tokenizer_model == "gpt2" and pre == "llama-bpe":
            return LLAMA3_TEMPLATE
        return LLAMA2_TEMPLATE
    raise ChatTemplateError(
        f"model has no tokenizer.chat_template and there is no built-in chat template for architecture {arch!r}"
    )


# ---------------------------------------------------------------- environment


class _GenerationTag(jinja2.ext.Extension):
    """Accept HF's {% generation %}...{% endgeneration %} (assistant-mask markers) and render the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: object) -> None:
    raise ChatTemplateError(f"chat template raised: {_one_line(message)}")


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    # HF's override: Jinja's own tojson HTML-escapes and cannot pretty-print.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Errors a buggy template can raise while rendering; anything else is our bug and propagates.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        if not isinstance(source, str):
            raise ChatTemplateError(f"chat template must be a string, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {_one_line(e.message)}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {_one_line(e)}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for messages; kwargs (tools=..., etc.) become template variables."""
        context: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,
            "documents": None,
        }
        context.update(kwargs)
        context["messages"] = messages
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except _RENDER_ERRORS as e:
            raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {_one_line(e)}") from None


# llama.cpp's names for its built-in formats (llm_chat_template_from_str) that infer has as Jinja
# rendering as llama.cpp's do (tests/test_chat_template.py): what --chat-template NAME picks.  Not
# "llama2": infer's Llama 2 template is Meta's (<<SYS>>), llama.cpp's "llama2" another format.  The
# one difference left: llama.cpp's "gemma" trims the system turn, infer's (Google's template) does not.
NAMED_TEMPLATES = MappingProxyType({"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "llama4": LLAMA4_TEMPLATE,
                                    "gemma": GEMMA_TEMPLATE, "phi3": PHI3_TEMPLATE, "command-r": COMMAND_R_TEMPLATE})


def template_source(name_or_jinja: str) -> str:
    """A chat template given by name (NAMED_TEMPLATES) or as Jinja source (it has a {{ or {%)."""
    if name_or_jinja in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[name_or_jinja]
    if "{{" in name_or_jinja or "{%" in name_or_jinja:
        return name_or_jinja
    raise ChatTemplateError(f"unknown chat template {name_or_jinja[:60]!r}: give one of {', '.join(NAMED_TEMPLATES)} "
                            "or a Jinja template")


def load_chat_template(
    metadata_template: str | None,
    arch: str,
    tokenizer_model: str,
    pre: str | None,
    bos_token: str,
    eos_token: str,
) -> ChatTemplate:
    """The model file's template when it has one, else the built-in one for its architecture, else
    ChatML (llama.cpp's server does the same for a file without a template it knows), so a model
    without one still loads for completions and embeddings."""
    if metadata_template is not None and metadata_template.strip():
        source = metadata_template
    else:
        try:
            source = builtin_template(arch, tokenizer_model, pre)
        except ChatTemplateError:
            source = CHATML_TEMPLATE
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)


def validate_messages(messages: object) -> list[dict]:
    """Check messages are [{"role": one of ROLES, "content": str, ...}, ...]; return plain-dict copies."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise MessageError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise MessageError("messages must not be empty")
    out: list[dict] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise MessageError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"messages[{i}] has role {role!r}; expected one of {', '.join(ROLES)}")
        if "content" not in message:
            raise MessageError(f"messages[{i}] ({role}) has no 'content'")
        content = message["content"]
        if not isinstance(content, str):
            raise MessageError(f"messages[{i}] ({role}) content must be a string, got {type(content).__name__}")
        out.append(dict(message))
    return out
