"""`infer serve [MODEL]`: the OpenAI- and ollama-compatible HTTP server (the server package) on uvicorn."""
from __future__ import annotations

import signal
import socket
import sys
from typing import List, Optional

import typer

from . import options as opt
from .app import app
from .errors import reported
from .sizes import parse_size

KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's default, said in --timeout's help)


@app.command(help="Serve MODEL (a pulled name or a .gguf path) over OpenAI's and ollama's HTTP APIs; without MODEL, "
                  "every pulled model and the embedded one, each loaded when a request names it.")
def serve(
    model: Optional[str] = typer.Argument(None, help="Pulled name or .gguf path (default: every pulled model)."),
    models: Optional[str] = typer.Option(None, "--models", help="all: serve every pulled model (as with no MODEL)."),
    max_models: int = typer.Option(1, "--max-models", help="Models kept loaded at once (several models mode)."),
    memory: Optional[str] = typer.Option(None, "--memory", show_default=False,
                                         help="Bytes the loaded models may take together, e.g. 8G (weights and KV)."),
    keep_alive: str = typer.Option("5m", "--keep-alive",
                                   help="How long an idle model stays loaded (ollama's keep_alive: 30s, 5m, 0, -1)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; "
                             "several: comma-separated, as llama-server's)."),
    port: int = typer.Option(8080, "--port", help="TCP port."),
    parallel: int = typer.Option(4, "--parallel", help="Sequences generated at once (continuous batching)."),
    ctx: int = opt.CTX,
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory",
                                            help="KV pool size, e.g. 512M (default: --parallel full contexts)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFER_API_KEY", show_default=False,
                                          help="Require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every /v1 route."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests that may wait for a free slot; more get 503."),
    cors: List[str] = typer.Option([], "--cors", "--cors-origins",
                                   help="Browser origins allowed: an origin, '*' (any) or 'localhost' (loopback "
                                        "origins, the default); repeatable or comma-separated."),
    alias: List[str] = typer.Option([], "--alias", "-a", help="The model's name in /v1/models and replies (MODEL "
                                    "only; repeatable or comma-separated: the first is its id, all are its names)."),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", show_default=False,
                                                help="Chat template instead of the model's: a name (chatml, llama3, "
                                                     "llama4, gemma, phi3, command-r) or Jinja source (MODEL only)."),
    chat_template_file: Optional[str] = typer.Option(None, "--chat-template-file", show_default=False,
                                                     help="Chat template instead of the model's, from a Jinja file."),
    seed: Optional[int] = typer.Option(None, "--seed", "-s", show_default=False,
                                       help="The seed of requests that name none, as llama-server's --seed: the same "
                                            "request, the same reply (default: a fresh seed each request)."),
    threads: int = opt.THREADS,
    backend: str = opt.BACKEND,
    gpu_layers: int = opt.GPU_LAYERS,
    mmap: bool = opt.MMAP,
    mlock: bool = opt.MLOCK,
    cache_type_k: str = opt.CACHE_TYPE_K,
    cache_type_v: str = opt.CACHE_TYPE_V,
    state_snapshots: int = opt.STATE_SNAPSHOTS,
    spec: Optional[str] = opt.SPEC,
    spec_ngram_n: int = opt.SPEC_NGRAM_N,
    draft_max: int = opt.DRAFT_MAX,
    draft: Optional[str] = opt.DRAFT,
    draft_min: int = opt.DRAFT_MIN,
    draft_p_min: float = opt.DRAFT_P_MIN,
    max_body: str = typer.Option("8M", "--max-body", help="Largest request body; bigger ones get 413."),
    timeout: float = typer.Option(60.0, "--timeout",
                                  help="Seconds a client has to send a whole request (head and body); slower "
                                       "ones are disconnected. Idle keep-alive connections close after 5 s."),
    shutdown_timeout: int = typer.Option(10, "--shutdown-timeout",
                                         help="Seconds running requests get to finish on SIGINT/SIGTERM."),
    reasoning_format: str = typer.Option("deepseek", "--reasoning-format",
                                         help="deepseek: a thinking model's <think>...</think> as reasoning_content; "
                                              "none: left in the content."),
    webui: bool = typer.Option(True, "--webui/--no-webui", help="GET / in a browser: the chat page."),
    pooling: str = typer.Option("", "--pooling", show_default=False,
                                help="How /v1/embeddings and /api/embed pool a text's tokens: mean, cls, last or rank "
                                     "(a reranker's head; default: the model file's pooling_type, else mean)."),
    ubatch_size: int = opt.UBATCH,
) -> None:
    load = opt.LoadOptions.of(locals())
    from infer.engine.reasoning import FORMATS

    if reasoning_format not in FORMATS:
        raise typer.BadParameter(f"--reasoning-format takes {' or '.join(FORMATS)}, got {reasoning_format!r}")
    if not 0 <= port <= 65535:
        raise typer.BadParameter(f"--port must be in 0..65535, got {port}")
    if seed is not None and not 0 <= seed < 2**64:
        raise typer.BadParameter(f"--seed must be in 0..2**64-1, got {seed}")
    if max_queue < 0:
        raise typer.BadParameter(f"--max-queue must be >= 0, got {max_queue}")
    if shutdown_timeout < 0:
        raise typer.BadParameter(f"--shutdown-timeout must be >= 0, got {shutdown_timeout}")
    if not timeout > 0:
        raise typer.BadParameter(f"--timeout must be > 0 seconds, got {timeout}")
    body_limit = parse_size(max_body)
    cors = [o.strip() for value in cors for o in value.split(",") if o.strip()]
    aliases = tuple(dict.fromkeys(a.strip() for value in alias for a in value.split(",") if a.strip()))
    template = _template(chat_template, chat_template_file)
    if (aliases or template is not None) and (model is None or models == "all"):
        raise typer.BadParameter("--alias and --chat-template(-file) name one model's: give MODEL")
    if models not in (None, "all"):
        raise typer.BadParameter(f"--models takes 'all', got {models!r}")
    if max_models < 1:
        raise typer.BadParameter(f"--max-models must be at least 1, got {max_models}")
    from .server.model_pool import keep_alive_seconds

    try:
        idle = keep_alive_seconds(keep_alive)
    except ValueError as e:
        raise typer.BadParameter(f"--keep-alive: {e}") from None
    socks = _listen(host, port)  # before the model loads: a busy port fails at once
    sock = socks[0]
    with reported():
        from .server.openai_server import ServerConfig

        config = load.engine_config(max_seqs=parallel, pooling=pooling)
        if model is None or models == "all":
            from .server.model_router import serve_models

            app = serve_models(config, api_key=api_key or None, max_queue=max_queue, max_body=body_limit,
                               cors=tuple(cors), reasoning_format=reasoning_format, max_models=max_models,
                               memory=parse_size(memory) if memory else 0, keep_alive=idle, webui=webui, seed=seed)
            sys.stderr.write(f"infer serve: every pulled model on http://{host}:{sock.getsockname()[1]}/v1 · "
                             f"loaded on demand, at most {max_models} at once · parallel {parallel} · ctx {ctx}"
                             f"{' · API key required' if api_key else ''}\n")
            return _run(app, host, port, socks, shutdown_timeout, timeout)
        server_config = ServerConfig(model_id="", api_key=api_key or None, max_queue=max_queue, max_body=body_limit,
                                     cors_origins=tuple(cors), reasoning_format=reasoning_format, webui=webui,
                                     seed=seed)
        _serve_one(model, config, server_config, host, socks, shutdown_timeout, timeout, aliases, template)


