"""A chat completion's tools and reasoning: the request's tools turned into the prompt and a grammar
(engine/tool_calls.py), and the reply's text split into content, reasoning_content and tool_calls
(engine/reasoning.py), whole or as stream deltas."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from infer.engine.chat_template import ChatTemplateError
from infer.engine.grammar import with_thought
from infer.engine.reasoning import EFFORTS, opened_in_prompt, reply_stream, spelled_out, style
from infer.engine.tool_calls import (
    ReplyStream,
    Tool,
    ToolCall,
    ToolError,
    family,
    grammar,
    marker,
    parse_tool_choice,
    parse_tools,
    prepare,
    with_text_arguments,
)

from .openai_request import APIError, Job, kind


@dataclass(frozen=True)
class ChatPlan:
    """How one chat request is rendered and its reply read."""

    messages: list[dict]
    variables: dict  # template variables (tools)
    family: str | None  # the tool-call syntax read from the reply (None: no tools in play)
    # how reasoning_content is split off: "think" (<think> tags), "mistral" ([THINK] tags), "harmony"
    # (gpt-oss's channels), "" not
    reasoning: str
    tools: list[Tool] = field(default_factory=list)
    triggers: tuple[str, ...] = ()  # where the tools' grammar starts ("auto": at a call)
    # gpt-oss's channel markers and Mistral's [THINK] are control tokens: spelled out, for the splitter
    # or (--reasoning-format none) in the content, as llama.cpp leaves them; never silently dropped
    markers: bool = False
    # a forced call (tool_choice "required" or named) or a JSON response format, of a model that
    # thinks, with thinking on: the grammar lets one thought come first, as llama.cpp's does
    thought: bool = False


# the request fields plan() reads (OpenAI's spelling; ollama's is the same)
PLAN_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "reasoning_effort", "chat_template_kwargs")
# template variables the renderer sets itself: a request's chat_template_kwargs cannot name them
RENDERER_VARIABLES = ("messages", "add_generation_prompt")


def plan_fields(body: dict) -> dict:
    """The fields of a request body that plan() reads."""
    return {k: body[k] for k in PLAN_FIELDS if k in body}


def plan(body: Mapping, messages: list[dict], template_source: str, reasoning_format: str, job: Job, token_id):
    """The ChatPlan of a request, and the grammar its tools need (or None); 400 on bad tools.
    token_id(text): the vocabulary's token spelled text (tool-call markers that are one token)."""
    try:
        tools = parse_tools(body["tools"]) if body.get("tools") is not None else []
    except ToolError as e:
        raise APIError(400, str(e), e.field or "tools", "invalid_value") from None
    try:
        mode, name = parse_tool_choice(body.get("tool_choice"), tools)
    except ToolError as e:
        raise APIError(400, str(e), e.field or "tool_choice", "invalid_value") from None
    parallel = body.get("parallel_tool_calls")  # absent: the template's default (tool_calls.parallel_default)
    if "parallel_tool_calls" in body and not isinstance(parallel, bool):
        raise APIError(400, f"'parallel_tool_calls' must be true or false, got {kind(parallel)}",
                       "parallel_tool_calls", "invalid_type")
    active = bool(tools) and mode != "none"
    fam = family(template_source) if active or any(m.get("tool_calls") for m in messages) else None
    msgs, variables = prepare(messages, tools, fam, mode) if fam else (messages, {})
    g, triggers = grammar(tools, fam, mode, name, parallel, token_id) if active else (None, ())
    if triggers and job.params.grammar is not None:  # "auto" beside a response format: that format holds
        g, triggers = None, ()
    if g is not None and job.params.grammar is not None:
        raise APIError(400, f"'tools' with tool_choice {mode!r} cannot be combined with '{job.grammar_param}'",
                       job.grammar_param, "invalid_value")
    reasoning_style = style(template_source)
    reasoning = reasoning_style if reasoning_format == "deepseek" else ""
    extra = body.get("chat_template_kwargs")  # llama-server's and vLLM's: e.g. {"enable_thinking": false}
    if extra is not None:
        if not isinstance(extra, dict):
            raise APIError(400, f"'chat_template_kwargs' must be an object, got {kind(extra)}",
                           "chat_template_kwargs", "invalid_type")
        taken = [k for k in extra if k in RENDERER_VARIABLES]
        if taken:
            raise APIError(400, f"'chat_template_kwargs' cannot set {taken[0]!r}", "chat_template_kwargs",
                           "invalid_value")
        variables = {**extra, **variables}  # the request's tools win over a variable of the same name
    effort = body.get("reasoning_effort")  # OpenAI's field; gpt-oss's template takes it as a variable
    if effort is not None:
        if effort not in EFFORTS:
            raise APIError(400, f"'reasoning_effort' must be low, medium or high, got {effort!r}"[:200],
                           "reasoning_effort", "invalid_value")
        variables = {**variables, "reasoning_effort": effort}
    fmt = job.params.grammar
    # held from the first token: a forced call, or a JSON response format
    held = (g is not None and not triggers) or (g is None and fmt is not None and fmt.kind in ("json", "json_schema"))
    thought = held and bool(reasoning) and variables.get("enable_thinking") is not False
    return ChatPlan(msgs, variables, fam if active else None, reasoning, tools, triggers,
                    spelled_out(reasoning_style), thought), g


