"""The shape an error takes on a path: ollama's, Anthropic's, llama-server's or OpenAI's.  One place
for the front door (401), the router (an unknown model, a full queue) and the app's handlers (404,
405, a bug of ours), so a client always reads its own API's error."""
from __future__ import annotations

from starlette.responses import JSONResponse, Response

from . import anthropic_api
from .llama_api import LLAMA_PATHS, llama_error
from .openai_request import APIError

__all__ = ["error_response"]


def error_response(path: str, e: APIError) -> Response:
    if path.startswith("/api/"):
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
    if path.startswith(anthropic_api.PREFIX):
        return anthropic_api.error_response(e)
    if path.startswith(LLAMA_PATHS):
        return llama_error(e)
    return e.response()
