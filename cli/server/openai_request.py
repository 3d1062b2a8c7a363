"""The fields of an OpenAI request, checked and turned into what the engine takes.

The request body's fields are validated here, with OpenAI's error shape for what is wrong
(APIError); what needs the loaded model or the server's state (the model name, the body's size,
the prompt's length against the context, a full queue) the service (service.py) checks, raising
the same APIError.  Where the engine has the rule (SamplingParams: the sampling fields and the
stop strings), this module only translates the field's shape and the engine's InferError becomes
the APIError, its `field` the error's param.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from infer.engine.grammar import Grammar, GrammarError
from infer.engine.sampler import InvalidSamplingParams, SamplingParams

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 16  # stop strings one request may give (OpenAI allows 4; llama.cpp's server any number)
MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI reports impossible tokens as -9999
# the choices one request may get (n, times the prompts of a /v1/completions request): they run
# at once, each its own sequence, so they are bounded (llama-server bounds n by --parallel)
MAX_CHOICES = 16



@dataclass(frozen=True)
class NumberField:
    """A numeric request field: its JSON type, read by the validators here and in ollama_api.py, and
    its range, which SamplingParams (engine/sampler.py) enforces and /openapi.json (openapi.py)
    documents from this table."""

    name: str
    type: str = "number"  # or "integer"
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # the exclusive minimum
    description: str | None = None


# the sampling fields of OpenAI's requests (and ollama's options), as SamplingParams names them
SAMPLING_FIELDS = (
    NumberField("temperature", minimum=0, description="0: greedy."),
    NumberField("top_p", above=0, maximum=1, description="1: off."),
    NumberField("top_k", "integer", minimum=0, description="0: off."),
    NumberField("min_p", minimum=0, maximum=1, description="0: off."),
    NumberField("presence_penalty"),
    NumberField("frequency_penalty"),
    NumberField("repeat_penalty", above=0, description="llama.cpp's; 1: off."),
)


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, strictly: Python's parser also takes NaN and Infinity, which JSON
    does not have (and which would reach the sampler or keep_alive as numbers)."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON value")

    try:
        return json.loads(raw, parse_constant=constant)
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, absurd nesting
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise APIError(400, f"the request body is not valid JSON: {msg}"[:300], None, "invalid_json") from None


class ClientGone(Exception):
    """The client disconnected while its request ran."""


class APIError(Exception):
    """A request the server refuses, rendered in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)




def present(body: dict, name: str) -> bool:
    return body.get(name) is not None  # OpenAI clients send null for "not set"


