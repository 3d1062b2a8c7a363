"""ollama's native API on the same server and port as the OpenAI one: /api/chat, /api/generate
(NDJSON streams by default), /api/tags, /api/show, /api/ps, /api/version, /api/pull, /api/delete
(and /api/embed, /api/embeddings: embeddings_api.py), and `GET /` / `HEAD /` answering as ollama
does, so Open WebUI, Continue and the official ollama clients can use `infer serve`.  Errors take
ollama's shape, {"error": "..."} with a 4xx status.  /api/chat and /api/generate are an adapter
over the service (service.py), as OpenAI's routes are: ollama's fields become a Generation, and
its Stream goes out as NDJSON lines or one object.

Started with a MODEL, the server runs that one: a request names it by the server's names for it
(its id, file name, path) or by the store's pulled name of that file, and gets a 404 for any
other model. Without one, model_router.py puts a server like this one behind each model it loads.
"""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from infer.engine.grammar import Grammar, GrammarError
from infer.engine.reasoning import EFFORTS, style
from infer.engine.sampler import InvalidSamplingParams, SamplingParams

from .openai_chat import plan_fields
from .openai_request import SAMPLING_FIELDS, APIError, ClientGone, Job, NumberField, chat_messages, kind, stop_strings
from .service import ChatPrompt, Generation, Service, Stream, TemplatePrompt, TextPrompt

OPTION_LIMIT = 2**63  # |an option's value| beyond this is out of range (ollama reads them as int64)
API_VERSION = "0.12.0"  # the ollama API level these routes follow (clients compare it with their minimums)
# the numeric options read (openapi.py documents them from this table)
OPTION_FIELDS = (*SAMPLING_FIELDS,
                 NumberField("repeat_last_n", "integer", minimum=-1, description="0: off; -1: the whole context."),
                 NumberField("seed", "integer", minimum=0))
OPTIONS = MappingProxyType({f.name: int if f.type == "integer" else float for f in OPTION_FIELDS})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _name(body: dict) -> str:
    """The model a request names ("model"; older clients send "name")."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise APIError(400, "'model' is required")
    return name


def _error(e: APIError) -> JSONResponse:
    """An APIError in ollama's shape (its headers kept: a 503's Retry-After)."""
    return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)


def chat_message(m: Any) -> Any:
    """An /api/chat message as the OpenAI side reads it (chat_messages checks the rest): ollama's
    `thinking` on an earlier assistant turn is llama-server's `reasoning_content`, the name the
    thinking models' templates read."""
    if isinstance(m, dict) and m.get("images"):
        raise APIError(400, "images are not supported: this server reads text only")
    if isinstance(m, dict) and m.get("role") == "assistant" and "thinking" in m:
        m = {**{k: v for k, v in m.items() if k != "thinking"}, "reasoning_content": m["thinking"]}
    return m


