"""llama-server's native completion routes, /completion (and /completions) and /infill, in its
request and response shapes, so llama.cpp's clients (llama.vscode, SillyTavern, its web UI) can use
`infer serve`.  The fields are llama-server's (tools/server/server-schema.cpp): n_predict (-1: to
the end of the context; 0: the prompt evaluated, nothing generated), n_probs, return_tokens,
response_fields, ...; the answer is its final object (content, tokens, stop_type, timings,
generation_settings, ...), or per token SSE chunks then that object, or for several prompts a list.
Errors take its shape: {"error": {"code": status, "message", "type"}}.

Sampler chains and the samplers infer does not have (mirostat, XTC, DRY, typical, dynamic
temperature) are accepted at their "off" values and refused otherwise.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from infer.engine.request import Event
from infer.engine.sampler import MAX_LOGPROBS, TokenLogprob

from .llama_infill import FIM_BATCH, infill_fields, infill_prompt, is_id
from .openai_request import APIError, ClientGone, Job, bool_field, int_field, kind, parse_job, text_field
from .service import Generation, Service, Stream, TokenPrompt

LLAMA_PATHS = ("/completion", "/infill", "/props", "/slots", "/apply-template")  # answered in llama-server's shapes
RANDOM_SEED = 4294967295  # llama.cpp's LLAMA_DEFAULT_SEED: a fresh seed per request
# llama-server's samplers infer does not have, each with the value that turns it off
OFF_SAMPLERS = {"dynatemp_range": 0, "xtc_probability": 0, "typical_p": 1, "dry_multiplier": 0, "mirostat": 0,
                "tfs_z": 1}
NEGATIVE_OFF = ("top_n_sigma", "adaptive_target")  # off below 0
# what the native fields become in parse_job's (OpenAI's) terms, or nothing: read here
NATIVE_ONLY = ("n_predict", "max_tokens", "max_completion_tokens", "n_probs", "logprobs", "prompt", "stream_options",
               "n_keep", "n_discard", "id_slot", "cache_prompt", "return_tokens", "response_fields", "samplers",
               "post_sampling_probs", "input_prefix", "input_suffix", "input_extra", "seed", "model", "n", "n_cmpl")
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          413: "invalid_request_error", 501: "not_supported_error", 503: "unavailable_error"}


def llama_error(e: APIError) -> JSONResponse:
    """An APIError in llama-server's shape (format_error_response)."""
    typ = "exceed_context_size_error" if e.code == "context_length_exceeded" else _TYPES.get(e.status, "server_error")
    return JSONResponse({"error": {"code": e.status, "message": e.message, "type": typ}}, status_code=e.status,
                        headers=e.headers)


def refused(e: APIError | ClientGone) -> Response:
    return llama_error(e) if isinstance(e, APIError) else Response(status_code=499)


# -- the request ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Native:
    """A native completion request's own fields, beside its Job."""

    job: Job
    n_predict: int  # -1: to the end of the context
    n_probs: int
    post_sampling: bool
    return_tokens: bool
    response_fields: tuple[str, ...]
    n_keep: int
    n_discard: int
    id_slot: int
    cache_prompt: bool


def _int_in(body: dict, name: str, lo: int, default: int, hi: int = 2**31 - 1) -> int:
    v = int_field(body, name)
    if v is None:
        return default
    if not lo <= v <= hi:
        raise APIError(400, f"'{name}' must be between {lo} and {hi}, got {v}", name, "invalid_value")
    return v


