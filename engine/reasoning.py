"""Reasoning models' thinking, kept apart from the answer.

DeepSeek-R1 distills, Qwen3 and QwQ write their reasoning between <think> and </think> before the
answer; some templates open the <think> in the prompt already, so the reply starts inside it.
llama.cpp returns the thinking as `reasoning_content` (its --reasoning-format deepseek, the
default) and ollama as `thinking`; "none" leaves it in the text.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "deepseek")


def thinks(template_source: str) -> bool:
    """Whether a chat template belongs to a model that thinks in <think> tags."""
    return CLOSE in template_source or OPEN in template_source


def opened_in_prompt(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a <think> open (the reply starts inside it)."""
    tail = prompt_text.rstrip()
    return tail.endswith(OPEN)


class ThinkStream:
    """Splits a streamed reply into (reasoning, content) pieces; a tag cut between two pieces is
    held back until it is whole."""

    def __init__(self, inside: bool = False):
        self.inside = inside  # in the thinking now
        self.seen_open = inside
        self.done = False  # the thinking has ended: everything else is content
        self.after_close = False  # newlines right after </think> are dropped, however they arrive
        self.held = ""

    def feed(self, text: str) -> tuple[str, str]:
        text = self.held + text
        self.held = ""
        reasoning, content = [], []
        while text:
            if self.done:
                if self.after_close:
                    text = text.lstrip("\n")
                    self.after_close = not text
                content.append(text)
                break
            if not self.inside:
                stripped = text.lstrip()
                if not stripped:  # whitespace before a possible <think>: wait for more
                    self.held = text
                    break
                if stripped.startswith(OPEN):
                    self.inside = self.seen_open = True
                    text = stripped[len(OPEN):]
                    continue
                if OPEN.startswith(stripped):  # the tag may still be arriving
                    self.held = text
                    break
                self.done = True  # no thinking: the whole reply is the answer
                continue
            i = text.find(CLOSE)
            if i >= 0:
                reasoning.append(text[:i])
                text = text[i + len(CLOSE):]
                self.inside, self.done, self.after_close = False, True, True
                continue
            keep = next((n for n in range(len(CLOSE) - 1, 0, -1) if text.endswith(CLOSE[:n])), 0)
            reasoning.append(text[:len(text) - keep])
            self.held = text[len(text) - keep:]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back at the end (an unfinished thought stays reasoning)."""
        held, self.held = self.held, ""
        if self.inside:
            return held, ""
        return "", held