def _template(name_or_jinja: str | None, path: str | None) -> str | None:
    """--chat-template's or --chat-template-file's Jinja source (a bad one fails when the model loads)."""
    from infer.engine.chat_template import template_source

    if name_or_jinja is not None and path is not None:
        raise typer.BadParameter("give --chat-template or --chat-template-file, not both")
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise typer.BadParameter(f"--chat-template-file {path}: {getattr(e, 'strerror', None) or e}") from None
    if name_or_jinja is None:
        return None
    try:
        return template_source(name_or_jinja)
    except ValueError as e:
        raise typer.BadParameter(f"--chat-template: {e}") from None


def _serve_one(model: str, config, server_config, host: str, socks: list[socket.socket], shutdown_timeout: int,
               timeout: float, aliases: tuple[str, ...] = (), template: str | None = None) -> None:
    """One model, loaded now (a bad file fails before the server answers anything)."""
    from dataclasses import replace

    from .load import load_llm
    from .server.openai_server import create_app

    llm = load_llm(model, config, quiet=not sys.stderr.isatty())
    if template is not None:
        llm.override_template(template)  # a template that fails: a one-line error, exit 1
    path = llm.model.path
    # --alias: the id of /v1/models and of replies, the first of them (llama-server's --alias)
    model_id = aliases[0] if aliases else path.stem
    others = (*aliases[1:], *sorted({path.name, str(path), path.stem, llm.model.config.name or path.stem}))
    server_config = replace(server_config, model_id=model_id,
                            model_aliases=tuple(dict.fromkeys(a for a in others if a != model_id)))
    kv = llm.engine.usage()
    port = socks[0].getsockname()[1]
    sys.stderr.write(
        f"infer serve: {model_id} on http://{host}:{port}/v1 · parallel {config.max_seqs} · "
        f"ctx {llm.engine.n_ctx} · "
        f"KV {kv.bytes_total / 2**20:.1f} MiB · {llm.backend}: {', '.join(llm.runner.devices())}"
        f"{' · API key required' if server_config.api_key else ''}\n"
    )
    _run(create_app(llm, server_config), host, port, socks, shutdown_timeout, timeout)


def _run(app, host: str, port: int, socks: list[socket.socket], shutdown_timeout: int, timeout: float) -> None:
    import uvicorn

    from .server.http_protocol import TimedH11Protocol, raise_open_files_limit

    raise_open_files_limit()  # idle and slow connections cost a descriptor each until --timeout
    uv = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                        http=TimedH11Protocol.for_timeout(timeout), timeout_keep_alive=KEEP_ALIVE_S,
                        timeout_graceful_shutdown=shutdown_timeout, lifespan="on")
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # previous handler; this one makes that a clean exit instead of a kill or a traceback.
    handled = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(uv).run(sockets=socks)
    finally:
        for sig, handler in handled.items():
            signal.signal(sig, handler)
    sys.stderr.write("infer serve: stopped\n")


def _listen(hosts: str, port: int) -> list[socket.socket]:
    """A socket on each address of --host (comma-separated), all on one port (port 0: the first's)."""
    socks: list[socket.socket] = []
    names = [h.strip().strip("[]") for h in hosts.split(",") if h.strip()] or [hosts]
    for host in names:
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(names) > 1:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # :: beside 0.0.0.0
            sock.bind(addr)
        except OSError as e:
            sys.stderr.write(f"error: cannot listen on {host}:{port}: {e.strerror or e}\n")
            raise typer.Exit(1) from None
        socks.append(sock)
        port = sock.getsockname()[1]
    return socks
