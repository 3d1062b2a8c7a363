"""llama.cpp's server routes /tokenize and /detokenize (its request and response shapes), for the
served model's vocabulary."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .openai_request import APIError, bool_field, kind, text_field
from .service import Service


class TokenizeAPI:
    def __init__(self, service: Service):
        self.service = service
        self.tokenizer = service.llm.tokenizer

    async def tokenize(self, request: Request) -> Response:
        """{"content", "add_special" (false), "parse_special" (true), "with_pieces" (false)} ->
        {"tokens": [id, ...]} or, with pieces, [{"id", "piece"}] (the piece as text, or its bytes
        where it is not whole UTF-8), as llama.cpp's server answers."""
        try:
            body = await self.service.body(request)
            content = body.get("content")
            if not isinstance(content, str):
                raise APIError(400, f"'content' must be a string, got {kind(content)}", "content", "invalid_type")
            parse_special = body.get("parse_special", True)
            if not isinstance(parse_special, bool):
                raise APIError(400, "'parse_special' must be true or false", "parse_special", "invalid_type")
            add_special = bool_field(body, "add_special")
            ids = await self.service.encode(  # in a worker thread: a long text takes a while
                lambda t: self.tokenizer.encode(t, add_special=add_special, parse_special=parse_special),
                text_field(content, "content"))
            if not bool_field(body, "with_pieces"):
                return JSONResponse({"tokens": ids})
        except APIError as e:
            return e.response()
        pieces = []
        for t in ids:
            b = self.tokenizer.token_to_piece(t, special=True)
            try:
                piece: object = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            pieces.append({"id": t, "piece": piece})
        return JSONResponse({"tokens": pieces})

    async def detokenize(self, request: Request) -> Response:
        """{"tokens": [id, ...]} -> {"content": text} (special tokens spelled out, as llama.cpp's)."""
        try:
            body = await self.service.body(request)
            ids = body.get("tokens")
            vocab = self.tokenizer.vocab_size
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise APIError(400, "'tokens' must be an array of token ids", "tokens", "invalid_type")
            if not all(0 <= t < vocab for t in ids):
                raise APIError(400, f"'tokens' must be ids in [0, {vocab})", "tokens", "invalid_value")
        except APIError as e:
            return e.response()
        return JSONResponse({"content": self.tokenizer.decode(ids, special=True)})
