"""`infer launch claude|codex|opencode [MODEL] [-- AGENT ARGS...]`: a coding agent on a local model,
as `ollama launch` runs one.

An `infer serve` already answering at --host/--port is reused (its GET /v1/models says that it is
infer's and what it serves); else one is started in the background, in a session of its own (the
terminal's Ctrl-C is the agent's: Claude Code and Codex cancel a turn with it), logging under the
infer home, and stopped when the agent exits.  The agent runs with its environment (and for
Codex, its `-c` config flags) pointed at the server and every model name it would send pinned to
the served model; its exit code is launch's.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import typer
from typer.core import TyperCommand

from infer.quant.errors import InferError

from . import options as opt
from .app import app
from .errors import reported

AGENT_ARGS = "infer.launch.agent_args"  # ctx.meta key: the words after `--`
NO_KEY = "infer"  # the token sent where the server wants no key: the agents refuse to start without one
START_TIMEOUT_S = 900  # a first run compiles the kernels (minutes on a small machine)
STOP_TIMEOUT_S = 30  # what serve's own --shutdown-timeout (10 s) needs, and some

# Claude Code's model settings (code.claude.com/docs/en/model-config): the main model, the aliases
# /model and subagents pick (opus, sonnet, haiku), and the older small-fast one for background tasks
CLAUDE_MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                     "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")


class LaunchError(InferError):
    """What launch cannot get past: a port held by something else, a model the server does not
    serve, a server that did not start, an agent not installed."""


@dataclass(frozen=True)
class Setup:
    env: dict[str, str]  # set on top of launch's own environment
    argv: list[str]  # the agent's command line, its name first


def claude_setup(url: str, model: str, key: str, args: list[str]) -> Setup:
    """Claude Code speaks Anthropic's Messages API at ANTHROPIC_BASE_URL (+ /v1/messages)."""
    return Setup({"ANTHROPIC_BASE_URL": url,
                  # sent as Bearer; ANTHROPIC_API_KEY emptied as ollama's launch does: Claude Code asks
                  # before it uses a key found there, and a real Anthropic key has no business here
                  "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_API_KEY": "",
                  **{name: model for name in CLAUDE_MODEL_VARS}},
                 ["claude", *args])


def codex_setup(url: str, model: str, key: str, args: list[str]) -> Setup:
    """Codex CLI speaks OpenAI's Responses API through a model provider of its config.toml, given
    here as `-c` overrides: they reach every subcommand (`codex exec` too), where `-m` is the
    interactive one's alone."""
    provider = (f"{{ name = \"infer\", base_url = {_toml(url + '/v1')}, env_key = \"OPENAI_API_KEY\", "
                f"wire_api = \"responses\" }}")
    return Setup({"OPENAI_BASE_URL": url + "/v1", "OPENAI_API_KEY": key},
                 ["codex", "-c", f"model={_toml(model)}", "-c", 'model_provider="infer"',
                  "-c", f"model_providers.infer={provider}", *args])


def opencode_setup(url: str, model: str, key: str, args: list[str]) -> Setup:
    """OpenCode takes an inline config (OPENCODE_CONFIG_CONTENT, merged over the user's files, last
    and so winning): an OpenAI-compatible provider with the one model, its main and small model."""
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"infer": {"npm": "@ai-sdk/openai-compatible", "name": "infer",
                                     "options": {"baseURL": url + "/v1", "apiKey": key},
                                     "models": {model: {"name": model}}}},
              "model": f"infer/{model}", "small_model": f"infer/{model}"}
    return Setup({"OPENCODE_CONFIG_CONTENT": json.dumps(config)}, ["opencode", *args])


def _toml(s: str) -> str:
    return json.dumps(s)  # a JSON string (ASCII, \" \\ \uXXXX escapes) is a TOML basic string


@dataclass(frozen=True)
class Agent:
    title: str
    install: str  # how to get it, said when it is missing
    setup: Callable[[str, str, str, list[str]], Setup]
    fallbacks: tuple[str, ...] = ()  # where its installer puts it besides PATH (under the home folder)