def number_field(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise APIError(400, f"'{name}' must be a number, got {kind(v)}", name, "invalid_type")
    return v


def int_field(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError(400, f"'{name}' must be an integer, got {kind(v)}", name, "invalid_type")
    return v


def bool_field(body: dict, name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise APIError(400, f"'{name}' must be true or false, got {kind(v)}", name, "invalid_type")
    return v


def kind(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(type(v), type(v).__name__)


def text_field(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"'{param}' is not valid Unicode (it has a lone surrogate)", param,
                       "invalid_value") from None
    return value


def stop_strings(v: Any, param: str) -> tuple:
    """A stop field's shape, as OpenAI and ollama take it: one string or an array; what each item
    must be is SamplingParams' rule (engine/sampler.py), checked there."""
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list):
        raise APIError(400, f"'{param}' must be a string or an array of strings, got {kind(v)}", param, "invalid_type")
    return tuple(v)


def grammar_field(body: dict) -> tuple[Grammar | None, str | None]:
    """What the output must follow: OpenAI's response_format (json_object, json_schema; llama.cpp
    also takes a "schema" beside json_object), or llama.cpp's extra fields grammar (GBNF) and
    json_schema; at most one of them.  Returns it and the field it came from.  Only the syntax is
    checked here: compiling is the route's."""
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise APIError(400, "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                           "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}", "response_format",
                           "invalid_value")
        if fmt["type"] == "text":
            fmt = None
    given = [n for n, v in (("response_format", fmt), ("grammar", body.get("grammar")),
                            ("json_schema", body.get("json_schema"))) if v is not None]
    if len(given) > 1:
        raise APIError(400, f"{' and '.join(repr(n) for n in given)} cannot be combined: give one", given[1],
                       "invalid_value")
    if not given:
        return None, None
    param = given[0]
    return _grammar(body, fmt, param), param


def _grammar(body: dict, fmt: dict | None, param: str) -> Grammar:
    try:
        if param == "grammar":
            g = body["grammar"]
            if not isinstance(g, str):
                raise APIError(400, f"'grammar' must be a GBNF grammar as a string, got {kind(g)}", param, "invalid_type")
            return Grammar("gbnf", text_field(g, param))
        if param == "json_schema":
            return Grammar.json_schema(body["json_schema"])
        if fmt["type"] == "json_object":
            return Grammar("json") if fmt.get("schema") is None else Grammar.json_schema(fmt["schema"])
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError(400, "'response_format.json_schema' must be an object with a 'schema'",
                           "response_format", "invalid_type")
        schema = spec.get("schema")
        return Grammar("json") if schema is None else Grammar.json_schema(schema)
    except GrammarError as e:
        raise APIError(400, str(e), param, "invalid_value") from None


@dataclass(frozen=True)
class Job:
    """A validated generation request, not yet tokenized."""

    params: SamplingParams
    max_tokens: int | None  # None: up to the end of the context
    stream: bool
    include_usage: bool
    logprobs: bool
    grammar_param: str | None = None  # the field params.grammar came from (for errors)
    n: int = 1  # choices for each prompt, each its own sequence (its seed params.seed + its index)


def parse_job(body: dict, logprobs_k: int | None, tokenizer: Any = None) -> Job:
    """The fields chat and completions share, checked and turned into SamplingParams; tokenizer: the
    model's, for logit_bias (without one, a logit_bias is refused)."""
    n = int_field(body, "n")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise APIError(400, f"'n' must be between 1 and {MAX_CHOICES}, got {n}", "n", "invalid_value")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise APIError(400, f"'user' must be a string, got {kind(body['user'])}", "user", "invalid_type")
    bias: tuple = ()
    if body.get("logit_bias"):
        if tokenizer is None:
            raise APIError(400, "'logit_bias' is not supported", "logit_bias", "unsupported_parameter")
        bias = logit_bias_field(body["logit_bias"], tokenizer)
    stream = bool_field(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise APIError(400, f"'stream_options' must be an object, got {kind(opts)}", "stream_options",
                           "invalid_type")
        if not stream:
            raise APIError(400, "'stream_options' is only allowed with 'stream': true", "stream_options",
                           "invalid_value")
        include_usage = bool_field(opts, "include_usage")
    max_tokens = int_field(body, "max_completion_tokens")
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = int_field(body, "max_tokens"), "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"'{name}' must be at least 1, got {max_tokens}", name, "invalid_value")
    seed = int_field(body, "seed")
    if seed is not None and not 0 <= seed < 2**64:
        raise APIError(400, f"'seed' must be between 0 and 2**64 - 1, got {seed}", "seed", "invalid_value")
    # ignore_eos is llama.cpp's extension, for benchmarks that need a fixed number of tokens
    stop = stop_strings(body.get("stop"), "stop")
    if len(stop) > MAX_STOP:
        raise APIError(400, f"'stop' takes at most {MAX_STOP} strings, got {len(stop)}", "stop", "invalid_value")
    kw: dict[str, Any] = {"stop": stop, "seed": seed, "logprobs": logprobs_k,
                          "ignore_eos": bool_field(body, "ignore_eos"), "logit_bias": bias}
    kw["grammar"], grammar_param = grammar_field(body)
    for f in SAMPLING_FIELDS:
        v = (int_field if f.type == "integer" else number_field)(body, f.name)
        if v is not None:
            kw[f.name] = v
    try:
        params = SamplingParams(**kw)
    except InvalidSamplingParams as e:
        raise APIError(400, str(e), e.field, "invalid_value") from None
    return Job(params, max_tokens, stream, include_usage, logprobs_k is not None, grammar_param, n or 1)


def logit_bias_field(value: Any, tokenizer: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias in OpenAI's form ({"<token id>": bias}) or llama-server's ([[id, bias], ["text",
    bias], [id, false]], and {"text": bias}): false bans the token; a text biases each token of its
    tokenization (no BOS, special tokens as plain text), as llama-server does.  The (id, bias) pairs
    for SamplingParams.  Unlike llama-server, which skips them, an id outside the vocabulary or a bias
    that is neither a number nor false is a 400."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for i, el in enumerate(value):
            if not (isinstance(el, list) and len(el) == 2 and isinstance(el[0], (str, int)) and not isinstance(
                    el[0], bool)):
                raise APIError(400, f"'logit_bias[{i}]' must be a [token id or text, bias] pair, got {kind(el)}",
                               "logit_bias", "invalid_value")
            items.append((el[0], el[1]))
    else:
        raise APIError(400, f"'logit_bias' must be an object or an array of [token, bias] pairs, got {kind(value)}",
                       "logit_bias", "invalid_type")
    vocab = tokenizer.vocab_size
    out: list[tuple[int, float]] = []
    for key, b in items:
        if b is False:
            bias = float("-inf")
        elif isinstance(b, (int, float)) and not isinstance(b, bool):
            bias = b
        else:
            raise APIError(400, f"a logit bias must be a number or false (never), got {kind(b)} for {str(key)[:50]!r}",
                           "logit_bias", "invalid_value")
        if isinstance(key, str) and key.lstrip("-").isdigit() and key.isascii():
            key = int(key)  # OpenAI's keys are token ids written as strings
        if isinstance(key, int):
            if not 0 <= key < vocab:
                raise APIError(400, f"'logit_bias' token ids must be in [0, {vocab}), got {key}", "logit_bias",
                               "invalid_value")
            out.append((key, bias))
        else:
            ids = tokenizer.encode(text_field(key, "logit_bias"), add_special=False, parse_special=False)
            out += [(t, bias) for t in ids]
    return tuple(out)


def chat_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' must be a non-empty array of {role, content} objects", "messages",
                       "invalid_value" if isinstance(msgs, list) else "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(400, f"'{p}' must be an object with 'role' and 'content', got {kind(m)}", p, "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise APIError(400, f"'{p}.role' must be one of {', '.join(CHAT_ROLES)}, got {role!r}"[:300],
                           f"{p}.role", "invalid_value")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""  # an assistant turn that only called tools
        elif isinstance(content, list):  # content parts: only text is understood
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise APIError(400, f"'{p}.content' parts must be {{\"type\": \"text\", \"text\": ...}}: "
                                   "this server reads text only", f"{p}.content", "invalid_value")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif not isinstance(content, str):
            raise APIError(400, f"'{p}.content' must be a string or an array of text parts, got {kind(content)}",
                           f"{p}.content", "invalid_type")
        msg = {"role": "system" if role == "developer" else role, "content": text_field(content, f"{p}.content")}
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
        if role == "assistant" and m.get("reasoning_content") is not None:
            # an earlier turn's thinking, as llama-server takes it back: the thinking models'
            # templates (Qwen3, GLM-4.5, DeepSeek V3.1, ...) decide whether to show it again
            if not isinstance(m["reasoning_content"], str):
                raise APIError(400, f"'{p}.reasoning_content' must be a string, got {kind(m['reasoning_content'])}",
                               f"{p}.reasoning_content", "invalid_type")
            msg["reasoning_content"] = text_field(m["reasoning_content"], f"{p}.reasoning_content")
        if role == "tool" and m.get("tool_call_id") is not None:
            if not isinstance(m["tool_call_id"], str):
                raise APIError(400, f"'{p}.tool_call_id' must be a string", f"{p}.tool_call_id", "invalid_type")
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out  # the engine's rules (chat_template.validate_messages) hold already: checked once, here



def _tool_calls(calls: Any, p: str) -> list[dict]:
    """An assistant message's earlier tool calls, as OpenAI sends them."""
    if not isinstance(calls, list):
        raise APIError(400, f"'{p}' must be an array, got {kind(calls)}", p, "invalid_type")
    out = []
    for i, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments", ""),
                                                                                      (str, dict)):
            raise APIError(400, f"'{p}[{i}]' must be {{\"id\", \"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\"}}", f"{p}[{i}]", "invalid_value")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": f["name"], "arguments": f.get("arguments", "")}})
    return out


async def disconnected(receive) -> None:
    """Returns when the client disconnects: once the body is read, receive() says nothing else
    (a broken connection is a gone client too)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        pass