def native_fields(body: dict, tokenizer: Any = None) -> Native:
    """llama-server's completion fields checked, the sampling ones through parse_job (OpenAI's rules)."""
    for name, off in OFF_SAMPLERS.items():
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise APIError(400, f"'{name}' must be a number, got {kind(v)}", name, "invalid_type")
        if v is not None and v != off:
            raise APIError(400, f"'{name}' is not supported by this server (only {off}: off)", name,
                           "unsupported_parameter")
    for name in NEGATIVE_OFF:
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v >= 0):
            raise APIError(400, f"'{name}' is not supported by this server (only a negative value: off)", name,
                           "unsupported_parameter")
    n_predict = -1
    for name in ("n_predict", "max_completion_tokens", "max_tokens"):  # llama-server's aliases, in its order
        if body.get(name) is not None:
            n_predict = _int_in(body, name, -1, -1)
            break
    name = "n_probs" if body.get("n_probs") is not None else "logprobs"
    n_probs = _int_in(body, name, 0, 0, MAX_LOGPROBS)
    seed = int_field(body, "seed")
    if seed is not None and not -1 <= seed < 2**64:
        raise APIError(400, f"'seed' must be -1 (random) or between 0 and 2**64 - 1, got {seed}", "seed",
                       "invalid_value")
    fields = body.get("response_fields", [])
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise APIError(400, "'response_fields' must be an array of strings", "response_fields", "invalid_type")
    n = int_field(body, "n_cmpl") if body.get("n_cmpl") is not None else int_field(body, "n")
    if n is not None and n != 1:
        raise APIError(400, f"'n_cmpl' must be 1: this server returns one completion per prompt, got {n}", "n_cmpl",
                       "invalid_value")
    rest = {k: v for k, v in body.items() if k not in NATIVE_ONLY}
    if seed is not None and seed not in (-1, RANDOM_SEED):
        rest["seed"] = seed
    job = parse_job(rest, n_probs or None, tokenizer)  # tokenizer: logit_bias's texts
    cache = body.get("cache_prompt")
    cache = True if cache is None else cache
    if not isinstance(cache, bool):
        raise APIError(400, f"'cache_prompt' must be true or false, got {kind(cache)}", "cache_prompt", "invalid_type")
    return Native(job, n_predict, n_probs, bool_field(body, "post_sampling_probs"), bool_field(body, "return_tokens"),
                  tuple(fields), _int_in(body, "n_keep", -1, 0), _int_in(body, "n_discard", 0, 0),
                  _int_in(body, "id_slot", -1, -1), cache)


def prompt_ids(tok, value: Any, add_special: bool = True) -> list[list[int]]:
    """llama-server's prompt shapes (tokenize_input_prompts): a string; token ids; ids and strings
    mixed (one prompt, BOS only before a first string); {"prompt_string": ...}; or an array of those,
    several prompts.  Strings are tokenized with special tokens parsed."""
    if isinstance(value, list) and not any(is_id(t) for t in value):
        if not value:
            raise APIError(400, "'prompt' must not be empty", "prompt", "invalid_value")
        return [_subprompt(tok, p, add_special) for p in value]
    return [_subprompt(tok, value, add_special)]


def _subprompt(tok, p: Any, add_special: bool) -> list[int]:
    if isinstance(p, dict) and "prompt_string" in p:
        if p.get("multimodal_data") is not None:
            raise APIError(400, "multimodal data was given, but this model reads text only", "prompt",
                           "invalid_value")
        p = p["prompt_string"]
    parts = [p] if isinstance(p, str) else p if isinstance(p, list) and all(
        isinstance(x, str) or is_id(x) for x in p) else None
    if parts is None:
        raise APIError(400, "'prompt' elements must be a string, a list of tokens, a JSON object containing a prompt "
                       "string, or a list of mixed strings & tokens", "prompt", "invalid_type")
    ids: list[int] = []
    for i, x in enumerate(parts):
        if isinstance(x, str):
            ids += tok.encode(text_field(x, "prompt"), add_special=add_special and i == 0, parse_special=True)
        elif not 0 <= x < tok.vocab_size:
            raise APIError(400, f"'prompt' token ids must be in [0, {tok.vocab_size}), got {x}", "prompt",
                           "invalid_value")
        else:
            ids.append(x)
    return ids


# -- the slots --------------------------------------------------------------------------------------


