"""llama-server's unversioned names for OpenAI's routes (/chat/completions, /models, /responses):
the same routes under a second path, as llama-server and llama.cpp's clients have them.

An ASGI middleware outside the front door rewrites the path before anything reads it, so the API
key, the request counts, the model router and the routes see the /v1 path: one route, two names.
"""
from __future__ import annotations

from types import MappingProxyType

from starlette.types import ASGIApp, Receive, Scope, Send

# llama-server's path -> infer's route (llama-server's own /completions and /embeddings are its
# native API, not OpenAI's, and are left to the routes of that name).
UNVERSIONED = MappingProxyType({"/chat/completions": "/v1/chat/completions", "/models": "/v1/models",
                               "/responses": "/v1/responses"})


class UnversionedPaths:
    """ASGI middleware: the paths of UNVERSIONED served by their /v1 routes."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (target := UNVERSIONED.get(scope["path"])) is not None:
            scope = {**scope, "path": target, "raw_path": target.encode()}
        await self.app(scope, receive, send)
