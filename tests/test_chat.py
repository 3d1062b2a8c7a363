"""`infer chat` driven as a person drives it: in a pseudo-terminal, with pexpect."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pexpect
import pytest

PROMPT = ">>> "


@pytest.fixture()
def env(tmp_path):
    # a private infer home, so the chat history file lands in tmp_path
    return dict(os.environ, INFER_HOME=str(tmp_path), HF_HUB_OFFLINE="1", TERM="dumb", COLUMNS="200")


def _as_at_a_terminal():
    # a suite started as a background job (`cmd &` in a script) has SIGINT ignored, and children
    # inherit that: Ctrl-C would never reach the chat
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(env, gemma_path, *args, timeout=300):
    child = pexpect.spawn(sys.executable, ["-m", "infer.cli", "chat", str(gemma_path), *args], env=env,
                          encoding="utf-8", timeout=timeout, dimensions=(50, 200), preexec_fn=_as_at_a_terminal)
    child.expect_exact(PROMPT)
    return child


def say(child, line: str) -> str:
    """Send a line and return what came back before the next prompt."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    return child.before


@pytest.mark.e2e
def test_session(env, gemma_path, tmp_path):
    child = spawn(env, gemma_path, "--max-tokens", "24")
    assert "temperature = 0.0" in say(child, "/set temperature 0")
    first = say(child, "Hello! Who are you?")
    assert first.replace("Hello! Who are you?", "").strip()  # a reply came
    assert "0 reused from the cache" in say(child, "/stats")
    say(child, "What can you do?")
    stats = say(child, "/stats")
    reused = int(re.search(r"(\d+) reused from the cache", stats).group(1))
    assert reused >= 16  # the second turn's prompt starts with the first turn's blocks
    assert "unknown command '/frobnicate'" in say(child, "/frobnicate")
    conv = tmp_path / "conv.json"
    assert "saved 4 messages" in say(child, f"/save {conv}")
    saved = json.loads(conv.read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]
    assert saved["messages"][0]["content"] == "Hello! Who are you?"
    assert "new conversation" in say(child, "/clear")
    assert "used by 0 messages" in say(child, "/show")
    assert "loaded 4 messages" in say(child, f"/load {conv}")
    shown = say(child, "/show")
    assert "used by 4 messages" in shown and "temperature 0.0" in shown
    # a multi-line message
    child.sendline('"""')
    child.sendline("Line one")
    child.sendline('line two"""')
    child.expect_exact(PROMPT)
    assert "used by 6 messages" in say(child, "/show")
    # Ctrl-C stops a reply in progress; the partial reply stays in the conversation
    say(child, "/set max_tokens 2000")
    child.sendline("Tell me a very long story about a dragon and a knight.")
    child.expect_exact("knight.")  # the echo of the line
    child.expect(r"\w")  # the reply has started
    child.sendintr()
    child.expect_exact("(stopped)")
    child.expect_exact(PROMPT)
    assert "used by 8 messages" in say(child, "/show")
    # the engine keeps serving after the interrupted reply
    say(child, "/set max_tokens 8")
    say(child, "Thanks!")
    assert re.search(r"reply [1-8] tok", say(child, "/stats"))
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (tmp_path / "chat_history").exists()  # readline history kept across sessions


@pytest.mark.e2e
def test_ctrl_d_and_ctrl_c_at_empty_prompt_exit(env, gemma_path):
    child = spawn(env, gemma_path)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = spawn(env, gemma_path)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.e2e
def test_context_overflow_drops_oldest_turns(env, gemma_path):
    child = spawn(env, gemma_path, "--ctx", "96", "--max-tokens", "16", "--temperature", "0", "--system", "Be brief.")
    seen = ""
    for i in range(6):
        seen += say(child, f"Tell me fact number {i} about the ocean.")
    assert "outgrew the context of 96 tokens" in seen
    shown = say(child, "/show")
    assert "system: 'Be brief.'" in shown
    used = int(re.search(r"context: (\d+) of 96", shown).group(1))
    assert used < 96
    # a message too long even alone is refused, and the conversation it would have pushed out stays
    kept = re.search(r"used by (\d+) messages", shown).group(1)
    assert "the message alone has" in say(child, "ocean " * 200)
    assert f"used by {kept} messages" in say(child, "/show")
    child.sendline("/bye")
    child.expect(pexpect.EOF)


class _WordsLLM:
    """Just enough of an LLM for Conversation.fit: one token per word, no model."""

    def __init__(self, n_ctx: int):
        self.engine = SimpleNamespace(n_ctx=n_ctx)
        self.template = self
        self.interrupt = False

    def render(self, messages, add_generation_prompt=True, **variables):
        if self.interrupt:
            raise KeyboardInterrupt  # Ctrl-C while the prompt is rendered
        return " ".join(m["content"] for m in messages)

    def encode_chat(self, messages, **variables):
        return list(range(len(self.render(messages).split())))


def test_a_turn_that_never_began_leaves_the_conversation_as_it_was():
    # found by scripts/soak_chat.py: a paste too long even alone silently cost the whole conversation,
    # and Ctrl-C while the prompt was rendered left a user message with no reply, after which the
    # template refused every turn (roles must alternate)
    from infer.engine.conversation import Conversation, TurnStats
    from infer.engine.engine import PromptError

    llm = _WordsLLM(n_ctx=40)
    conv = Conversation(llm, system="Be brief.")
    history = [{"role": r, "content": f"{r} said five words"} for r in ("user", "assistant") * 2]
    conv.messages = [dict(m) for m in history]
    with pytest.raises(PromptError, match="the message alone has"):
        list(conv.turn("word " * 50, None, TurnStats()))
    assert conv.messages == history
    llm.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        list(conv.turn("hi", None, TurnStats()))
    assert conv.messages == history


@pytest.mark.e2e
def test_piped_input_answers_once(env, gemma_path):
    cmd = [sys.executable, "-m", "infer.cli", "chat", str(gemma_path), "--temperature", "0", "--max-tokens", "8"]
    r = subprocess.run(cmd + ["--json"], input="What is 2+2?\n", capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reply"] and out["completion_tokens"] <= 8 and out["finish_reason"] in ("stop", "length")
    plain = subprocess.run(cmd, input="What is 2+2?\n", capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 0 and plain.stdout.strip() == out["reply"].strip()
    empty = subprocess.run(cmd, input="", capture_output=True, text=True, env=env, timeout=300)
    assert empty.returncode != 0 and "Traceback" not in empty.stderr


THINKING = """{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""


@pytest.mark.e2e
def test_thinking_is_dimmed_and_switchable(env, tmp_path):
    # a template that opens <think> (as DeepSeek-R1's and Qwen3's do); a grammar makes the tiny
    # random model think a few words, close the thought and answer
    from helpers.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "thinker.gguf", "qwen2", seed=5, chat_template=THINKING, n_ctx=1024)
    grammar = tmp_path / "think.gbnf"
    grammar.write_text('root ::= [a-z ]{3,12} "</think>" "\\n\\n" "yes"')
    child = spawn(dict(env, TERM="xterm-256color"), path, "--grammar", str(grammar), "--max-tokens", "60")
    out = say(child, "hi")
    assert re.search(r"\x1b\[2m[a-z ]{3,12}\x1b\[0m", out), repr(out)  # the thought, dimmed
    assert out.rstrip().endswith("yes") and "</think>" not in out
    assert "thinking off" in say(child, "/set think off")
    assert "usage: /set think on|off" in say(child, "/set think maybe")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