class OllamaAPI:
    """The ollama routes over the service: their fields to a Generation, its Stream to their shapes."""

    def __init__(self, service: Service):
        self.service = service
        self.llm = service.llm
        self.entry, self.info = model_entry(service.config.model_id, self.llm.model.path)  # once: clients poll /api/tags

    # -- requests ---------------------------------------------------------------------------------

    async def resolve(self, body: dict) -> str:
        """The served model's name when the body's "model" names it; 404 for any other."""
        name = _name(body)
        cfg = self.service.config
        if cfg.any_name or name in (cfg.model_id, *cfg.model_aliases) or name.split(":")[0] == cfg.model_id:
            return name
        if await asyncio.to_thread(self._pulled_as, name):
            return name
        raise APIError(404, f"model '{name[:200]}' not found; this server has '{cfg.model_id}'")

    def _pulled_as(self, name: str) -> bool:
        """Whether the store's pulled model of that name is the served file (names only: a request's
        text is never read as a path)."""
        from infer.models.store import ModelStore

        try:
            m = ModelStore().get(name)
            return m is not None and Path(m.path).resolve() == self.llm.model.path.resolve()
        except Exception:  # a malformed manifest or name: not this model
            return False

    def _params(self, body: dict) -> tuple[Job, bool]:
        """Sampling parameters from ollama's options, format and stream fields; (job, stream)."""
        opts = body.get("options")
        opts = {} if opts is None else opts
        if not isinstance(opts, dict):
            raise APIError(400, f"'options' must be an object, got {kind(opts)}")
        kw: dict[str, Any] = {}
        for name, typ in OPTIONS.items():
            v = opts.get(name)
            if v is None:
                continue
            if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise APIError(400, f"option '{name}' must be an integer, got {kind(v)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise APIError(400, f"option '{name}' must be a number, got {kind(v)}")
            if abs(v) > OPTION_LIMIT:
                raise APIError(400, f"option '{name}' is out of range")
            kw[name] = typ(v)
        kw["stop"] = stop_strings(opts.get("stop"), "stop")  # what each must be: SamplingParams says
        fmt = body.get("format")
        if fmt == "json":
            kw["grammar"] = Grammar("json")
        elif isinstance(fmt, dict):
            try:
                kw["grammar"] = Grammar.json_schema(fmt)
            except GrammarError as e:
                raise APIError(400, str(e)) from None
        elif fmt not in (None, ""):
            raise APIError(400, f"'format' must be \"json\" or a JSON schema, got {kind(fmt)}")
        n = opts.get("num_predict")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
            raise APIError(400, f"option 'num_predict' must be an integer, got {kind(n)}")
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise APIError(400, f"'stream' must be true or false, got {kind(stream)}")
        n_ctx = opts.get("num_ctx")
        if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
            raise APIError(400, "option 'num_ctx' must be a positive integer")
        try:
            params = SamplingParams(**kw)
        except InvalidSamplingParams as e:
            raise APIError(400, str(e), e.field) from None
        # ollama: num_predict -1 (or absent) generates until the end of the context, and a larger one
        # stops there too (the Generation's clip); num_ctx is the server's (--ctx), not per request
        return Job(params, n if n is not None and n > 0 else None, stream, False, False, "format"), stream

    # -- routes -----------------------------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": API_VERSION})

    async def chat(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = await self.resolve(body)
            raw_msgs = body.get("messages")
            if raw_msgs is not None and not isinstance(raw_msgs, list):
                raise APIError(400, f"'messages' must be an array, got {kind(raw_msgs)}")
            msgs = chat_messages({"messages": [chat_message(m) for m in raw_msgs]}) if raw_msgs else []
            job, stream = self._params(body)
            if not msgs:  # ollama: an empty chat loads the model
                return JSONResponse({"model": model, "created_at": _now(), "message": {"role": "assistant",
                                     "content": ""}, "done_reason": "load", "done": True})
            think = body.get("think")
            if think is not None and not isinstance(think, (bool, str)):
                raise APIError(400, f"'think' must be true, false or a level, got {kind(think)}")
            if isinstance(think, str) and think not in EFFORTS:
                raise APIError(400, f"'think' must be true, false, low, medium or high, got {think!r}"[:200])
            # ollama splits thinking off whatever --reasoning-format says
            prompt = ChatPrompt(msgs, plan_fields(body), reasoning_format="deepseek", think=think)
        except APIError as e:
            return _error(e)
        return await self._run(request, model, Generation(prompt, job, clip=True), stream)

    async def generate(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            model = await self.resolve(body)
            prompt_in = body.get("prompt", "")
            if not isinstance(prompt_in, str):
                raise APIError(400, f"'prompt' must be a string, got {kind(prompt_in)}")
            job, stream = self._params(body)
            if not prompt_in:  # ollama: an empty prompt loads the model
                return JSONResponse({"model": model, "created_at": _now(), "response": "", "done_reason": "load",
                                     "done": True})
            for unsupported in ("suffix", "images", "context"):
                if body.get(unsupported):
                    raise APIError(400, f"'{unsupported}' is not supported by this server")
            raw_mode = body.get("raw", False)
            if not isinstance(raw_mode, bool):
                raise APIError(400, f"'raw' must be true or false, got {kind(raw_mode)}")
            if raw_mode:  # as ollama: the prompt's special tokens (a template written by the client) parsed
                prompt = TextPrompt(prompt_in, special=True)
            else:
                system = body.get("system")
                if system is not None and not isinstance(system, str):
                    raise APIError(400, f"'system' must be a string, got {kind(system)}")
                prompt = TemplatePrompt(([{"role": "system", "content": system}] if system else []) +
                                        [{"role": "user", "content": prompt_in}])
        except APIError as e:
            return _error(e)
        return await self._run(request, model, Generation(prompt, job, clip=True), stream)


    async def _run(self, request: Request, model: str, gen: Generation, stream: bool) -> Response:
        """Generate and answer in ollama's shapes: NDJSON pieces then a done line with the timings,
        or one object.  A chat's reply comes apart as thinking, content and tool calls (the
        Stream's reply); /api/generate's is the text as it comes."""
        t0 = time.perf_counter_ns()
        chat = isinstance(gen.prompt, ChatPrompt)
        try:
            started = await self.service.start(request, gen)
        except APIError as e:
            return _error(e)
        except ClientGone:
            return Response(status_code=499)
        return await self._answer(model, started, chat, stream, t0)

    async def _answer(self, model: str, started: Stream, chat: bool, stream: bool, t0: int) -> Response:
        """The started generation in ollama's shapes; t0: when the request began (its timings)."""
        reply, events = started.reply, started.events

        def piece(thinking: str, content: str, calls=()) -> dict:
            base = {"model": model, "created_at": _now(), "done": False}
            if not chat:
                return {**base, "response": content}
            msg = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:  # ollama's calls: arguments as an object
                msg["tool_calls"] = [{"function": {"name": c.name, "arguments": _object(c.arguments)}} for c in calls]
            return {**base, "message": msg}

        def done(ev, parts=("", "", ())) -> dict:
            u = ev.usage
            total = time.perf_counter_ns() - t0
            prompt_ns = int(u.ttft_ms * 1e6)
            out = {**piece(*parts), "done": True,
                   "done_reason": "stop" if ev.finish_reason in ("stop", "cancelled") else ev.finish_reason,
                   "total_duration": total, "load_duration": 0,
                   "prompt_eval_count": u.prompt_tokens - u.cached_tokens, "prompt_eval_duration": prompt_ns,
                   "eval_count": u.completion_tokens, "eval_duration": max(total - prompt_ns, 0)}
            if not chat:
                out["context"] = started.prompt + list(ev.token_ids)
            return out

        def split(text: str) -> tuple[str, str]:
            return reply.feed(text) if chat else ("", text)

        if not stream:
            try:
                text, _, ev = await self.service.collect(started)
            except APIError as e:
                return _error(e)
            except ClientGone:
                return Response(status_code=499)
            thinking, content = split(text)
            t2, c2, calls = reply.finish() if chat else ("", "", [])
            return JSONResponse(done(ev, (thinking + t2, content + c2, calls)))

        def line(obj: dict) -> bytes:
            return json.dumps(obj, ensure_ascii=False).encode() + b"\n"

        async def lines() -> AsyncIterator[bytes]:
            ev = started.first
            try:
                while True:
                    thinking, content = split(ev.text) if ev.text else ("", "")
                    if thinking or content:
                        yield line(piece(thinking, content))
                    if ev.finish_reason is not None:
                        if chat:
                            thinking, content, calls = reply.finish()
                            if thinking or content or calls:
                                yield line(piece(thinking, content, calls))
                        yield line(done(ev))
                        return
                    ev = await anext(events)
            except ClientGone:
                return
            except APIError as e:  # the status is out: the error goes in the stream, as ollama's do
                yield line({"error": e.message})
            finally:
                await events.aclose()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    # -- models -----------------------------------------------------------------------------------

    async def tags(self, request: Request) -> Response:
        """The model this server answers with (a request for another gets a 404, so the store's
        other models are not listed)."""
        return JSONResponse({"models": [self.entry]})

    async def ps(self, request: Request) -> Response:
        expires = datetime.now(timezone.utc) + timedelta(days=3650)  # kept while the server runs
        kv = self.llm.engine.usage()
        return JSONResponse({"models": [{**self.entry, "size": self.entry["size"] + kv.bytes_total,
                                         "expires_at": expires.isoformat().replace("+00:00", "Z"),
                                         "size_vram": 0, "context_length": self.llm.engine.n_ctx}]})

    async def show(self, request: Request) -> Response:
        try:
            await self.resolve(await self.service.body(request))
        except APIError as e:
            return _error(e)
        return JSONResponse(show_body(self.entry, self.info, self.llm.template.source, self.llm.engine.n_ctx,
                                      self.llm.model.path, bool(self.llm.model.config.pooling)))

    async def pull(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
        except APIError as e:
            return _error(e)
        return await pull_response(body)

    async def delete(self, request: Request) -> Response:
        try:
            body = await self.service.body(request)
            name = _name(body)
        except APIError as e:
            return _error(e)
        if await asyncio.to_thread(self._pulled_as, name):
            return _error(APIError(409, f"model '{name[:200]}' is the one this server runs; stop the server to delete it"))
        return await delete_response(name)


def model_entry(name: str, path: Path) -> tuple[dict, Any]:
    """A model as /api/tags lists it, and its ModelInfo (the file's metadata read once)."""
    from infer.models.describe import describe_model

    info = describe_model(str(path))
    st = path.stat()
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else st.st_size
    entry = {"name": name, "model": name, "size": size,
             "modified_at": datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z"),
             "digest": _digest(path, st),
             "details": {"parent_model": "", "format": info.format, "family": info.architecture,
                         "families": [info.architecture], "parameter_size": _size_label(info.parameters),
                         "quantization_level": info.quantization or "F16"}}
    return entry, info


def show_body(entry: dict, info: Any, template: str, n_ctx: int, path: Path, embedding: bool = False) -> dict:
    """/api/show's answer for a model: its details, template, capabilities and context; an
    embedding model (its file names a pooling) says "embedding", as ollama's do."""
    caps = ["embedding"] if embedding else ["completion"] + (["tools"] if "tools" in template else []) + \
        (["thinking"] if style(template) else [])
    return {"modelfile": f"FROM {path}\n", "parameters": f"num_ctx {n_ctx}", "template": template,
            "details": entry["details"], "capabilities": caps, "modified_at": entry["modified_at"],
            "model_info": {"general.architecture": info.architecture, "general.parameter_count": info.parameters,
                           f"{info.architecture}.context_length": n_ctx}}


async def pull_response(body: dict) -> Response:
    """/api/pull through the same code as `infer pull`, progress as ollama's NDJSON status lines."""
    from infer.models.hub import pull

    try:
        name = _name(body)
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise APIError(400, f"'stream' must be true or false, got {kind(stream)}")
    except APIError as e:
        return _error(e)
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def report(file: str, done_bytes: int, total: int | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, {"status": f"pulling {file}", "digest": file,
                                                     "total": total or 0, "completed": done_bytes})

    async def run() -> dict:
        try:
            await asyncio.to_thread(pull, name, progress=report)
            return {"status": "success"}
        except Exception as e:  # PullError and the rest: the client gets the line, the server goes on
            return {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(run())
    if not stream:
        while await queue.get() is not None:
            pass
        result = await task
        return JSONResponse(result, status_code=400 if "error" in result else 200)

    async def lines() -> AsyncIterator[bytes]:
        yield b'{"status": "pulling manifest"}\n'
        while (item := await queue.get()) is not None:
            yield json.dumps(item).encode() + b"\n"
        yield json.dumps(await task).encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def delete_response(name: str) -> Response:
    """/api/delete of a pulled model (the caller has checked that no server runs it)."""
    from infer.models.store import ModelNotFoundError, ModelStore

    try:
        await asyncio.to_thread(ModelStore().remove, name)
    except ModelNotFoundError:
        return _error(APIError(404, f"model '{name[:200]}' not found"))
    except OSError as e:
        return _error(APIError(400, f"cannot delete '{name[:200]}': {e.strerror or e}"))
    return Response(status_code=200)


def _object(arguments: str) -> dict:
    """A call's arguments as the object ollama's clients require."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"value": arguments}
    return value if isinstance(value, dict) else {"value": value}


def _size_label(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _digest(path, st) -> str:
    """A stable id for the file (ollama sends a sha256 of the blob; hashing a multi-GB file is too
    slow, so this is the sha256 of its path, size and modification time)."""
    import hashlib

    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def routes(api: OllamaAPI) -> list:
    from starlette.routing import Route

    return [
        Route("/api/version", api.version, methods=["GET"]),
        Route("/api/chat", api.chat, methods=["POST"]),
        Route("/api/generate", api.generate, methods=["POST"]),
        Route("/api/tags", api.tags, methods=["GET"]),
        Route("/api/ps", api.ps, methods=["GET"]),
        Route("/api/show", api.show, methods=["POST"]),
        Route("/api/pull", api.pull, methods=["POST"]),
        Route("/api/delete", api.delete, methods=["DELETE"]),
    ]

