"""`infer launch claude|codex|opencode`: stand-in agents (a Python script put first on PATH under
the agent's name) record what they were given and make one request to the server with those
settings alone, as the real agent would find it: on a server launch starts (and stops), and on a
running one it reuses. The errors, --print-env and the model picked run in-process, without a model."""
from __future__ import annotations

import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.server import MODEL, free_port

AGENTS = ("claude", "codex", "opencode")
KEY = "sk-launch"

STAND_IN = """\
#!{python}
# A stand-in coding agent: finds the server and the model the way the real one does (its
# environment, its -c config flags, its inline config), makes one chat request there and writes
# what it got to $LAUNCH_RECORD; exits with $STANDIN_EXIT.
import json, os, sys, tomllib, urllib.request

name, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
if name == "claude":
    base, key, model = os.environ["ANTHROPIC_BASE_URL"] + "/v1", os.environ["ANTHROPIC_AUTH_TOKEN"], \\
        os.environ["ANTHROPIC_MODEL"]
elif name == "codex":
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    config = tomllib.loads("\\n".join("{{}} = {{}}".format(*p.split("=", 1)) for p in pairs))
    provider = config["model_providers"][config["model_provider"]]
    base, key, model = provider["base_url"], os.environ[provider["env_key"]], config["model"]
else:
    config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
    provider_id, model = config["model"].split("/", 1)
    provider = config["provider"][provider_id]
    assert model in provider["models"]
    base, key = provider["options"]["baseURL"], provider["options"]["apiKey"]
body = json.dumps({{"model": model, "messages": [{{"role": "user", "content": "Hi"}}], "max_tokens": 3}}).encode()
req = urllib.request.Request(base + "/chat/completions", data=body,
                             headers={{"Authorization": "Bearer " + key, "Content-Type": "application/json"}})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        status, reply = r.status, json.load(r)
except urllib.error.HTTPError as e:
    status, reply = e.code, e.read().decode()
with open(os.environ["LAUNCH_RECORD"], "w") as f:
    json.dump({{"argv": argv, "env": dict(os.environ), "base": base, "model": model, "status": status,
               "reply": reply}}, f)
sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))
"""


@pytest.fixture
def agents_bin(tmp_path) -> Path:
    """A folder with the three stand-ins, to put first on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in AGENTS:
        (folder / name).write_text(STAND_IN.format(python=sys.executable))
        (folder / name).chmod(0o755)
    return folder


def launch(*args: str, agents_bin: Path, record: Path, **env: str) -> subprocess.CompletedProcess:
    """`infer launch ARGS` as a user runs it, with the stand-ins first on PATH."""
    full = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{agents_bin}{os.pathsep}{os.environ['PATH']}",
                LAUNCH_RECORD=str(record), **env)
    full.pop("INFER_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "infer.cli", "launch", *args], capture_output=True, text=True,
                          env=full, timeout=900)


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def check_pinned(agent: str, rec: dict, port: int, key: str) -> None:
    """The agent's own settings point at the server on port and name the served model everywhere."""
    env, url = rec["env"], f"http://127.0.0.1:{port}"
    assert rec["base"] == url + "/v1" and rec["model"] == MODEL
    if agent == "claude":
        assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_AUTH_TOKEN"] == key
        assert env["ANTHROPIC_API_KEY"] == ""
        for name in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                     "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):
            assert env[name] == MODEL, name
    elif agent == "codex":
        assert env["OPENAI_BASE_URL"] == url + "/v1" and env["OPENAI_API_KEY"] == key
        assert 'model_provider="infer"' in rec["argv"] and f'model="{MODEL}"' in rec["argv"]
    else:
        config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
        assert config["model"] == config["small_model"] == f"infer/{MODEL}"
        assert list(config["provider"]["infer"]["models"]) == [MODEL]


# ---------------------------------------------------------------- a server launch starts and stops


