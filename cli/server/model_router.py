"""Several models from one `infer serve` (no MODEL, or --models all): each request runs on the model
its body names, loaded on demand (model_pool.py).

The router reads a request's body once, finds the model it names in the catalog (the embedded
default and every pulled model, by the store's names: a request's text is never read as a path),
takes a lease on it from the pool (waiting while it loads), and hands the request, its body
parsed (in the ASGI scope, service.PARSED_BODY), to that model's own app
(openai_server.create_app), whose service reads it from there rather than parsing it again: every
route of one model works here unchanged.  What is about all models is answered here: /v1/models and /api/tags (what can be
served), /api/ps (what is loaded, its memory and expiry), /health, /metrics, /api/pull,
/api/delete, /api/version and `GET /`.
"""
from __future__ import annotations

import asyncio
import math
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import anthropic_api, openapi
from .error_shapes import error_response
from .llama_api import llama_error
from .llama_props import router_props_routes
from .model_pool import Loaded, LoadFailed, ModelPool, keep_alive_seconds
from .ollama_api import API_VERSION, delete_response, model_entry, pull_response, show_body
from .openai_request import APIError, disconnected, parse_json
from .rerank_api import ROUTES as RERANK_ROUTES
from .responses_api import stored
from .server_metrics import Metrics
from .service import PARSED_BODY
from .webui import page_routes

# the routes whose body names the model they run on (llama.cpp's /tokenize and /detokenize name
# none: they go to the loaded model, else the default one)
MODEL_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/chat", "/api/generate",
                          "/api/embed", "/api/embeddings", "/api/show", "/tokenize", "/detokenize", *RERANK_ROUTES,
                          "/v1/responses", *anthropic_api.ROUTES, "/completion", "/completions", "/infill",
                          "/apply-template"})


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


class Catalog:
    """The models a request may name: the embedded default (by its file's stem or name) and every
    model in the store (by its pulled name, "owner/repo:QUANT" or "owner/repo")."""

    def __init__(self, default: Path):
        self.default = (default.stem, default)
        self._entries: dict[tuple[str, Path, int], tuple[dict, Any]] = {}

    def find(self, name: str) -> tuple[str, Path] | None:
        from infer.models.store import ModelStore, looks_like_name

        if name in (self.default[0], self.default[1].name) or name.split(":")[0] == self.default[0]:
            return self.default
        if not looks_like_name(name):
            return None
        try:
            m = ModelStore().get(name.removesuffix(":latest"))
        except Exception:  # a malformed manifest: not a model here
            return None
        return (m.name, Path(m.path)) if m is not None and Path(m.path).exists() else None

    def names(self) -> list[tuple[str, Path]]:
        from infer.models.store import ModelStore

        try:
            stored = [(m.name, Path(m.path)) for m in ModelStore().list() if Path(m.path).exists()]
        except Exception:
            stored = []
        return [self.default, *stored]

    def entry(self, name: str, path: Path) -> tuple[dict, Any]:
        """/api/tags' entry for a model and its ModelInfo, read once per file version."""
        key = (name, path, path.stat().st_mtime_ns)
        if key not in self._entries:
            self._entries[key] = model_entry(name, path)
        return self._entries[key]