class SlotBook:
    """llama-server's slots (--parallel of them) over the engine's running sequences: a native request
    holds one for its life (its id_slot) and leaves its last task's settings there for /slots; the
    engine's other running requests (OpenAI's, ollama's) fill the lowest free ones."""

    def __init__(self, engine):
        self.engine = engine
        self.tasks = itertools.count()  # llama-server's task ids, one per prompt
        self.held: set[int] = set()
        self.last: dict[int, dict] = {}  # slot -> its last task's /slots fields

    @property
    def n(self) -> int:
        return self.engine.scheduler.max_seqs

    def take(self, wanted: int) -> int:
        free = [i for i in range(self.n) if i not in self.held]
        slot = wanted if wanted in free else free[0] if free else len(self.held) % self.n
        self.held.add(slot)
        return slot

    def give(self, slot: int, task: dict) -> None:
        self.held.discard(slot)
        self.last[slot] = task

    def busy(self) -> list[bool]:
        others = max(0, self.engine.num_running() - len(self.held))
        out = []
        for i in range(self.n):
            if i in self.held:
                out.append(True)
            else:
                out.append(others > 0)
                others -= others > 0
        return out


# -- the answers ------------------------------------------------------------------------------------


def _piece(tok, tid: int) -> tuple[str, list[int]]:
    b = tok.token_to_piece(tid, special=True)
    return b.decode("utf-8", errors="ignore"), list(b)  # llama-server cuts an incomplete UTF-8 tail off


def probabilities(tok, lps: list[TokenLogprob], post: bool) -> list[dict]:
    """completion_probabilities as llama-server writes them: logprobs, or with post_sampling_probs
    probabilities ("prob", "top_probs")."""
    def one(tid: int, lp: float) -> dict:
        text, raw = _piece(tok, tid)
        return {"id": tid, "token": text, "bytes": raw,
                **({"prob": math.exp(lp)} if post else {"logprob": max(lp, -3.4028234663852886e38)})}

    top = "top_probs" if post else "top_logprobs"
    return [{**one(lp.token_id, lp.logprob), top: [one(t, v) for t, v in lp.top if not post or v > -math.inf]}
            for lp in lps]


def settings(n: Native, params, n_predict: int) -> dict:
    """generation_settings: the request's parameters as llama-server reports them (task_params.to_json)."""
    p = params
    return {"seed": p.seed if p.seed is not None else RANDOM_SEED, "temperature": p.temperature,
            "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0,
            "repeat_last_n": p.repeat_last_n, "repeat_penalty": p.repeat_penalty,
            "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
            "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9,
            "max_tokens": n_predict, "n_predict": n_predict, "n_keep": n.n_keep, "n_discard": n.n_discard,
            "ignore_eos": p.ignore_eos, "stream": n.job.stream, "n_probs": n.n_probs, "min_keep": 0,
            "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
            "generation_prompt": "", "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
            "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": n.post_sampling,
            "backend_sampling": False, "lora": [], "stop": list(p.stop),
            "grammar": p.grammar.source if p.grammar is not None else "", "grammar_lazy": bool(p.grammar_triggers),
            "grammar_triggers": [], "preserved_tokens": [], "logit_bias": [],
            "dry_sequence_breakers": ["\n", ":", "\"", "*"]}


def timings(ev: Event) -> dict:
    """llama-server's timings from the finish event's usage: prompt_n the prompt tokens computed,
    cache_n those the prefix cache gave."""
    u = ev.usage
    prompt_n = u.prompt_tokens - u.cached_tokens
    prompt_ms = prompt_n / u.prefill_tok_s * 1000 if u.prefill_tok_s else 0.0
    n = u.completion_tokens
    predicted_ms = (n - 1) / u.decode_tok_s * 1000 if u.decode_tok_s and n > 1 else 0.0
    return {"cache_n": u.cached_tokens,
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
            "predicted_per_second": 1000 * n / predicted_ms if predicted_ms else 0.0}


def stop_type(ev: Event) -> str:
    if ev.finish_reason == "length":
        return "limit"
    if ev.finish_reason == "stop":
        return "word" if ev.stop_word is not None else "eos"
    return "none"