def test_launch_starts_the_server_and_stops_it_after(gemma_path, agents_bin, tmp_path):
    port, record = free_port(), tmp_path / "record.json"
    r = launch("claude", str(gemma_path), "--port", str(port), "--api-key", KEY, "--ctx", "1024", "--threads", "2",
               "--", "-p", "say hi", agents_bin=agents_bin, record=record, STANDIN_EXIT="3",
               INFER_HOME=str(tmp_path / "home"))
    assert r.returncode == 3, r.stderr  # the agent's exit code
    rec = json.loads(record.read_text())
    assert rec["argv"] == ["-p", "say hi"]
    assert rec["status"] == 200 and rec["reply"]["model"] == MODEL, rec["reply"]
    assert rec["reply"]["usage"]["completion_tokens"] > 0
    check_pinned("claude", rec, port, KEY)
    assert "starting infer serve" in r.stderr
    assert refused(port)  # stopped, and cleanly
    log = (tmp_path / "home" / "logs" / f"launch-serve-{port}.log").read_text()
    assert "API key required" in log and "infer serve: stopped" in log and "Traceback" not in log


@pytest.mark.e2e  # the CLI in a subprocess, and serve in another
def test_a_server_that_cannot_start_is_reported(agents_bin, tmp_path):
    """The model is serve's to find: its error comes back as launch's, and the agent never runs."""
    port, record = free_port(), tmp_path / "record.json"
    r = launch("codex", str(tmp_path / "missing.gguf"), "--port", str(port), agents_bin=agents_bin, record=record,
               INFER_HOME=str(tmp_path / "home"))
    assert r.returncode == 1 and not record.exists()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: infer serve exited (") and "missing.gguf" in last and "log: " in last, r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- a running server reused


@pytest.mark.parametrize("agent", AGENTS)
def test_launch_reuses_a_running_server(server, agents_bin, tmp_path, agent):
    record = tmp_path / "record.json"
    r = launch(agent, "--port", str(server.port), "--", "exec", "fix the bug", agents_bin=agents_bin, record=record)
    assert r.returncode == 0, r.stderr
    assert "starting" not in r.stderr and f"on {MODEL} at http://127.0.0.1:{server.port}" in r.stderr
    rec = json.loads(record.read_text())
    assert rec["argv"][-2:] == ["exec", "fix the bug"]
    assert rec["status"] == 200 and rec["reply"]["model"] == MODEL, rec["reply"]
    check_pinned(agent, rec, server.port, "infer")
    assert server.proc.poll() is None  # not launch's to stop


def test_a_model_the_running_server_lacks_is_refused(server, gemma_path, agents_bin, tmp_path):
    record = tmp_path / "record.json"
    r = launch("claude", str(gemma_path), "--port", str(server.port), agents_bin=agents_bin, record=record)
    assert r.returncode == 0 and json.loads(record.read_text())["model"] == MODEL  # its file names it
    other = tmp_path / "other-model.gguf"
    other.write_bytes(b"")
    r = launch("claude", str(other), "--port", str(server.port), agents_bin=agents_bin, record=tmp_path / "no.json")
    assert r.returncode == 1 and not (tmp_path / "no.json").exists()
    assert r.stderr.strip() == (f"error: infer serve at http://127.0.0.1:{server.port} does not serve {other} "
                                f"(it serves {MODEL}): stop it, or launch with another --port")


# ---------------------------------------------------------------- in-process: no model, no agent run


def invoke(*args: str, **env: str):
    from infer.cli.app import app
    from infer.cli.main import register_commands

    register_commands()
    return CliRunner().invoke(app, ["launch", *args], env={"INFER_API_KEY": None, **env})


@pytest.mark.parametrize("agent", AGENTS)
def test_print_env(tmp_path, agent):
    model = tmp_path / "My-Model.Q4_K_M.gguf"
    model.write_bytes(b"")  # named, never loaded
    port = free_port()
    r = invoke(agent, str(model), "--port", str(port), "--api-key", "k", "--print-env", "--", "run", "-x", "a b")
    assert r.exit_code == 0, r.output
    *assignments, command = r.stdout.splitlines()
    env = {k: shlex.split(v)[0] for k, v in (line.split("=", 1) for line in assignments)}
    argv = shlex.split(command)
    name, url = "My-Model.Q4_K_M", f"http://127.0.0.1:{port}"
    assert argv[0] == agent and argv[-3:] == ["run", "-x", "a b"]
    if agent == "claude":
        assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_AUTH_TOKEN"] == "k" and env["ANTHROPIC_MODEL"] == name
        assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == name and argv == ["claude", "run", "-x", "a b"]
    elif agent == "codex":
        assert env == {"OPENAI_BASE_URL": url + "/v1", "OPENAI_API_KEY": "k"}
        assert argv[1:5] == ["-c", f'model="{name}"', "-c", 'model_provider="infer"']
        assert argv[6].startswith("model_providers.infer={") and f'base_url = "{url}/v1"' in argv[6]
    else:
        config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
        assert config["provider"]["infer"]["options"] == {"baseURL": url + "/v1", "apiKey": "k"}
        assert config["model"] == f"infer/{name}" and argv == ["opencode", "run", "-x", "a b"]
    assert refused(port)  # nothing started


def test_a_missing_agent_is_one_line_naming_its_installer(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    port = free_port()
    for agent, installer in (("claude", "npm install -g @anthropic-ai/claude-code"),
                             ("codex", "npm install -g @openai/codex"), ("opencode", "npm install -g opencode-ai")):
        r = invoke(agent, "--port", str(port), PATH=str(empty), HOME=str(tmp_path))
        assert r.exit_code == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {agent} (") and installer in lines[0], r.stderr
        assert refused(port)  # no server started for nothing


def test_an_unknown_agent_is_refused():
    r = invoke("cursor", "--print-env")
    assert r.exit_code == 2 and "AGENT takes claude, codex, opencode, got 'cursor'" in r.stderr


class Impostor(http.server.BaseHTTPRequestHandler):
    """Something else on the port: llama-server's model list, or an API key wanted."""

    def do_GET(self):
        if self.headers.get("Authorization") == "Bearer wanted":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "llamacpp"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_a_port_held_by_another_server_is_refused():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        r = invoke("claude", "--port", str(port), "--print-env")
        assert r.exit_code == 1
        assert r.stderr.strip() == (f"error: http://127.0.0.1:{port} answers, but not as infer serve: stop what runs "
                                    f"there, or launch with another --port")
        r = invoke("codex", "--port", str(port), "--api-key", "wanted", "--print-env")
        assert r.exit_code == 1 and "rejects --api-key" in r.stderr
    finally:
        srv.shutdown()
        srv.server_close()


def test_pick_model():
    from infer.cli.launch import LaunchError, pick_model

    served = ["SmolLM2-135M-Instruct.Q4_1", "bartowski/Qwen3-0.6B-GGUF:Q4_K_M"]
    assert pick_model(served, None, "u") == served[0]  # several models: the default, listed first
    assert pick_model(served, "bartowski/Qwen3-0.6B-GGUF:Q4_K_M", "u") == served[1]
    assert pick_model(["gemma-3-270m-q4_k_m"], "/models/gemma-3-270m-q4_k_m.gguf", "u") == "gemma-3-270m-q4_k_m"
    with pytest.raises(LaunchError, match="does not serve other/model"):
        pick_model(served, "other/model", "u")
    with pytest.raises(LaunchError, match="serves no model"):
        pick_model([], None, "u")


def test_client_url():
    from infer.cli.launch import client_url

    assert client_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert client_url("::", 8080) == "http://[::1]:8080"
    assert client_url("fe80::1", 1) == "http://[fe80::1]:1"
    assert client_url("example.lan", 80) == "http://example.lan:80"