def constrain(job: Job, plan: ChatPlan, tool_grammar, opened: bool, token_id=lambda text: None) -> tuple[Job, bool]:
    """The job with its tools' grammar (the reply detokenized with special tokens spelled out:
    several families' markers are control tokens), and whether the reply starts inside a <think>
    the prompt opened.  A forced call or a JSON response format of a thinking model (plan.thought)
    may think first, in its style's markers (or finish the thought the prompt opened); otherwise,
    where a grammar holds JSON from the first token, there is no room to think; a GBNF grammar is
    the client's whole reply (a thought included).  token_id(text): the vocabulary's token spelled text."""
    params = job.params
    if plan.markers:
        params = replace(params, special=True)
    if plan.thought:
        held = tool_grammar if tool_grammar is not None else params.grammar
        params = replace(params, grammar=with_thought(held, plan.reasoning, opened, lambda text: marker(text, token_id)),
                         grammar_triggers=())
        if tool_grammar is not None or plan.family:
            params = replace(params, special=True)
        if tool_grammar is not None:
            job = replace(job, grammar_param="tools")
        return replace(job, params=replace(params, thinking=opened)), opened
    if tool_grammar is not None or plan.family:
        params = replace(params, grammar=tool_grammar or params.grammar, grammar_triggers=plan.triggers, special=True)
        if tool_grammar is not None:
            job = replace(job, grammar_param="tools")
    g = params.grammar
    opened = opened and not (g is not None and not params.grammar_triggers and g.kind in ("json", "json_schema", "lark"))
    return replace(job, params=replace(params, thinking=opened)), opened


def encode(llm, plan: ChatPlan) -> tuple[list[int], bool]:
    """The prompt's tokens, and whether it leaves a <think> open (the reply starts inside it).
    Tool calls' arguments go to the template as objects (what most templates index), or as JSON
    text where the template only takes strings (DeepSeek-R1's)."""
    try:
        ids = llm.encode_chat(plan.messages, **plan.variables)
    except ChatTemplateError:
        if not any(m.get("tool_calls") for m in plan.messages):
            raise
        ids = llm.encode_chat(with_text_arguments(plan.messages), **plan.variables)
    return ids, plan.reasoning == "think" and opened_in_prompt(llm.tokenizer.decode(ids[-16:], special=True))


class ChatReply:
    """One reply's text, split as it arrives: reasoning, content, and tool calls at the end."""

    def __init__(self, plan: ChatPlan, opened: bool):
        self.think = reply_stream(plan.reasoning, opened) if plan.reasoning else None
        self.calls = ReplyStream(plan.family, plan.tools) if plan.family else None

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that can go out now."""
        reasoning, content = self.think.feed(text) if self.think else ("", text)
        if self.calls:
            content = self.calls.feed(content)
        return reasoning, content

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        """(reasoning, content, tool calls) left at the end."""
        reasoning, content = self.think.finish() if self.think else ("", "")
        calls: list[ToolCall] = []
        if self.calls:
            content = self.calls.feed(content)
            tail, calls = self.calls.finish()
            content += tail
        return reasoning, content, calls


def message(reasoning: str, content: str, calls: list[ToolCall]) -> dict:
    """The assistant message of a whole reply."""
    msg: dict = {"role": "assistant", "content": content if content or not calls else None, "refusal": None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [c.as_openai() for c in calls]
    return msg


def call_deltas(calls: list[ToolCall]) -> list[dict]:
    """Stream deltas of the tool calls, one per call (its id, name and whole arguments)."""
    return [{"tool_calls": [{"index": i, **c.as_openai()}]} for i, c in enumerate(calls)]