def pick(fields: tuple[str, ...], res: dict) -> dict:
    """response_fields: only those, a nested one ("generation_settings/n_predict") under its path."""
    if not fields:
        return res
    out = {}
    for f in fields:
        v: Any = res
        for k in f.split("/"):
            if not isinstance(v, dict) or k not in v:
                break
            v = v[k]
        else:
            out[f] = v
    return out


# -- the routes -------------------------------------------------------------------------------------


@dataclass
class Task:
    """One prompt's generation under way."""

    index: int
    slot: int
    prompt: list[int]
    stream: Stream
    n_predict: int


class LlamaAPI:
    """/completion, /completions and /infill over the service."""

    def __init__(self, service: Service, slots: SlotBook):
        self.service = service
        self.llm = service.llm
        self.tok = service.llm.tokenizer
        self.slots = slots

    async def completion(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            self.service.check_model(body)
            if "prompt" not in body:
                raise APIError(400, "'prompt' is required", "prompt", "invalid_value")
            native = native_fields(body, self.tok)
            prompts = await self.service.encode(lambda v: prompt_ids(self.tok, v), body["prompt"])
        except APIError as e:
            return llama_error(e)
        return await self._run(request, native, prompts)

    async def infill(self, request: Request) -> Response:
        try:
            missing = [n for n, key in (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid"))
                       if self.tok.special(key) is None]
            if missing:
                raise APIError(501, "Infill is not supported by this model: " +
                               " ".join(f"{n} token is missing." for n in missing), None, "not_supported")
            body = await self.service.body(request)
            self.service.check_model(body)
            fim = infill_fields(body)
            native = native_fields(body, self.tok)
            n_ctx = self.llm.engine.n_ctx
            ids = await self.service.encode(lambda f: infill_prompt(self.tok, *f, n_batch=FIM_BATCH, n_ctx=n_ctx), fim)
        except APIError as e:
            return llama_error(e)
        return await self._run(request, native, [ids])

    async def _run(self, request: Request, native: Native, prompts: list[list[int]]) -> Response:
        tasks: list[Task] = []
        try:
            for i, ids in enumerate(prompts):
                tasks.append(await self._start(request, native, i, ids))
        except (APIError, ClientGone) as e:
            for t in tasks:
                await t.stream.events.aclose()
                self.slots.give(t.slot, {})
            return refused(e)
        if native.job.stream:
            return self._sse(native, tasks)
        try:
            results = await asyncio.gather(*(self._final(native, t) for t in tasks))
        except (APIError, ClientGone) as e:
            for t in tasks:  # the other prompts' requests cancelled, their slots freed
                await t.stream.events.aclose()
                if t.slot in self.slots.held:
                    self.slots.give(t.slot, {})
            return refused(e)
        return JSONResponse(results[0] if len(results) == 1 else results)

    async def _start(self, request: Request, native: Native, index: int, ids: list[int]) -> Task:
        job = native.job
        n_predict = native.n_predict
        if n_predict == 0:  # the prompt evaluated into the cache, nothing generated: one token, dropped
            job = Job(job.params, 1, job.stream, False, job.logprobs, job.grammar_param)
        elif n_predict > 0:
            job = Job(job.params, n_predict, job.stream, False, job.logprobs, job.grammar_param)
        slot = self.slots.take(native.id_slot)
        try:
            stream = await self.service.start(request, Generation(TokenPrompt(ids), job, clip=True))
        except BaseException:
            self.slots.give(slot, {})
            raise
        return Task(index, slot, ids, stream, n_predict)

    def _final_object(self, native: Native, t: Task, text: str, lps: list[TokenLogprob], ev: Event,
                      streamed: bool) -> dict:
        n_predict = t.n_predict
        dropped = n_predict == 0
        tokens = [] if dropped else ev.token_ids
        res = {"index": t.index, "content": "" if streamed or dropped else text,
               "tokens": tokens if native.return_tokens and not streamed else [],
               "id_slot": t.slot, "stop": True, "model": self.service.config.model_id,
               "tokens_predicted": len(tokens), "tokens_evaluated": len(t.prompt),
               "generation_settings": settings(native, t.stream.job.params, n_predict),
               "prompt": self.tok.decode(t.prompt, special=True), "has_new_line": "\n" in text and not dropped,
               "truncated": self._truncated(t, ev) and not dropped, "stop_type": "limit" if dropped else stop_type(ev),
               "stopping_word": ev.stop_word or "",
               # what the cache holds after: the prompt and the reply but its last token, never fed back
               "tokens_cached": len(t.prompt) + max(len(tokens) - 1, 0),
               "timings": {**timings(ev), **({"predicted_n": 0} if dropped else {})}}
        if native.n_probs and not streamed and not dropped:
            res["completion_probabilities"] = probabilities(self.tok, lps, native.post_sampling)
        self.slots.give(t.slot, {"n_ctx": self.llm.engine.n_ctx, "params": res["generation_settings"],
                                 "generated": "" if dropped else text, "id_task": next(self.slots.tasks),
                                 "n_prompt_tokens": len(t.prompt), "n_decoded": len(tokens),
                                 "n_cached": ev.usage.cached_tokens})
        return pick(native.response_fields, res)

    def _truncated(self, t: Task, ev: Event) -> bool:
        """llama-server's truncated: the reply ended at the end of the context, not at n_predict (the
        prompt itself is never cut: one past the context is a 400)."""
        n = ev.usage.completion_tokens
        return ev.finish_reason == "length" and len(t.prompt) + n >= self.llm.engine.n_ctx and \
            (t.n_predict < 0 or n < t.n_predict)

    async def _final(self, native: Native, t: Task) -> dict:
        try:
            text, lps, ev = await self.service.collect(t.stream)
        except BaseException:
            self.slots.give(t.slot, {})
            raise
        return self._final_object(native, t, text, lps, ev, False)

    async def _chunks(self, native: Native, t: Task) -> AsyncIterator[dict]:
        events = t.stream.events
        done = False
        text = ""
        try:
            ev = t.stream.first
            n = 0
            while True:
                if (ev.text or ev.logprobs) and t.n_predict != 0:
                    text += ev.text
                    n += len(ev.logprobs) if ev.logprobs else ev.token_id is not None
                    chunk = {"index": t.index, "content": ev.text,
                             "tokens": [ev.token_id] if native.return_tokens and ev.token_id is not None else [],
                             "stop": False, "id_slot": t.slot, "tokens_predicted": n,
                             "tokens_evaluated": len(t.prompt)}
                    if native.n_probs and ev.logprobs:
                        chunk["completion_probabilities"] = probabilities(self.tok, ev.logprobs, native.post_sampling)
                    yield chunk
                if ev.finish_reason is not None:
                    break
                ev = await anext(events)
            done = True
            yield self._final_object(native, t, text, [], ev, True)
        finally:
            if not done:
                self.slots.give(t.slot, {})
            await events.aclose()

    def _sse(self, native: Native, tasks: list[Task]) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for t in tasks:
                chunks = self._chunks(native, t)
                try:
                    async for c in chunks:
                        yield b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"
                except ClientGone:
                    return
                except APIError as e:  # the headers are out: the error goes in the stream, as llama-server's
                    yield b"data: " + json.dumps(json.loads(llama_error(e).body)).encode() + b"\n\n"
                    return
                finally:
                    await chunks.aclose()
            # llama-server ends a native stream without [DONE]

        async def guarded() -> AsyncIterator[bytes]:
            try:
                async for b in body():
                    yield b
            finally:
                for t in tasks:  # the prompts not streamed yet (the client left): cancelled, their slots freed
                    if t.slot in self.slots.held:
                        self.slots.give(t.slot, {})
                    await t.stream.events.aclose()

        return StreamingResponse(guarded(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
