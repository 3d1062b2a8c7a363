"""Reasoning models' thinking, kept apart from the answer.

DeepSeek-R1 distills, Qwen3, QwQ and SmolLM3 write their reasoning between <think> and </think>
before the answer; some templates open the <think> in the prompt already, so the reply starts
inside it. Mistral's reasoning models (Magistral, Ministral 3) write it between [THINK] and
[/THINK], control tokens of their vocabulary. Gemma 4 thinks in a channel, "<|channel>thought\n...
<channel|>" (control tokens too; the whitespace after "thought" is not part of the thought, as
llama.cpp's parser skips it).
llama.cpp returns the thinking as `reasoning_content` (its --reasoning-format deepseek, the
default) and ollama as `thinking`; "none" leaves it in the text.
"""
from __future__ import annotations

import json

OPEN, CLOSE = "<think>", "</think>"
MISTRAL_OPEN, MISTRAL_CLOSE = "[THINK]", "[/THINK]"
GEMMA4_CHANNEL = "<|channel>"
GEMMA4_OPEN, GEMMA4_CLOSE = GEMMA4_CHANNEL + "thought", "<channel|>"
FORMATS = ("none", "deepseek")
# each tagged style's (open, close) tags
TAGS = {"think": (OPEN, CLOSE), "mistral": (MISTRAL_OPEN, MISTRAL_CLOSE), "gemma4": (GEMMA4_OPEN, GEMMA4_CLOSE)}
# styles whose thought starts after whitespace that is not part of it
TRIMMED = ("gemma4",)


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

    def __init__(self, inside: bool = False, tags: tuple[str, str] = (OPEN, CLOSE), trim: bool = False):
        self.open, self.close = tags
        self.trim = trim  # whitespace right after the open tag is dropped, however it arrives
        self.started = False  # some of the thought's text has been seen
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
                if stripped.startswith(self.open):
                    self.inside = self.seen_open = True
                    text = stripped[len(self.open):]
                    continue
                if self.open.startswith(stripped):  # the tag may still be arriving
                    self.held = text
                    break
                self.done = True  # no thinking: the whole reply is the answer
                continue
            if self.trim and not self.started:
                text = text.lstrip()
                self.started = bool(text)
                if not text:
                    break
            i = text.find(self.close)
            if i >= 0:
                reasoning.append(text[:i])
                text = text[i + len(self.close):]
                self.inside, self.done, self.after_close = False, True, True
                continue
            keep = next((n for n in range(len(self.close) - 1, 0, -1) if text.endswith(self.close[:n])), 0)
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


# gpt-oss's chat format (OpenAI's harmony): the reply is messages on channels, each
# "<|channel|>NAME<|message|>TEXT<|end|>", the next one after "<|start|>assistant"; "analysis" is
# the thinking, "final" (and "commentary", the text around tool calls) the answer; the reply ends
# at <|return|> or <|call|> (end-of-generation tokens, so never in the text).  The markers are
# control tokens: the reply must be detokenized with them spelled out (SamplingParams.special).
EFFORTS = ("low", "medium", "high")  # gpt-oss's reasoning effort, a variable of its template
CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
_STOPS = (END, START, "<|return|>", "<|call|>")


def style(template_source: str) -> str:
    """How a model's template says it reasons: "harmony" (gpt-oss's channels), "mistral" ([THINK]
    tags), "gemma4" (its thought channel), "think" (<think> tags), or "" (it does not)."""
    if CHANNEL in template_source and MESSAGE in template_source:
        return "harmony"
    if GEMMA4_OPEN in template_source and GEMMA4_CLOSE in template_source:
        return "gemma4"
    if MISTRAL_OPEN in template_source and MISTRAL_CLOSE in template_source:
        return "mistral"
    return "think" if thinks(template_source) else ""


def spelled_out(kind: str) -> bool:
    """Whether a style's markers are control tokens, so the reply must be detokenized with special
    tokens spelled out for its splitter to see them (gpt-oss's channels, Mistral's [THINK], Gemma 4's
    channel)."""
    return kind in ("harmony", "mistral", "gemma4")


