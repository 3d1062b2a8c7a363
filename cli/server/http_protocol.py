"""The HTTP/1.1 connection of `infer serve`: uvicorn's h11 protocol with a deadline on each request.

uvicorn closes a keep-alive connection that stays idle after a response (5 s), but nothing bounds
a client that connects and then sends its request slowly or not at all: a slow-loris client trickling
its headers, or a body that never ends, would hold its socket (and a request's handler) for ever.
Each such connection costs one file descriptor and no thread (asyncio), so they never block other
clients by themselves; the deadline makes sure they also cannot pile up until descriptors run out.

The rule, as llama-server's `--timeout`: a request must arrive whole (head and body) within
`request_timeout` seconds of the moment the server starts waiting for it (the connection opened, or
the previous response ended).  Past that the connection is closed; a handler already reading the
body sees the client gone (a disconnect), as if the client had left.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds; a whole request over a slow link (8 MiB at ~1 Mbit/s) fits


class TimedH11Protocol(H11Protocol):
    """H11Protocol with the request deadline; uvicorn builds one per connection (Config(http=...)).

    `request_timeout` is a class attribute because uvicorn instantiates the class itself: for_timeout()
    makes a subclass carrying the configured value, so nothing global is changed."""

    request_timeout = DEFAULT_REQUEST_TIMEOUT

    @classmethod
    def for_timeout(cls, seconds: float) -> type["TimedH11Protocol"]:
        return type(cls.__name__, (cls,), {"request_timeout": float(seconds)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.request_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self.watch_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.watch_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.watch_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        super().connection_lost(exc)

    def watch_request(self) -> None:
        """Arm the deadline while the client owes us a request (h11's IDLE: no head yet; SEND_BODY:
        the body is still coming); disarm it once the request is whole."""
        waiting = self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing()
        if waiting and self.request_deadline is None:
            self.request_deadline = self.loop.call_later(self.request_timeout, self.request_timed_out)
        elif not waiting:
            self.cancel_deadline()

    def cancel_deadline(self) -> None:
        if self.request_deadline is not None:
            self.request_deadline.cancel()
            self.request_deadline = None

    def request_timed_out(self) -> None:
        self.request_deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            # Closing makes uvicorn mark a running request's cycle disconnected: its handler's next
            # receive() is an http.disconnect, which every route already treats as a client gone.
            self.transport.close()


def raise_open_files_limit() -> int:
    """Lift the soft limit on open files to the hard one (Linux's default soft limit, 1024, is what
    a few hundred idle connections plus the model's files would otherwise hit); the new limit."""
    try:
        import resource  # Unix only
    except ImportError:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            return soft
    return soft
