"""The one way a generation request goes through a model, whatever API it came by.

An adapter (openai_server.py's OpenAI routes, ollama_api.py's) checks its wire format and builds a
Generation; the service takes it from there: plan the chat (tools, reasoning) -> encode the prompt
-> constrain the output (the tools' grammar) -> compile the grammar -> fit max_tokens to the
context -> admit it past the queue -> stream the engine's events.  The adapter renders the Stream
it gets back in its own shapes.  Service is the seam they depend on, as backends/base.py's Runner
is the engine's: a small Protocol, with EngineService its one implementation.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Mapping, Protocol, Union

from starlette.requests import Request

from infer.engine.engine import PromptError
from infer.engine.grammar import GrammarError
from infer.engine.reasoning import style
from infer.engine.request import Event
from infer.engine.sampler import SamplingParams, TokenLogprob
from infer.quant.errors import InferError

from . import openai_chat
from .openai_request import APIError, ClientGone, Job, disconnected, kind, parse_json
from .server_metrics import Metrics

# where model_router.py leaves a request's parsed body in its ASGI scope, for the model's routes
PARSED_BODY = "infer.body"


@dataclass(frozen=True)
class ServerConfig:
    model_id: str
    model_aliases: tuple[str, ...] = ()  # other names of the model (ollama's routes take them)
    api_key: str | None = None
    max_queue: int = 64  # requests that would wait for a running slot beyond this many get 503
    max_body: int = 8 * 2**20
    cors_origins: tuple[str, ...] = ()
    reasoning_format: str = "deepseek"  # --reasoning-format: "deepseek" splits <think> off as reasoning_content
    any_name: bool = False  # behind model_router.py, which has resolved the request's model name already
    seed: int | None = None  # --seed: the seed of requests that name none (None: a fresh one each)
    webui: bool = True  # GET / from a browser: the chat page (webui.py); --no-webui: ollama's answer only


# -- the request, in the service's terms ------------------------------------------------------------


@dataclass(frozen=True)
class ChatPrompt:
    """Messages rendered by the model's chat template, the reply split into reasoning, content and
    tool calls (openai_chat.py)."""

    messages: list[dict]  # checked already (openai_request.chat_messages)
    # tools, tool_choice, parallel_tool_calls, reasoning_effort as OpenAI spells them (openai_chat.plan_fields)
    fields: Mapping[str, Any] = field(default_factory=dict)
    reasoning_format: str | None = None  # None: the server's --reasoning-format
    think: bool | str | None = None  # ollama's think: False turns thinking off, a level is gpt-oss's effort


@dataclass(frozen=True)
class TemplatePrompt:
    """Messages rendered by the chat template, the reply left whole (ollama's /api/generate)."""

    messages: list[dict]


@dataclass(frozen=True)
class TextPrompt:
    """Text tokenized as it is: special tokens as plain text, or (special) parsed, for a client that
    writes the template itself (ollama's raw)."""

    text: str
    special: bool = False


@dataclass(frozen=True)
class TokenPrompt:
    ids: list[int]  # checked against the vocabulary already


Prompt = Union[ChatPrompt, TemplatePrompt, TextPrompt, TokenPrompt]


@dataclass(frozen=True)
class Generation:
    """One generation request, checked by its adapter, not yet tokenized."""

    prompt: Prompt
    job: Job
    clip: bool = False  # max_tokens past the context: stop at its end (ollama) rather than refuse (OpenAI)


@dataclass
class Stream:
    """A generation under way: its first event (out before the adapter answers, so a full queue or a
    gone client is a status, not a broken stream), the rest, and how its reply reads."""

    prompt: list[int]
    job: Job
    first: Event
    events: AsyncIterator[Event]
    reply: openai_chat.ChatReply | None = field(default=None)  # a chat's; None: the text as it comes


class Service(Protocol):
    """What an API adapter asks of the model it serves."""

    llm: Any  # infer.engine.llm.LLM: its tokenizer and template, for what the adapters render
    config: ServerConfig
    metrics: Metrics

    async def body(self, request: Request) -> dict:
        """The request's JSON object (parsed once: by the router, when there is one)."""

    def check_model(self, body: dict) -> str:
        """The served model's id, whatever model the body names (a 400 if "model" is not a string)."""

    async def encode(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """fn(arg) off the event loop, a template's or tokenizer's error as a 400."""

    def admit(self, inputs: int = 0) -> None:
        """A 503 when one more request would wait beyond --max-queue. inputs: the engine's waiting
        sequences that are the inputs of embeddings requests in flight, less those requests: a
        request of many inputs counts once, as a generation does."""

    async def start(self, request: Request, gen: Generation) -> Stream:
        """The generation admitted and running; APIError when it cannot be, ClientGone when its
        client left before the first event."""

    async def collect(self, stream: Stream) -> tuple[str, list[TokenLogprob], Event]:
        """A whole reply: (text, logprobs, the finish event)."""

    async def chat_tokens(self, prompt: ChatPrompt) -> list[int]:
        """The token ids start would give a chat's prompt, its tools and thinking included, without
        generating (Anthropic's count_tokens)."""


# -- the service ------------------------------------------------------------------------------------


class EngineService:
    """Service over one loaded model's engine."""

    def __init__(self, llm, config: ServerConfig, metrics: Metrics | None = None):
        self.llm = llm
        self.engine = llm.engine
        self.config = config
        self.metrics = metrics or Metrics()

    async def body(self, request: Request) -> dict:
        if PARSED_BODY in request.scope:
            parsed = request.scope[PARSED_BODY]
            return parsed if parsed is not None else parse_json(b"")  # None: an empty body, not JSON
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.config.max_body:
            raise self._too_large()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body:
                raise self._too_large()
            chunks.append(chunk)
        body = parse_json(b"".join(chunks))
        if not isinstance(body, dict):
            raise APIError(400, f"the request body must be a JSON object, got {kind(body)}", None, "invalid_type")
        return body

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.config.max_body} bytes", None, "body_too_large")

    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is None:
            return self.config.model_id
        if not isinstance(model, str):
            raise APIError(400, f"'model' must be a string, got {kind(model)}", "model", "invalid_type")
        # one model served: any name is it, as llama-server and llama-cpp-python take it (clients
        # hard-code "gpt-3.5-turbo"); with several, model_router.py has resolved the name already
        return self.config.model_id

    async def encode(self, fn, arg):
        try:
            return await asyncio.to_thread(fn, arg)
        except InferError as e:  # a chat template's or the tokenizer's
            raise APIError(400, str(e).splitlines()[0], e.field, "invalid_value") from None

    def admit(self, inputs: int = 0) -> None:
        eng = self.engine
        free_slots = max(0, eng.scheduler.max_seqs - eng.num_running())
        if eng.num_waiting() - inputs + 1 > self.config.max_queue + free_slots:
            raise APIError(503, f"the server is overloaded ({self.config.max_queue} requests already waiting); "
                           "retry shortly", None, "server_overloaded", "server_error", {"Retry-After": "1"})

    async def start(self, request: Request, gen: Generation) -> Stream:
        job, p, reply = gen.job, gen.prompt, None
        if job.params.seed is None and self.config.seed is not None:  # llama-server's --seed
            job = replace(job, params=replace(job.params, seed=self.config.seed))
        if not self.llm.model.config.causal:  # an encoder: the engine would refuse it too, less clearly
            raise APIError(400, f"the model {self.config.model_id!r} is an embedding model (an encoder): it does not "
                           "generate text; use /v1/embeddings or /api/embed", "model", "model_not_supported")
        if isinstance(p, ChatPrompt):
            plan, tool_grammar = self._plan(p, job)
            ids, opened = await self.encode(lambda c: openai_chat.encode(self.llm, c), plan)
            job, opened = openai_chat.constrain(job, plan, tool_grammar, opened, self.llm.tokenizer.token_id)
            reply = openai_chat.ChatReply(plan, opened)
        elif isinstance(p, TemplatePrompt):
            ids = await self.encode(self.llm.encode_chat, p.messages)
        elif isinstance(p, TextPrompt):
            tok = self.llm.tokenizer
            ids = await self.encode(lambda t: tok.encode(t, add_special=True, parse_special=True) if p.special
                                    else self.llm.encode_raw(t), p.text)
        else:
            ids = p.ids
        compiled = await self._compile_grammar(job)
        events = self._events(request, ids, self._fit(job, ids, gen.clip), compiled)
        first = await anext(events)  # surfaces a 503 or a cancelled request before any header goes out
        return Stream(ids, job, first, events, reply)

    async def collect(self, stream: Stream) -> tuple[str, list[TokenLogprob], Event]:
        parts, lps = [], []
        ev = stream.first
        while True:
            parts.append(ev.text)
            lps += ev.logprobs or []
            if ev.finish_reason is not None:
                return "".join(parts), lps, ev
            ev = await anext(stream.events)

    async def chat_tokens(self, prompt: ChatPrompt) -> list[int]:
        plan, _ = self._plan(prompt, Job(SamplingParams(), None, False, False, False))
        ids, _ = await self.encode(lambda c: openai_chat.encode(self.llm, c), plan)
        return ids

    # -- the steps ----------------------------------------------------------------------------------

    def _plan(self, p: ChatPrompt, job: Job):
        """The chat's ChatPlan and its tools' grammar; ollama's think as the template takes it."""
        src = self.llm.template.source
        harmony = style(src) == "harmony"  # gpt-oss: always thinks; a level is its reasoning effort
        fmt = p.reasoning_format or self.config.reasoning_format
        plan, tool_grammar = openai_chat.plan(p.fields, p.messages, src, "none" if p.think is False and not harmony
                                              else fmt, job, self.llm.tokenizer.token_id)
        if isinstance(p.think, str) and harmony:
            plan = replace(plan, variables={**plan.variables, "reasoning_effort": p.think})
        if p.think is False and "enable_thinking" in src:
            plan = replace(plan, variables={**plan.variables, "enable_thinking": False})
        return plan, tool_grammar

    async def _compile_grammar(self, job: Job):
        """The job's grammar compiled off the event loop (the first one hands the vocabulary to the
        grammar engine, a second or two; a large grammar takes up to a second to build), for
        add_request; a bad one is a 400."""
        g = job.params.grammar
        if g is None:
            return None
        try:
            return await asyncio.to_thread(self.engine.grammars.compile, g)
        except GrammarError as e:
            raise APIError(400, str(e), job.grammar_param, "invalid_grammar") from None

    def _fit(self, job: Job, prompt: list[int], clip: bool) -> SamplingParams:
        """The job's params with max_tokens checked against (or defaulted to) the room left.  The
        prompt's length is the engine's rule (Engine.check_prompt), asked here so that its error is
        the API's and comes before the request is queued."""
        n_ctx, n = self.engine.n_ctx, len(prompt)
        try:
            self.engine.check_prompt(prompt)
        except PromptError as e:
            raise APIError(400, str(e), e.field, "context_length_exceeded" if n else "invalid_value") from None
        if job.max_tokens is None:
            return replace(job.params, max_tokens=n_ctx - n)
        if n + job.max_tokens > n_ctx:
            if clip:  # ollama stops at the end of the context, no error
                return replace(job.params, max_tokens=n_ctx - n)
            raise APIError(400, f"the prompt has {n} tokens and max_tokens asks for {job.max_tokens} more, "
                           f"{n + job.max_tokens} in all, but the context holds {n_ctx}; lower max_tokens or shorten "
                           "the prompt", "max_tokens", "context_length_exceeded")
        return replace(job.params, max_tokens=job.max_tokens)

    async def _events(self, request: Request, prompt: list[int], params: SamplingParams,
                      compiled=None) -> AsyncIterator[Event]:
        """The engine's events for one request, until its finish; the request is cancelled (its KV
        blocks freed) as soon as the client disconnects or the consumer stops early."""
        self.admit()
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        t0 = time.perf_counter()
        try:
            rid = self.engine.add_request(prompt, params, sink=lambda ev: loop.call_soon_threadsafe(q.put_nowait, ev),
                                          compiled=compiled)
        except InferError as e:  # PromptError, GrammarError
            raise APIError(400, str(e), e.field, "invalid_value") from None

        async def watch() -> None:
            await disconnected(request.receive)
            q.put_nowait(None)

        watcher = asyncio.ensure_future(watch())
        done = False
        last = None
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    raise ClientGone
                now = time.perf_counter()
                if last is None and (ev.token_id is not None or (ev.finish_reason and ev.usage.completion_tokens)):
                    self.metrics.ttft.observe(now - t0)
                    last = now
                elif last is not None and ev.token_id is not None:
                    self.metrics.itl.observe(now - last)
                    last = now
                if ev.finish_reason == "error":
                    done = True
                    err = self.engine.last_error
                    raise APIError(500, f"generation failed: {type(err).__name__}: {err}".splitlines()[0][:300],
                                   None, "engine_error", "server_error")
                if ev.finish_reason is not None:
                    done = True
                    u = ev.usage
                    self.metrics.prompt_tokens += u.prompt_tokens
                    self.metrics.cached_tokens += u.cached_tokens
                    self.metrics.completion_tokens += u.completion_tokens
                yield ev
                if done:
                    return
        finally:
            watcher.cancel()
            if not done:
                self.engine.cancel(rid)
