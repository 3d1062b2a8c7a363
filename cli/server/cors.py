"""CORS as llama-server answers it (its tests/unit/test_security.py): which browser origins may read
the server's answers.  An allowed origin is reflected, with credentials allowed; a preflight
(OPTIONS with Access-Control-Request-Method) is answered 200 whatever the origin, the
Access-Control-* headers only for an allowed one, so a page of another origin learns nothing.

--cors values: "*" any origin; "localhost" the loopback origins (http or https, localhost,
127.0.0.1 or [::1], any port), llama-server's --cors-origins localhost; anything else an exact
origin.  No --cors: the loopback origins (ollama's default, and llama-server's once its tools are on),
so a web UI on another local port works and a page from the internet cannot drive the model.
"""
from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOCALHOST = "localhost"
# llama-server's Access-Control-Allow-Methods
METHODS = "GET, POST, DELETE, OPTIONS"
_LOOPBACK = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?")


class Cors:
    """ASGI middleware: the CORS headers for the allowed origins (see the module's docstring)."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...] = ()):
        self.app = app
        self.any = "*" in origins
        self.localhost = LOCALHOST in origins or not origins
        self.exact = frozenset(origins) - {"*", LOCALHOST}

    def allowed(self, origin: str) -> bool:
        return self.any or origin in self.exact or (self.localhost and _LOOPBACK.fullmatch(origin) is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            return await self.app(scope, receive, send)
        ok = self.allowed(origin)
        cors = {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
                "Vary": "Origin"} if ok else {"Vary": "Origin"}
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            if ok:
                cors |= {"Access-Control-Allow-Methods": METHODS, "Access-Control-Allow-Headers": "*",
                         "Access-Control-Max-Age": "600"}
            return await PlainTextResponse("OK", headers=cors)(scope, receive, send)

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start" and ok:
                raw = [(k, v) for k, v in message.get("headers", [])
                       if k.lower() not in (b"access-control-allow-origin", b"access-control-allow-credentials")]
                raw += [(k.lower().encode(), v.encode()) for k, v in cors.items()]
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, with_cors)