AGENTS = {
    "claude": Agent("Claude Code", "npm install -g @anthropic-ai/claude-code (or see "
                                   "https://code.claude.com/docs/en/quickstart)", claude_setup,
                    (".claude/local/claude",)),
    "codex": Agent("Codex", "npm install -g @openai/codex", codex_setup),
    "opencode": Agent("OpenCode", "npm install -g opencode-ai (or see https://opencode.ai)", opencode_setup),
}


class SplitAtDashes(TyperCommand):
    """Keeps the words after the first `--` for the agent: click would hand the first to MODEL."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta[AGENT_ARGS] = args[i + 1:]
            args = args[:i]
        return super().parse_args(ctx, args)


@app.command(cls=SplitAtDashes,
             help="Run a coding agent (claude: Claude Code, codex: Codex, opencode: OpenCode) on MODEL, served by "
                  "`infer serve` (started in the background unless one answers at --host/--port, stopped after); "
                  "words after -- go to the agent.")
def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="claude, codex or opencode."),
    model: Optional[str] = typer.Argument(None, help="Pulled name or .gguf path (default: the running server's model, "
                                                     "else the default model)."),
    host: str = typer.Option("127.0.0.1", "--host", help="The server's address (infer serve's --host)."),
    port: int = typer.Option(8080, "--port", help="The server's port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFER_API_KEY", show_default=False,
                                          help="The server's API key (a server launch starts requires it)."),
    ctx_size: int = typer.Option(32768, "--ctx", "-c",
                                 help="A started server's context (at most the model's): agents send long prompts."),
    parallel: int = typer.Option(1, "--parallel", help="A started server's sequences generated at once."),
    threads: int = opt.THREADS,
    print_env: bool = typer.Option(False, "--print-env", "--dry-run",
                                   help="Print the environment and command line the agent would get; run nothing."),
) -> None:
    if agent not in AGENTS:
        raise typer.BadParameter(f"AGENT takes {', '.join(AGENTS)}, got {agent!r}")
    if not 1 <= port <= 65535:
        raise typer.BadParameter(f"--port must be in 1..65535, got {port}")
    args = list(ctx.meta.get(AGENT_ARGS, []))
    url = client_url(host, port)
    key = api_key or NO_KEY
    spec = AGENTS[agent]
    with reported():
        served = served_models(url, key)
        if print_env:
            name = pick_model(served, model, url) if served is not None else served_name(model)
            sys.stdout.write(format_setup(spec.setup(url, name, key, args)))
            return
        exe = find_agent(agent, spec)  # before a server starts for nothing
        server = None
        try:
            if served is None:
                server, log = start_server(model, host, port, api_key, ctx_size, parallel, threads)
                served = wait_ready(server, url, key, log)
            name = pick_model(served, model, url)
            setup = spec.setup(url, name, key, args)
            sys.stderr.write(f"infer launch: {spec.title} on {name} at {url}\n")
            code = run_agent([exe, *setup.argv[1:]], {**os.environ, **setup.env})
        finally:
            if server is not None:
                stop_server(server)
    raise typer.Exit(code)


def client_url(host: str, port: int) -> str:
    """The URL a client reaches the server at: a wildcard address is this machine."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def served_models(url: str, key: str) -> list[str] | None:
    """The model ids infer serve at url lists, or None where nothing listens there."""
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy
    try:
        with direct.open(req, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise LaunchError(f"infer serve at {url} {'rejects --api-key' if key != NO_KEY else 'needs its API key'}: "
                              f"pass it with --api-key (or INFER_API_KEY)") from None
        raise _not_infer(url) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            return None
        raise LaunchError(f"{url} does not answer: {e.reason}") from None
    except (OSError, ValueError):  # a reset, a timeout, a body that is not JSON
        raise _not_infer(url) from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and m.get("owned_by") == "infer" for m in data):
        raise _not_infer(url)
    return [str(m.get("id")) for m in data]


