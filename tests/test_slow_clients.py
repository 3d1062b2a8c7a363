"""Slow and idle clients (slow-loris) against `infer serve`: they never block others, and --timeout
closes them (cli/server/http_protocol.py)."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from helpers.server import HELLO, raw, wait_idle

TIMEOUT = 1.0  # --timeout of the server under test: seconds a client has to send a whole request


@pytest.fixture(scope="module")
def server_args():
    return ("--timeout", str(TIMEOUT), "--parallel", "2", "--ctx", "512", "--threads", "2")


def connect(port: int, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    if first:
        s.sendall(first)
    return s


def closed_by_server(s: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset), reading whatever it sent."""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def read_until(s: socket.socket, done, started: float) -> bytes:
    """What the server sends until done(everything so far) holds; fails if it closes first."""
    data = b""
    while not done(data):
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {time.monotonic() - started:.1f}s: {data[-200:]!r}"
        data += chunk
    return data


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_slow_and_idle_clients_do_not_block_others_and_are_closed(server):
    port = server.port
    before = open_fds(server.proc.pid)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    silent = [connect(port) for _ in range(150)]  # connect, then nothing
    partial = [connect(port, head) for _ in range(100)]  # a head that never ends
    body = json.dumps({"messages": HELLO, "max_tokens": 4}).encode()
    trickle = [connect(port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:5]) for _ in range(20)]
    started = time.monotonic()
    # Meanwhile a normal client is served as usual.
    status, _, reply = raw(port, "POST", "/v1/chat/completions",
                           json.dumps({"messages": HELLO, "max_tokens": 8, "temperature": 0}).encode(),
                           {"Content-Type": "application/json"})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"]
    # Keep trickling the heads and bodies a byte at a time: the deadline is on the whole request,
    # so activity does not extend it.
    while time.monotonic() - started < TIMEOUT * 0.75:
        for s in partial:
            s.sendall(b"X")
        for s in trickle:
            s.sendall(b" ")
        time.sleep(0.2)
    waited = time.monotonic()
    for s in silent + partial + trickle:
        s.settimeout(max(0.1, TIMEOUT + 8 - (time.monotonic() - waited)))
    assert all(closed_by_server(s) for s in silent + partial + trickle)
    for s in silent + partial + trickle:
        s.close()
    m = wait_idle(port)
    assert m["infer_requests_running"] == 0 and m["infer_kv_blocks_used"] == 0
    deadline = time.monotonic() + 10
    while open_fds(server.proc.pid) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_fds(server.proc.pid) <= before
    assert raw(port, "GET", "/health")[0] == 200


def test_a_request_sent_in_time_is_not_cut(server):
    """The deadline is on the request only: a reply that takes longer than --timeout to generate and
    stream is not cut, and a keep-alive connection serves several requests."""
    body = json.dumps({"messages": HELLO, "max_tokens": 400, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    s = connect(port := server.port)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    started = time.monotonic()
    read_until(s, lambda d: b"data: [DONE]" in d and d.endswith(b"\r\n0\r\n\r\n"), started)
    assert time.monotonic() - started > TIMEOUT  # else this test shows nothing: raise max_tokens
    # The whole chunked reply, its last (empty) chunk included, was read: what comes next on this
    # connection is the next reply's head.
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    head = read_until(s, lambda d: b"\r\n\r\n" in d, time.monotonic())
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    s.close()
    assert raw(port, "GET", "/health")[0] == 200