class ModelRouter:
    def __init__(self, pool: ModelPool, catalog: Catalog, metrics: Metrics, max_body: int, n_ctx: int,
                 webui: bool = True):
        self.pool, self.catalog, self.metrics, self.max_body = pool, catalog, metrics, max_body
        self.n_ctx = n_ctx  # --ctx: what /api/show says of a model not loaded
        self.created = int(time.time())

        @asynccontextmanager
        async def lifespan(app: Starlette):
            pool.start()
            try:
                yield
            finally:
                await pool.close()

        self.app = Starlette(lifespan=lifespan, routes=[
            *page_routes(webui, self.root),
            Route("/api/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
            Route("/api/pull", self.pull, methods=["POST"]),
            Route("/api/delete", self.delete, methods=["DELETE"]),
            Route("/openapi.json", openapi.endpoint, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.stored_response, methods=["GET", "DELETE"]),
            *router_props_routes(),
        ])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in MODEL_ROUTES:
            return await self.forward(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] in ("/props", "/slots"):
            name = Request(scope).query_params.get("model")
            if name:  # llama-server's router: a model's own /props and /slots, named in the query
                return await self.forward_get(name, scope, receive, send)
        await self.app(scope, receive, send)

    # -- requests on a model -------------------------------------------------------------------------

    async def forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        ollama = scope["path"].startswith("/api/")
        try:
            raw = await self._body(receive)
            body = self._parse(raw)
            try:
                keep_alive = keep_alive_seconds(body.get("keep_alive")) if ollama else None
            except ValueError as e:
                raise APIError(400, str(e), "keep_alive", "invalid_value") from None
            name, path = await self._target(body, ollama)
            if ollama and keep_alive == 0 and scope["path"] in ("/api/generate", "/api/chat") \
                    and not body.get("prompt") and not body.get("messages"):
                return await self._unloaded(name, body, scope["path"], scope, receive, send)
            if scope["path"] == "/api/show" and name not in self.pool.loaded and path.is_file():
                # clients (Continue) ask about every model: answered from the file, nothing loaded
                shown = await asyncio.to_thread(self._show, name, path)
                return await JSONResponse(shown)(scope, receive, send)
            m = await self._lease(name, path, receive)
        except APIError as e:
            return await error_response(scope["path"], e)(scope, receive, send)
        except _Gone:
            return
        except Exception as e:  # a bug of ours: the client gets its API's shape, the server goes on
            err = APIError(500, f"internal error: {type(e).__name__}", None, "internal_error", "server_error")
            return await error_response(scope["path"], err)(scope, receive, send)
        # None: an empty body, which the model's route refuses as a one-model server does
        scope = {**scope, PARSED_BODY: body if raw.strip() else None}
        try:
            await m.app(scope, receive, send)
        finally:
            self.pool.release(m, keep_alive)

    async def forward_get(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            m = await self._lease(*await self._target({"model": name}, False), receive)
        except APIError as e:
            return await llama_error(e)(scope, receive, send)
        except _Gone:
            return
        try:
            await m.app(scope, receive, send)
        finally:
            self.pool.release(m)

    async def _lease(self, name: str, path: Path, receive: Receive) -> Loaded:
        """The loaded model (waiting while it loads); _Gone when the client leaves first (the load
        goes on for the others), a 400 when it fails to load."""
        leasing = asyncio.ensure_future(self.pool.acquire(name, path))
        gone = asyncio.ensure_future(disconnected(receive))
        try:
            await asyncio.wait({leasing, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not leasing.done():  # the client left (or this request was cancelled): no lease taken
                leasing.cancel()
                leasing.add_done_callback(self._release_late)
        if not leasing.done():
            raise _Gone
        try:
            m: Loaded = leasing.result()
        except LoadFailed as e:
            raise APIError(400, str(e), "model", "model_load_failed") from None
        if gone.done() and not gone.cancelled():  # it left just as the model became ready
            self.pool.release(m)
            raise _Gone
        return m

    def _release_late(self, task: asyncio.Task) -> None:
        """A lease taken after its request had given up on it (cancelled too late) goes back."""
        if not task.cancelled() and task.exception() is None:
            self.pool.release(task.result())

    async def _body(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise APIError(413, f"the request body is larger than {self.max_body} bytes", None, "body_too_large")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    def _parse(raw: bytes) -> dict:
        if not raw.strip():
            return {}
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", None, "invalid_type")
        return body

    async def _target(self, body: dict, ollama: bool) -> tuple[str, Path]:
        """(catalog name, path) of the model the body names; without one, the model loaded (if only
        one is), else the embedded default."""
        name = body.get("model", body.get("name")) if ollama else body.get("model")
        if name is None or name == "":
            if ollama:
                raise APIError(400, "'model' is required")
            loaded = list(self.pool.loaded.values())
            return (loaded[0].name, loaded[0].path) if len(loaded) == 1 else self.catalog.default
        if not isinstance(name, str):
            raise APIError(400, "'model' must be a string", "model", "invalid_type")
        found = await asyncio.to_thread(self.catalog.find, name)
        if found is None:
            raise APIError(404, f"model '{name[:200]}' not found; pull it first (infer pull) or see /v1/models",
                           "model", "model_not_found")
        return found

    async def _unloaded(self, name: str, body: dict, path: str, scope, receive, send) -> None:
        """ollama's way to unload: an empty generate/chat with keep_alive 0 (Open WebUI sends it)."""
        self.pool.expire(name)
        out = {"model": body.get("model", name), "created_at": _iso(time.time()), "done": True, "done_reason": "unload"}
        out.update({"message": {"role": "assistant", "content": ""}} if path == "/api/chat" else {"response": ""})
        await JSONResponse(out)(scope, receive, send)

    def _show(self, name: str, path: Path) -> dict:
        from infer.engine.chat_template import ChatTemplateError, builtin_template
        from infer.models.gguf_file import GGUFError, read_gguf

        try:
            entry, info = self.catalog.entry(name, path)
            meta = read_gguf(path).metadata
        except (OSError, GGUFError, ValueError) as e:
            raise APIError(400, f"cannot read model '{name}': {str(e).splitlines()[0][:200]}") from None
        template = meta.get("tokenizer.chat_template") or ""
        if not template:
            try:
                template = builtin_template(info.architecture, str(meta.get("tokenizer.ggml.model", "")),
                                            meta.get("tokenizer.ggml.pre"))
            except ChatTemplateError:
                template = ""
        n_ctx = min(self.n_ctx, info.context_length or self.n_ctx)
        embedding = meta.get(f"{info.architecture}.pooling_type") in (1, 2, 3, 4)  # as ollama_api.show: a pooling
        return show_body(entry, info, template, n_ctx, path, embedding)

    # -- about every model ---------------------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def stored_response(self, request: Request) -> Response:
        return await stored([m.app.state.responses for m in list(self.pool.loaded.values())], request)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": API_VERSION})

    async def models(self, request: Request) -> Response:
        names = await asyncio.to_thread(self.catalog.names)
        data = []
        for name, _ in names:
            m = self.pool.loaded.get(name)
            data.append({"id": name, "object": "model", "created": self.created, "owned_by": "infer",
                         **({"context_length": m.llm.engine.n_ctx} if m else {})})
        return JSONResponse({"object": "list", "data": data})

    async def tags(self, request: Request) -> Response:
        names = await asyncio.to_thread(self.catalog.names)
        entries = [e for e in await asyncio.to_thread(lambda: [self._entry(n, p) for n, p in names]) if e]
        return JSONResponse({"models": entries})

    def _entry(self, name: str, path: Path) -> dict | None:
        try:
            return self.catalog.entry(name, path)[0]
        except Exception:  # a file that cannot be described is not listed
            return None

    async def ps(self, request: Request) -> Response:
        out = []
        for m in list(self.pool.loaded.values()):
            n_ctx, until = m.llm.engine.n_ctx, m.expires_at()  # before an await: the reaper may unload it meanwhile
            entry = await asyncio.to_thread(self._entry, m.name, m.path) or {"name": m.name, "model": m.name}
            until = time.time() + 3650 * 86400 if math.isinf(until) else until
            out.append({**entry, "size": m.size, "expires_at": _iso(until), "size_vram": 0, "context_length": n_ctx})
        return JSONResponse({"models": out})

    async def health(self, request: Request) -> Response:
        loaded = list(self.pool.loaded.values())
        return JSONResponse({"status": "ok", "models": [m.name for m in loaded],
                             "loading": list(self.pool.loading),
                             "running": sum(m.llm.engine.num_running() for m in loaded),
                             "waiting": sum(m.llm.engine.num_waiting() for m in loaded)})

    async def metrics_route(self, request: Request) -> Response:
        engines = [m.llm.engine for m in self.pool.loaded.values()]
        return PlainTextResponse(self.metrics.render(engines), media_type="text/plain; version=0.0.4")

    async def pull(self, request: Request) -> Response:
        try:
            body = self._parse(await self._body(request.receive))
        except APIError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except _Gone:
            return Response(status_code=499)
        return await pull_response(body)

    async def delete(self, request: Request) -> Response:
        try:
            body = self._parse(await self._body(request.receive))
            name = body.get("model", body.get("name"))
            if not isinstance(name, str) or not name:
                raise APIError(400, "'model' is required")
        except APIError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except _Gone:
            return Response(status_code=499)
        found = await asyncio.to_thread(self.catalog.find, name)
        if found is not None and found == self.catalog.default:
            return JSONResponse({"error": "the embedded default model cannot be deleted"}, status_code=400)
        if found is not None and found[0] in self.pool.loaded and not await self.pool.unload(found[0]):
            return JSONResponse({"error": f"model '{name[:200]}' is running requests; retry when they end"},
                                status_code=409)
        return await delete_response(name)


def serve_models(config, api_key: str | None, max_queue: int, max_body: int, cors: tuple[str, ...],
                 reasoning_format: str, max_models: int, memory: int, keep_alive: float, webui: bool = True,
                 seed: int | None = None):
    """The ASGI app of a several-models server: the router behind the API key and CORS."""
    from infer.models.resolve import default_model

    from ..load import load_llm
    from .cors import Cors
    from .llama_paths import UnversionedPaths
    from .openai_server import FrontDoor, create_app
    from .service import ServerConfig

    metrics = Metrics()

    def build(name: str, path: Path):
        llm = load_llm(str(path), config, quiet=True)
        server_config = ServerConfig(model_id=name, api_key=None, max_queue=max_queue, max_body=max_body,
                                     reasoning_format=reasoning_format, any_name=True, seed=seed)
        return llm, create_app(llm, server_config, metrics, own_lifespan=False)

    pool = ModelPool(build, lambda path: estimate_bytes(path, config), max_models, memory, keep_alive)
    app: Any = FrontDoor(ModelRouter(pool, Catalog(default_model().path), metrics, max_body, config.n_ctx, webui), api_key, metrics)
    return UnversionedPaths(Cors(app, cors))


def estimate_bytes(path: Path, config) -> int:
    """What loading the model will take: its files and the KV pool the engine config gives it."""
    from infer.engine.engine import Engine
    from infer.models.config import ModelConfig
    from infer.models.gguf_file import read_gguf, shard_path

    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    g = read_gguf(path)
    files = sum(shard_path(path, i, g.shards).stat().st_size for i in range(g.shards)) if g.shards > 1 \
        else path.stat().st_size
    return files + Engine.kv_pool_bytes(ModelConfig.from_metadata(g.metadata), config)


class _Gone(Exception):
    """The client disconnected before its request was read."""
