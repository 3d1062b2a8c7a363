"""A chat conversation: messages, the prompt they render to, and fitting it in the context.

Each turn renders the whole conversation with the chat template; the engine's prefix cache
finds the previous turns' blocks, so only the new tokens are computed.  When the conversation
outgrows the context, the oldest turns are dropped (the system prompt stays).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from infer.quant.errors import InferError

from .engine import Event, PromptError
from .reasoning import spelled_out, split_reply, style
from .sampler import SamplingParams

ROLES = ("system", "user", "assistant")


class ConversationError(InferError, ValueError):
    """A conversation file that cannot be loaded."""


@dataclass
class TurnStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the previous turns' KV blocks
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0
    dropped_turns: int = 0  # oldest turns dropped so the prompt fits the context
    finish_reason: str = ""


@dataclass
class Conversation:
    llm: object
    system: str | None = None
    messages: list[dict] = field(default_factory=list)  # user and assistant turns, no system
    reserve: int = 256  # tokens kept free for the reply when fitting the prompt
    variables: dict = field(default_factory=dict)  # template variables (enable_thinking=...)
    # what the engine computed last turn: the prompt's text and ids, then the reply's text and ids
    _last: tuple[str, list[int]] | None = field(default=None, repr=False)
    _prompt: tuple[str, list[int]] = field(default=("", []), repr=False)  # this turn's, as fitted

    def full_messages(self) -> list[dict]:
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        return sys_msg + self.messages

    def _encode(self) -> tuple[str, list[int]]:
        """The conversation's prompt text and ids.  When the text continues last turn's prompt and
        reply, the ids do too: the reply's tokens as generated (re-tokenizing its text could split
        it differently), then the new text's, so the prefix cache finds every earlier block."""
        llm = self.llm
        text = llm.template.render(self.full_messages(), add_generation_prompt=True, **self.variables)
        if self._last is not None and text.startswith(self._last[0]):
            tail = llm.tokenizer.encode(text[len(self._last[0]):], add_special=False, parse_special=True)
            return text, self._last[1] + tail
        return text, llm.encode_chat(self.full_messages(), **self.variables)

    def fit(self) -> tuple[list[int], int]:
        """The prompt of the conversation, dropping the oldest turns until it fits; (ids, turns dropped)."""
        n_ctx = self.llm.engine.n_ctx
        budget = max(n_ctx - min(self.reserve, n_ctx // 4), 1)
        dropped = 0
        kept, last = list(self.messages), self._last
        try:
            while True:
                text, ids = self._encode()
                if len(ids) < budget or len(self.messages) <= 1:
                    break
                # drop the oldest exchange (a user turn and the reply to it)
                n = 2 if len(self.messages) > 2 and self.messages[1]["role"] == "assistant" else 1
                del self.messages[:n]
                dropped += n
                self._last = None
            if len(ids) >= n_ctx:
                raise PromptError(f"the message alone has {len(ids)} tokens but the context holds {n_ctx}; "
                                  f"shorten it or raise --ctx")
        except BaseException:
            # Nothing fitted (a message too long even alone, a template error, Ctrl-C while rendering):
            # put back the turns dropped for it, or one failed message would cost the whole conversation.
            self.messages[:], self._last = kept, last
            raise
        self._prompt = (text, ids)
        return ids, dropped

    def turn(self, text: str, params: SamplingParams, stats: TurnStats) -> Iterator[Event]:
        """Add a user message and stream the reply; the reply (even a partial one, if the consumer
        stops early) is added to the conversation when the stream ends."""
        self.messages.append({"role": "user", "content": text})
        try:
            ids, stats.dropped_turns = self.fit()
        except BaseException:
            # No reply began (too long, a template error, Ctrl-C while the prompt was rendered): the
            # message goes too, or the roles would stop alternating and every later turn would fail.
            self.messages.pop()
            raise
        stats.prompt_tokens = len(ids)
        parts: list[str] = []
        self._last = None
        kind = style(self.llm.template.source)
        harmony = kind == "harmony"
        if spelled_out(kind):  # gpt-oss's channel markers, Mistral's [THINK]: control tokens, spelled out
            params = replace(params, special=True)  # to tell the answer apart
        try:
            for ev in self.llm.generate(ids, params):
                parts.append(ev.text)
                if ev.finish_reason is not None:
                    u = ev.usage
                    stats.cached_tokens, stats.completion_tokens = u.cached_tokens, u.completion_tokens
                    stats.ttft_ms, stats.decode_tok_s = u.ttft_ms, u.decode_tok_s
                    stats.finish_reason = ev.finish_reason
                    if ev.finish_reason != "stop" or not params.stop:  # a stop string cut the text
                        text, prompt_ids = self._prompt
                        self._last = (text + "".join(parts), prompt_ids + ev.token_ids)
                yield ev
        finally:
            reply = "".join(parts)
            if harmony:  # its markers in the text: the answer, and
                thinking, reply = split_reply("harmony", reply)  # the thinking where the template keeps it
                self.messages.append({"role": "assistant", "content": reply, "thinking": thinking})
            else:
                self.messages.append({"role": "assistant", "content": reply})

    @property
    def prompt_text(self) -> str:
        """This turn's prompt as rendered (after turn() has started)."""
        return self._prompt[0]

    def clear(self) -> None:
        self.messages.clear()
        self._last = None

    def to_json(self) -> dict:
        return {"system": self.system, "messages": self.messages}

    def save(self, path: str | Path) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        tmp.replace(p)

    def load(self, path: str | Path) -> None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConversationError(f"cannot load {path}: {e}") from None
        if isinstance(data, list):  # a bare list of messages, as OpenAI clients keep them
            data = {"messages": data}
        msgs = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(msgs, list) or not all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in msgs):
            raise ConversationError(f"{path} is not a conversation: expected messages with role and content")
        system = data.get("system")
        sys_msgs = [m["content"] for m in msgs if m["role"] == "system"]
        self.system = system if isinstance(system, str) else (sys_msgs[0] if sys_msgs else None)
        self._last = None
        self.messages = [dict(role=m["role"], content=m["content"]) for m in msgs if m["role"] != "system"]
