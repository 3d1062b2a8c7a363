"""SmolLM3's chat template (llama.cpp's models/templates/HuggingFaceTB-SmolLM3-3B.jinja) through
engine/chat_template.py: thinking on by default ("Reasoning Mode: /think" in its system header, the
reply writes its own <think>), off with enable_thinking=False or a "/no_think" in the system message
(an empty thought closed in the prompt), the flags taken out of the custom instructions. The
template writes no tool syntax, so tools take the generic family (described in the system message).
FIXTURE (helpers/smollm3_template.py) is our condensation of it (its default instructions
shortened, the logic as it is); where llama-cpp-python's vendored tree has the real one, it renders
the same conversations the same way."""
from __future__ import annotations

import pytest

from helpers.llama_vocab import chat_template
from helpers.smollm3_template import FIXTURE
from infer.engine.chat_template import ChatTemplate
from infer.engine.reasoning import opened_in_prompt, split_reply, style
from infer.engine.tool_calls import family, parse_tools, prepare

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]


def header(mode: str, instructions: str = "Be brief.") -> str:
    return (f"<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: {mode}\n\n"
            f"## Custom Instructions\n\n{instructions}\n\n<|im_end|>\n")


def test_thinking_on_by_default():
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(CONVO)
    assert out == (header("/think") + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n")
    # the reply opens its own <think>: split off as the reasoning
    assert style(FIXTURE) == "think" and not opened_in_prompt(out)
    assert split_reply("think", "<think>\nThey greet me.\n</think>\nFine, thanks!") == ("\nThey greet me.\n",
                                                                                      "Fine, thanks!")


@pytest.mark.parametrize("how", ["variable", "system flag"])
def test_thinking_off(how):
    convo = [{"role": "system", "content": "Be brief. /no_think"}, *CONVO[1:]] if how == "system flag" else CONVO
    kw = {"enable_thinking": False} if how == "variable" else {}
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(convo, **kw)
    assert out.startswith(header("/no_think"))  # the flag taken out of the instructions
    assert "<|im_start|>assistant\n<think>\n\n</think>\nHello!<|im_end|>" in out
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n") and not opened_in_prompt(out)
    assert split_reply("think", "Fine, thanks!") == ("", "Fine, thanks!")


def test_think_flag_overrides_the_variable():
    convo = [{"role": "system", "content": "/think Be brief."}, *CONVO[1:]]
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(convo, enable_thinking=False)
    assert out.startswith(header("/think", " Be brief.")) and out.endswith("<|im_start|>assistant\n")


def test_tools_take_the_generic_family():
    assert family(FIXTURE) == "generic"
    tools = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
    msgs, variables = prepare(CONVO, tools, "generic", "auto")
    out = ChatTemplate(FIXTURE, "", "<|im_end|>").render(msgs, **variables)
    instructions = out.split("## Custom Instructions\n\n", 1)[1]
    assert instructions.startswith("Be brief.\n\nYou can call these tools") and "get_weather" in instructions


@pytest.mark.reference
@pytest.mark.parametrize("system", ["Be brief.", "Be brief. /no_think", "/think Be brief."])
@pytest.mark.parametrize("thinking", [None, False])
def test_real_template_renders_as_the_fixture(system, thinking):
    kw = {} if thinking is None else {"enable_thinking": thinking}
    text = chat_template("HuggingFaceTB-SmolLM3-3B.jinja").read_text()
    real, ours = ChatTemplate(text, "", "<|im_end|>"), ChatTemplate(FIXTURE, "", "<|im_end|>")
    convo = [{"role": "system", "content": system}, *CONVO[1:], {"role": "tool", "content": "22C"}]
    assert real.render(convo, **kw) == ours.render(convo, **kw)
    # without a system message only the default instructions differ (ours are shortened)
    for r, o in zip(real.render(CONVO[1:], **kw).split("<|im_end|>")[1:], ours.render(CONVO[1:], **kw).split("<|im_end|>")[1:]):
        assert r == o
