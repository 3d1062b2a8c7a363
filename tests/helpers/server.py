"""The real `infer serve` in a subprocess, for the tests that talk to it over HTTP: Server starts
one on a free port and waits until /health answers; raw sends one request as no well-behaved
client would (chunked bodies, broken JSON); metrics and wait_idle read /metrics."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

MODEL = "gemma-3-270m-q4_k_m"  # the name the embedded Gemma is served by
HELLO = [{"role": "user", "content": "Name three colours."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, gemma_path, tmp_path, *args: str, env_extra: dict | None = None):
        self.port = free_port()
        self.log = open(tmp_path / f"serve-{self.port}.log", "w+")
        env = dict(os.environ, HF_HUB_OFFLINE="1", INFER_HOME=os.environ.get("INFER_HOME", ""))
        env.update(env_extra or {})
        if not env["INFER_HOME"]:
            del env["INFER_HOME"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infer.cli", "serve", *([str(gemma_path)] if gemma_path else []), "--port",
             str(self.port), *args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 300  # the first run on a machine compiles the kernels
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"infer serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if raw(self.port, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.proc.kill()  # not left running (and holding its port) after the error
                self.proc.wait()
                raise RuntimeError(f"infer serve did not come up:\n{self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def raw(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
        chunked: bool = False, timeout: float = 60) -> tuple[int, dict, object]:
    """One HTTP request; (status, headers, the JSON body or the text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if chunked:
            conn.putrequest(method, path)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, len(body), 16384):
                piece = body[i:i + 16384]
                conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data.decode("utf-8", "replace")
        return resp.status, dict(resp.getheaders()), parsed
    finally:
        conn.close()


def metrics(port: int) -> dict[str, float]:
    status, _, text = raw(port, "GET", "/metrics")
    assert status == 200
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([-\d.e+]+)$", text, re.M)}


def wait_idle(port: int, timeout: float = 10) -> dict[str, float]:
    """Metrics once nothing runs and no KV block is held (or the last ones seen, at the timeout)."""
    deadline = time.time() + timeout
    while True:
        m = metrics(port)
        idle = m["infer_kv_blocks_used"] == 0 and m["infer_requests_running"] == 0 and m["infer_requests_waiting"] == 0
        if idle or time.time() > deadline:
            return m
        time.sleep(0.05)