class HarmonyStream:
    """Splits a streamed harmony reply into (reasoning, content) pieces, the markers dropped; a
    marker cut between two pieces is held back until it is whole."""

    def __init__(self):
        self.channel: str | None = None  # in a message's text on this channel; None: in a header
        self.held = ""

    def feed(self, text: str) -> tuple[str, str]:
        text = self.held + text
        self.held = ""
        reasoning, content = [], []
        while text:
            if self.channel is None:  # a header: "[<|start|>assistant]<|channel|>NAME[ ...]<|message|>"
                i = text.find(MESSAGE)
                if i < 0:
                    head = text.lstrip()
                    if not head.startswith("<|") and not any(t.startswith(head) for t in (CHANNEL, START)):
                        self.channel = "final"  # no header at all: plain text is the answer
                        continue
                    self.held = text
                    break
                header, text = text[:i], text[i + len(MESSAGE):]
                words = header.split(CHANNEL, 1)[1].split("<|", 1)[0].split() if CHANNEL in header else []
                self.channel = words[0] if words else "final"  # a header naming no channel: the answer
                continue
            ends = [(i, t) for t in _STOPS if (i := text.find(t)) >= 0]
            if ends:
                i, tag = min(ends)
                (reasoning if self.channel == "analysis" else content).append(text[:i])
                text = text[i + len(tag):] if tag != START else text[i:]
                self.channel = None
                continue
            keep = next((n for n in range(max(map(len, _STOPS)) - 1, 0, -1)
                         if any(text.endswith(t[:n]) for t in _STOPS)), 0)
            (reasoning if self.channel == "analysis" else content).append(text[:len(text) - keep])
            self.held = text[len(text) - keep:]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back at the end: text of the channel it was in (a header alone: nothing)."""
        held, self.held = self.held, ""
        if self.channel is None:
            return "", ""
        return (held, "") if self.channel == "analysis" else ("", held)


# Each style's thought as a forced tool call's grammar lets it come first (llama.cpp's per-format
# parsers put an optional thought before a required call): its opening and closing markers as
# pieces, each marker written as one token where the vocabulary has it, else as text.
# harmony: the analysis message, then the header of the final one, which holds the call.
THOUGHT_PIECES = {
    "think": ((OPEN,), (CLOSE,)),
    "mistral": ((MISTRAL_OPEN,), (MISTRAL_CLOSE,)),
    "gemma4": ((GEMMA4_CHANNEL, "thought"), (GEMMA4_CLOSE,)),
    "harmony": ((CHANNEL, "analysis", MESSAGE), (END, START, "assistant", CHANNEL, "final", MESSAGE)),
}
THOUGHT_SPACE = "/[ \\t\\r\\n]{0,4}/"  # between the thought and the call (Qwen3 writes two newlines)


def thought_rules(kind: str, opened: bool, lit) -> str:
    """Lark rules of a style's thought, as the rule `thought` (opened: the prompt opened it, so only
    its rest up to the close).  lit(text): a marker piece as one token (<[id]>) or as quoted text.
    The thought's text runs to the first close: after a close token, any text (no text spells a
    control token); after a close that is text, one lazy lexeme up to it (a greedy one could run past it)."""
    def piece(text: str) -> str:  # a word ("thought", "final") as text: the model spells it as it likes
        return json.dumps(text) if text.isalnum() else lit(text)

    opens, closes = THOUGHT_PIECES[kind]
    head = "" if opened else " ".join(piece(p) for p in opens) + " "
    first, rest = piece(closes[0]), " ".join(piece(p) for p in closes[1:])
    if first.startswith("<["):
        body = f"thought_text {first}"
        text = "thought_text: /(?s:.*)/"
    else:
        escaped = "".join(c if c.isalnum() else "\\" + c if c in "/\\.^$|?*+()[]{}" else c for c in closes[0])
        body = "thought_text"
        text = f"thought_text[lazy]: /(?s:.*?){escaped}/"
    return f"thought: {head}{body} {rest}".rstrip() + "\n" + text


def reply_stream(kind: str, opened: bool = False) -> "ThinkStream | HarmonyStream":
    """The splitter of a reply in a model's reasoning style (style()); opened: a <think> the prompt opened."""
    return HarmonyStream() if kind == "harmony" else ThinkStream(opened, TAGS[kind], kind in TRIMMED)


def split_reply(kind: str, text: str) -> tuple[str, str]:
    """A whole reply's (reasoning, content)."""
    s = reply_stream(kind)
    r1, c1 = s.feed(text)
    r2, c2 = s.finish()
    return r1 + r2, c1 + c2
