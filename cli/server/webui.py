"""The chat page that `infer serve` shows a browser at GET /: plain HTML, CSS and JS shipped in the
package (cli/server/webui/), no build step and nothing fetched from elsewhere, so it works offline. The
page talks to the server's own /v1 routes like any other client."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

# Model output is rendered in this page: the policy is the second wall behind the page's own
# textContent-only rendering, so an injected <script> or inline handler could not run anyway.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'none'")
ASSETS = (("app.js", "text/javascript; charset=utf-8"), ("style.css", "text/css; charset=utf-8"))


@lru_cache(maxsize=None)
def asset(name: str) -> bytes:
    """One file of cli/server/webui, read once: the files do not change while the server runs."""
    return resources.files("infer.cli.server").joinpath("webui").joinpath(name).read_bytes()


def _headers() -> dict[str, str]:
    # no-cache (revalidate, not "never store"): a new version of infer shows its new page at once
    return {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def is_browser(request: Request) -> bool:
    """A browser asks for HTML; API clients (ollama's probe of GET /, curl) do not."""
    return "text/html" in request.headers.get("accept", "").lower()


def index_response() -> Response:
    # X-Frame-Options: the page holds an API key and a send button, not for framing by other sites
    return HTMLResponse(asset("index.html"), headers={**_headers(), "Content-Security-Policy": CSP,
                                                      "X-Frame-Options": "DENY"})


def _static(name: str, media_type: str):
    async def endpoint(request: Request) -> Response:
        return Response(asset(name), media_type=media_type, headers=_headers())
    return endpoint


def page_routes(enabled: bool, api_root) -> list[Route]:
    """GET / (the page for a browser, else api_root's answer: ollama's clients probe GET /) and the
    page's scripts and styles at /webui/<name>; with the page off (--no-webui), GET / is api_root's."""
    if not enabled:
        return [Route("/", api_root, methods=["GET", "HEAD"])]

    async def root(request: Request) -> Response:
        return index_response() if is_browser(request) else await api_root(request)

    return [Route("/", root, methods=["GET", "HEAD"]),
            *(Route(f"/webui/{name}", _static(name, media_type), methods=["GET"]) for name, media_type in ASSETS)]