def _not_infer(url: str) -> LaunchError:
    return LaunchError(f"{url} answers, but not as infer serve: stop what runs there, or launch with another --port")


def pick_model(served: list[str], model: str | None, url: str) -> str:
    """The name to pin: MODEL as the server lists it, or the server's first (with one model, its
    own; with every pulled model, the default)."""
    if not served:
        raise LaunchError(f"infer serve at {url} serves no model")
    if model is None:
        return served[0]
    wanted = {model, model.removesuffix(":latest"), Path(model).stem if model.endswith(".gguf") else model}
    try:
        from infer.models.resolve import locate_model

        found = locate_model(model)
        wanted |= {found.path.stem, found.name}  # one model is served by its file's stem, several by name
    except InferError:
        pass
    for name in served:
        if name in wanted:
            return name
    more = ", ..." if len(served) > 4 else ""
    raise LaunchError(f"infer serve at {url} does not serve {model} (it serves {', '.join(served[:4])}{more}): "
                      f"stop it, or launch with another --port")


def served_name(model: str | None) -> str:
    """The name `infer serve MODEL` will serve MODEL by (its file's stem), without loading it."""
    from infer.models.resolve import default_model, locate_model

    return (locate_model(model) if model else default_model()).path.stem


def format_setup(setup: Setup) -> str:
    """The setup as shell lines: NAME=value each, then the command."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in setup.env.items()) + shlex.join(setup.argv) + "\n"


def find_agent(name: str, agent: Agent) -> str:
    found = shutil.which(name)
    for rel in () if found else agent.fallbacks:
        p = Path.home() / rel
        if p.is_file() and os.access(p, os.X_OK):
            found = str(p)
    if not found:
        raise LaunchError(f"{name} ({agent.title}) is not installed: {agent.install}")
    return found


def start_server(model: str | None, host: str, port: int, api_key: str | None, ctx_size: int, parallel: int,
                 threads: int) -> tuple[subprocess.Popen, Path]:
    """`infer serve` on one model (MODEL, else the default) in the background, its output in a log."""
    from infer.models.default import infer_home
    from infer.models.resolve import default_model

    if model is None:  # one model, not every pulled one: it loads (and fails) before the agent starts
        found = default_model()
        if found.note:
            sys.stderr.write(f"note: {found.note}\n")
        model = str(found.path)
    log = infer_home() / "logs" / f"launch-serve-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **({"INFER_API_KEY": api_key} if api_key else {}))  # not on a command line ps shows
    argv = [sys.executable, "-m", "infer.cli", "serve", model, "--host", host, "--port", str(port),
            "--ctx", str(ctx_size), "--parallel", str(parallel), "--threads", str(threads)]
    sys.stderr.write(f"infer launch: starting infer serve {model} on {client_url(host, port)} (log: {log})\n")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, log


def wait_ready(proc: subprocess.Popen, url: str, key: str, log: Path) -> list[str]:
    """The models the started server lists, once it answers."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ln.startswith("error:")), lines[-1] if lines else "")
            raise LaunchError(f"infer serve exited ({why.removeprefix('error: ') or f'code {proc.returncode}'}; "
                              f"log: {log})")
        served = served_models(url, key)
        if served is not None:
            return served
        if time.monotonic() > deadline:
            raise LaunchError(f"infer serve did not answer at {url} within {START_TIMEOUT_S} s (log: {log})")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (serve lets running requests finish), then a kill if it will not stop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_agent(argv: List[str], env: dict[str, str]) -> int:
    """The agent's exit code (128 + the signal that ended it, as a shell reports it)."""
    proc = subprocess.Popen(argv, env=env)
    # While the agent runs, the terminal's Ctrl-C is its to handle (it shares our process group);
    # a SIGTERM for launch is passed on. Set after the Popen: an ignored SIGINT would be inherited.
    handlers = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: proc.terminate())}
    try:
        code = proc.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code if code >= 0 else 128 - code
