"""The OpenAPI 3.1 document of `infer serve`'s HTTP APIs, served at GET /openapi.json.

Clients read it to generate bindings or to check what a field takes; tests/test_openapi.py loads
it into schemathesis and fuzzes the real server from it (every request must get a 2xx or a
well-formed 4xx), and checks that it names exactly the routes the apps have.  So the request
schemas say what the validators accept (openai_request.py, openai_chat.py, ollama_api.py,
embeddings_api.py, rerank_api.py, tokenize_api.py, the router's keep_alive), no more and no less where JSON
Schema can say it; what depends on the loaded model (the vocabulary's size, the context, whether a
chat template or a grammar takes the request) is in the descriptions and answered with a 400.

One document for both servers (one model: openai_server.py; several: model_router.py): they
have the same paths, and where they differ the descriptions say so.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infer.engine.reasoning import EFFORTS
from infer.engine.sampler import MAX_LOGPROBS, SamplingParams
from infer.engine.tool_calls import TOOL_NAME

from . import openapi_anthropic, openapi_llama, openapi_responses
from .embeddings_api import MAX_INPUTS
from .ollama_api import OPTION_FIELDS
from .ollama_api import OPTION_LIMIT as OLLAMA_LIMIT
from .openai_request import MAX_CHOICES, MAX_STOP, SAMPLING_FIELDS, NumberField
from .openapi_schema import BOOLEAN, INTEGER, NULL, STRING, json_content, nullable, number, obj, ref
from .openapi_schema import operation as schema_operation
from .rerank_api import ROUTES as RERANK_ROUTES

PARALLEL_TOOL_CALLS = MappingProxyType({"type": "boolean", "description": "Default: true; false where the chat "
                                        "template writes no tool calls (the generic format), as llama-server."})
STREAM = MappingProxyType({"type": "boolean", "default": True, "description": "ollama's routes stream by default."})
# streams, described without the schemas of their pieces: an SSE event (what the schema of a
# text/event-stream describes, as schemathesis reads it) and an NDJSON body as text
SSE = MappingProxyType({"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string", "description": "A chunk as JSON, then [DONE]; an error after the first chunk is "
                                              "an {\"error\": {...}} chunk."}}}}})
NDJSON = MappingProxyType({"application/x-ndjson": {"schema": {
    "type": "string", "description": "One JSON object a line; the last has done: true, or is an {\"error\": \"...\"}."}}})


def sampling_default(name: str) -> Any:
    """What the engine uses when a request leaves a sampling field out."""
    return SamplingParams.__dataclass_fields__[name].default


def field_schema(f: NumberField) -> dict:
    """A numeric field's schema, from the table the validators read."""
    return number(f.minimum, f.maximum, f.above, f.type, f.description)


# ---------------------------------------------------------------- request schemas


def _shared() -> dict:
    return {
        "Unset": {"description": "Any JSON false value (null, false, 0, \"\", [], {}): taken as absent. A field "
                                 "that only takes this is not supported, and anything else is a 400.",
                  "anyOf": [NULL, {"enum": [False, 0, ""]}, {"type": "array", "maxItems": 0},
                            {"type": "object", "maxProperties": 0}]},
        "JsonSchema": {"type": ["object", "boolean", "string"],
                       "description": "A JSON Schema the reply must follow: an object (or true / false), or the "
                                      "same as JSON text. One the grammar engine cannot compile is a 400."},
        "TextPart": obj({"type": {"const": "text"}, "text": STRING}, ("type", "text")),
        "MessageContent": {"anyOf": [STRING, {"type": "array", "items": ref("TextPart")}],
                           "description": "Text, or text parts (joined with newlines): this server reads text only."},
        "ToolCall": obj({"id": {"description": "Any value, sent back to the template as text."},
                         "type": {"description": "Ignored: every call is a function call."},
                         "function": obj({"name": STRING, "arguments": {
                             "type": ["string", "object"], "description": "JSON text or an object."}}, ("name",))},
                        ("function",), "A tool call of an earlier assistant turn."),
        "ChatMessage": {"anyOf": [
            obj({"role": {"enum": ["system", "developer", "user"]}, "content": ref("MessageContent")},
                ("role", "content"), "developer is read as system."),
            obj({"role": {"const": "assistant"}, "content": nullable(ref("MessageContent")),
                 "reasoning_content": nullable(STRING),
                 "tool_calls": nullable({"type": "array", "items": ref("ToolCall")})}, ("role",),
                "reasoning_content: the turn's thinking, for templates that show it again."),
            obj({"role": {"const": "tool"}, "content": ref("MessageContent"),
                 "tool_call_id": nullable(STRING)}, ("role", "content"))]},
        "Tool": obj({"type": {"const": "function"}, "function": obj({
            "name": {"type": "string", "pattern": TOOL_NAME},
            "description": STRING, "parameters": {"type": "object", "description": "A JSON Schema of the arguments."}},
            ("name",))}, ("function",), "Two tools may not have the same name."),
        "ToolChoice": {"anyOf": [
            {"enum": ["auto", "none", "required"]},
            obj({"type": {"const": "function"}, "function": obj({"name": STRING}, ("name",))}, ("type", "function"))],
            "description": "\"required\" needs tools; a named function must be one of the tools."},
        "Stop": {"anyOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1}}]},
    }


def _generation() -> dict:
    """What /v1/chat/completions and /v1/completions share (openai_request.parse_job)."""
    sampling = {f.name: field_schema(f) for f in SAMPLING_FIELDS}  # checked by SamplingParams
    bias = {"anyOf": [{"type": "number"}, {"const": False}]}
    fmt = {"anyOf": [
        obj({"type": {"const": "text"}}, ("type",)),
        obj({"type": {"const": "json_object"}, "schema": nullable(ref("JsonSchema"))}, ("type",),
            "Any JSON object, or one following schema (llama.cpp's extension)."),
        obj({"type": {"const": "json_schema"}, "json_schema": obj({"schema": nullable(ref("JsonSchema"))})},
            ("type", "json_schema"))]}
    return {"GenerationOptions": obj({
        "model": nullable({"type": "string", "description": "A name the server has for its model (GET /v1/models); "
                                                            "absent: the model loaded, else the default one."}),
        "max_tokens": nullable(number(1, kind="integer", description="Default: the rest of the context; past it, "
                                      "the reply ends at the context (finish_reason length).")),
        "max_completion_tokens": nullable(number(1, kind="integer", description="Read before max_tokens.")),
        **{name: nullable(schema, default=sampling_default(name)) for name, schema in sampling.items()},
        "seed": nullable(number(0, 2**64 - 1, kind="integer")),
        "stop": nullable(ref("Stop")),
        "stream": nullable(BOOLEAN, default=False),
        "stream_options": nullable(obj({"include_usage": nullable(BOOLEAN)}, description="Only with stream: true.")),
        "n": nullable(number(1, MAX_CHOICES, kind="integer", description="Choices per prompt; the request's "
                             f"choices (prompts times n) at most {MAX_CHOICES}.")),
        "user": nullable(STRING),
        "ignore_eos": nullable({"type": "boolean", "description": "Generate past end-of-generation tokens."}),
        "response_format": nullable(fmt),
        "grammar": nullable({"type": "string", "description": "A GBNF grammar (llama.cpp's syntax)."}),
        "json_schema": nullable(ref("JsonSchema")),
        "logit_bias": nullable({"anyOf": [
            {"type": "object", "additionalProperties": bias},
            {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                        "prefixItems": [{"anyOf": [number(0, kind="integer"), STRING]}, bias]}}],
            "description": "{\"<token id or text>\": bias} (OpenAI's form) or [[id or text, bias], ...] "
                           "(llama.cpp's); false bans the token; a text biases each of its tokens; ids below the "
                           "vocabulary's size."}),
    }, description="At most one of response_format (other than text), grammar and json_schema.")}


def _openai_requests() -> dict:
    ids = {"type": "array", "minItems": 1, "items": number(0, kind="integer"),
           "description": "Token ids, each below the vocabulary's size."}
    return {
        "ChatCompletionRequest": {"allOf": [ref("GenerationOptions"), obj({
            "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
            "logprobs": nullable(BOOLEAN),
            "top_logprobs": nullable(number(0, MAX_LOGPROBS, kind="integer", description="Needs logprobs: true.")),
            "tools": nullable({"type": "array", "items": ref("Tool")}),
            "tool_choice": nullable(ref("ToolChoice")),
            "parallel_tool_calls": PARALLEL_TOOL_CALLS,
            "reasoning_effort": nullable({"enum": list(EFFORTS),
                                          "description": "gpt-oss: how much it reasons (its template's variable)."}),
            "chat_template_kwargs": nullable({"type": "object", "not": {"anyOf": [
                {"required": ["messages"]}, {"required": ["add_generation_prompt"]}]},
                "description": "Variables for the chat template, e.g. {\"enable_thinking\": false} (Qwen3, "
                               "Qwen3.5)."}),
            "functions": ref("Unset"),
        }, ("messages",), "The chat template must accept the conversation.")]},
        "CompletionRequest": {"allOf": [ref("GenerationOptions"), obj({
            "prompt": {"anyOf": [STRING, ids, {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
                                               "items": {"anyOf": [STRING, ids]}}],
                       "description": "A text or token ids, or an array of them: several prompts, their choices "
                                      "indexed prompt by prompt (prompts times n at most "
                                      f"{MAX_CHOICES})."},
            "logprobs": nullable(number(0, MAX_LOGPROBS, kind="integer")),
            "echo": {"enum": [False, None]},
            "best_of": {"enum": [1, None]},
            "suffix": ref("Unset"),
        }, ("prompt",))]},
        "EmbeddingRequest": obj({
            "model": nullable(STRING),
            "input": {"anyOf": [STRING, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": STRING},
                                ids, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": ids}],
                      "description": "Texts or token ids; each must fit the context."},
            "encoding_format": {"anyOf": [{"enum": ["float", "base64"]}, ref("Unset")], "default": "float"},
            "dimensions": {"type": "null", "description": "Not supported: a model's embeddings have its size."},
        }, ("input",)),
        "RerankRequest": {"anyOf": [obj({
            "model": nullable(STRING), "query": STRING,
            "documents": {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                          "items": {"anyOf": [STRING, obj({"text": STRING}, ("text",))]}},
            "top_n": nullable(number(1, kind="integer")), "return_documents": nullable(BOOLEAN, default=False),
        }, ("query", "documents"), "Jina's and Cohere's form."), obj({
            "model": nullable(STRING), "query": STRING,
            "texts": {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                      "items": {"anyOf": [STRING, obj({"text": STRING}, ("text",))]}},
            "top_n": nullable(number(1, kind="integer")), "return_text": nullable(BOOLEAN, default=False),
        }, ("query", "texts"), "TEI's form (a body with texts).")],
            "description": "The model must be a reranker (its file's pooling_type rank); each document with the "
                           "query must fit the context."},
        "TokenizeRequest": obj({
            "content": STRING, "add_special": nullable(BOOLEAN, default=False),
            "parse_special": {"type": "boolean", "default": True}, "with_pieces": nullable(BOOLEAN, default=False),
            "model": nullable({"type": "string", "description": "Several-models server: the model whose vocabulary; "
                                                                 "one-model server: ignored."})}, ("content",)),
        "DetokenizeRequest": obj({"tokens": {"type": "array", "items": number(0, kind="integer")},
                                  "model": nullable(STRING)}, ("tokens",)),
    }


def _ollama_requests() -> dict:
    limit = {"minimum": -OLLAMA_LIMIT, "maximum": OLLAMA_LIMIT}

    def opt(f: NumberField) -> dict:
        schema = field_schema(f)
        merged = {**limit, **schema}
        if "exclusiveMinimum" in schema:
            del merged["minimum"]
        return nullable(merged, default=sampling_default(f.name))

    named = {"allOf": [ref("OllamaModel")]}
    keep_alive = {"type": ["number", "string", "null"],
                  "description": "Seconds, or a duration such as \"5m\" or \"1h30m\"; negative: forever; 0: unload "
                                 "once idle (several-models server; a one-model server ignores it)."}
    generation = {"options": nullable(ref("OllamaOptions")), "stream": STREAM, "keep_alive": keep_alive,
                  "format": {"anyOf": [{"enum": ["json", "", None]}, {"type": "object",
                                                                      "description": "A JSON Schema."}]}}
    return {
        "OllamaModel": obj({"model": {"type": "string", "minLength": 1},
                            "name": {"description": "Older clients' spelling, read when model is absent."}},
                           anyOf=[{"required": ["model"]},
                                  {"required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}}]),
        "OllamaOptions": obj({
            **{f.name: opt(f) for f in OPTION_FIELDS},
            "stop": nullable({"anyOf": [{"type": "string", "minLength": 1},
                                        {"type": "array", "items": {"type": "string", "minLength": 1}}]}),
            "num_predict": nullable({"type": "integer", "description": "<= 0: up to the end of the context."}),
            "num_ctx": nullable({"type": "integer", "minimum": 1, "description": "Ignored: the server's --ctx holds."}),
        }, description="Other options are ignored."),
        "OllamaChatMessage": {"allOf": [ref("ChatMessage"), obj({"images": ref("Unset")})]},
        "OllamaChatRequest": {**named, **obj({
            **generation, "messages": nullable({"type": "array", "items": ref("OllamaChatMessage"),
                                                "description": "Empty: loads the model and answers done_reason "
                                                               "\"load\"."}),
            "think": {"anyOf": [BOOLEAN, NULL, {"enum": list(EFFORTS)}],
                      "description": "A level is gpt-oss's reasoning effort."}, "tools": nullable({"type": "array", "items": ref("Tool")}),
            "tool_choice": nullable(ref("ToolChoice")), "parallel_tool_calls": PARALLEL_TOOL_CALLS})},
        "OllamaGenerateRequest": {**named, **obj({
            **generation, "prompt": {"type": "string", "description": "Empty: loads the model."},
            "system": nullable(STRING), "raw": {"type": "boolean", "default": False},
            "suffix": ref("Unset"), "images": ref("Unset"), "context": ref("Unset")})},
        "OllamaEmbedRequest": {**named, **obj({
            "input": {"anyOf": [STRING, {"type": "array", "maxItems": MAX_INPUTS, "items": STRING}]},
            "truncate": {"type": "boolean", "default": True, "description": "Inputs past the context are cut (false: a 400)."},
            "dimensions": ref("Unset"), "keep_alive": keep_alive})},
        "OllamaEmbeddingsRequest": {**named, **obj({"prompt": STRING, "keep_alive": keep_alive})},
        "OllamaShowRequest": {**named, **obj({"keep_alive": keep_alive})},
        "OllamaPullRequest": {**named, **obj({"stream": STREAM})},
    }


# ---------------------------------------------------------------- response schemas


def _openai_responses() -> dict:
    integer, count = INTEGER, number(0, kind="integer")
    alternative = {"token": STRING, "logprob": {"type": "number"}, "bytes": {"type": "array", "items": INTEGER}}
    token_logprob = obj({**alternative, "top_logprobs": {"type": "array", "items": obj(alternative)}})
    finish = {"enum": ["stop", "length", "tool_calls", "cancelled"]}
    head = {"id": STRING, "created": integer, "model": STRING, "system_fingerprint": STRING}
    call = obj({"id": STRING, "type": {"const": "function"},
                "function": obj({"name": STRING, "arguments": STRING}, ("name", "arguments"))})
    message = obj({"role": {"const": "assistant"}, "content": {"type": ["string", "null"]}, "refusal": NULL,
                   "reasoning_content": STRING, "tool_calls": {"type": "array", "items": call}}, ("role", "content"))
    completion_lps = obj({"tokens": {"type": "array", "items": STRING},
                          "token_logprobs": {"type": "array", "items": {"type": "number"}},
                          "top_logprobs": {"type": "array", "items": {"type": "object"}},
                          "text_offset": {"type": "array", "items": INTEGER}})
    return {
        "Usage": obj({"prompt_tokens": count, "completion_tokens": count, "total_tokens": count,
                      "prompt_tokens_details": obj({"cached_tokens": count})}),
        "ChatCompletion": obj({**head, "object": {"const": "chat.completion"}, "usage": ref("Usage"), "choices": {
            "type": "array", "items": obj({"index": integer, "message": message, "finish_reason": finish, "logprobs": {
                "anyOf": [NULL, obj({"content": {"type": "array", "items": token_logprob}, "refusal": NULL})]}},
                ("index", "message", "finish_reason"))}}, ("id", "object", "created", "model", "choices", "usage")),
        "Completion": obj({**head, "object": {"const": "text_completion"}, "usage": ref("Usage"), "choices": {
            "type": "array", "items": obj({"index": integer, "text": STRING, "finish_reason": finish,
                                           "logprobs": {"anyOf": [NULL, completion_lps]}},
                                          ("index", "text", "finish_reason"))}},
            ("id", "object", "created", "model", "choices", "usage")),
        "EmbeddingList": obj({"object": {"const": "list"}, "model": STRING, "usage": obj(
            {"prompt_tokens": count, "total_tokens": count}), "data": {"type": "array", "items": obj({
                "object": {"const": "embedding"}, "index": integer,
                "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}},
                                        {"type": "string", "description": "base64 of little-endian float32"}]}},
                ("object", "index", "embedding"))}}, ("object", "data", "model", "usage")),
        "Reranked": {"anyOf": [obj({
            "model": STRING, "object": {"const": "list"}, "usage": obj({"prompt_tokens": count, "total_tokens": count}),
            "results": {"type": "array", "items": obj({"index": integer, "relevance_score": {"type": "number"},
                                                       "document": obj({"text": STRING}, ("text",))},
                                                      ("index", "relevance_score"))}},
            ("model", "object", "usage", "results")), {"type": "array", "items": obj(
                {"index": integer, "score": {"type": "number"}, "text": STRING}, ("index", "score"))}],
            "description": "Best first: Jina's shape, or TEI's list for a request with texts."},
        "ModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": obj({
            "id": STRING, "object": {"const": "model"}, "created": integer, "owned_by": STRING,
            "context_length": {"type": "integer", "description": "When the model is loaded."}},
            ("id", "object", "created", "owned_by"))}}, ("object", "data")),
        "Tokens": obj({"tokens": {"type": "array", "items": {"anyOf": [INTEGER, obj(
            {"id": INTEGER, "piece": {"anyOf": [STRING, {"type": "array", "items": INTEGER}]}}, ("id", "piece"))]}}},
            ("tokens",), "Ids, or with with_pieces {id, piece}: the piece as text, or its bytes where not UTF-8."),
        "Detokenized": obj({"content": STRING}, ("content",)),
        "Health": obj({"status": {"const": "ok"}, "running": count, "waiting": count,
                       "model": {"type": "string", "description": "One-model server."},
                       "models": {"type": "array", "items": STRING, "description": "Several-models server: loaded."},
                       "loading": {"type": "array", "items": STRING}, "spec_drafted": count,
                       "spec_accepted": count, "spec_acceptance": {"type": ["number", "null"]}},
                      ("status", "running", "waiting")),
        "Error": obj({"error": obj({"message": STRING, "type": STRING, "param": {"type": ["string", "null"]},
                                    "code": {"type": ["string", "null"]}}, ("message", "type", "param", "code"))},
                     ("error",), "OpenAI's error shape."),
    }


def _ollama_responses() -> dict:
    count, time = number(0, kind="integer"), {"type": "string", "format": "date-time"}
    timings = {k: count for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                                  "eval_count", "eval_duration")}
    done = {"model": STRING, "created_at": time, "done": BOOLEAN,
            "done_reason": {"enum": ["stop", "length", "load", "unload"]}, **timings}
    call = obj({"function": obj({"name": STRING, "arguments": {"type": "object"}}, ("name", "arguments"))})
    details = obj({k: STRING for k in ("parent_model", "format", "family", "parameter_size", "quantization_level")}
                  | {"families": {"type": "array", "items": STRING}})
    entry = {"name": STRING, "model": STRING, "size": count, "modified_at": time, "digest": STRING, "details": details}
    return {
        "OllamaChatResponse": obj({**done, "message": obj({
            "role": {"const": "assistant"}, "content": STRING, "thinking": STRING,
            "tool_calls": {"type": "array", "items": call}}, ("role", "content"))}, ("model", "created_at", "message", "done")),
        "OllamaGenerateResponse": obj({**done, "response": STRING, "context": {"type": "array", "items": INTEGER}},
                                      ("model", "created_at", "response", "done")),
        "OllamaEmbedResponse": obj({"model": STRING, "embeddings": {"type": "array", "items": {
            "type": "array", "items": {"type": "number"}}}, **timings}, ("model", "embeddings")),
        "OllamaEmbeddingsResponse": obj({"embedding": {"type": "array", "items": {"type": "number"}}}, ("embedding",)),
        "OllamaTags": obj({"models": {"type": "array", "items": obj(entry, ("name", "model"))}}, ("models",)),
        "OllamaPs": obj({"models": {"type": "array", "items": obj({
            **entry, "expires_at": time, "size_vram": count, "context_length": count}, ("name", "model"))}}, ("models",)),
        "OllamaShow": obj({"modelfile": STRING, "parameters": STRING, "template": STRING, "details": details,
                           "capabilities": {"type": "array", "items": STRING}, "modified_at": time,
                           "model_info": {"type": "object"}}, ("details", "capabilities", "model_info")),
        "OllamaVersion": obj({"version": STRING}, ("version",)),
        "OllamaPullStatus": obj({"status": STRING}, ("status",)),
        "OllamaError": obj({"error": STRING}, ("error",), "ollama's error shape."),
    }


# ---------------------------------------------------------------- operations

# why each status comes, for every route that can answer it
WHY = MappingProxyType({400: "A request the server refuses: bad JSON, a wrong field, a prompt over the context.",
       401: "--api-key is set and the request's Bearer key is missing or wrong.",
       404: "The model named is not served here.",
       409: "The model is in use.",
       413: "The body is larger than --max-body.",
       503: "The queue is full (--max-queue): retry after Retry-After seconds."})


def operation(op_id: str, summary: str, ok: dict, request: str | None = None, errors: tuple[int, ...] = (),
              ollama: bool = False, secured: bool = True, ok_why: str = "OK") -> dict:
    """One operation, its errors in the route's shape (OpenAI's or ollama's)."""
    return schema_operation(op_id, summary, ok, request, errors, why=WHY, error="OllamaError" if ollama else "Error",
                            secured=secured, ok_why=ok_why)


def _openai_paths() -> dict:
    gen = (400, 404, 413, 503)
    return {
        "/v1/chat/completions": {"post": operation(
            "createChatCompletion", "A chat reply (OpenAI)", {**json_content(ref("ChatCompletion")), **SSE},
            "ChatCompletionRequest", gen, ok_why="The reply, or with stream: true its chunks as server-sent events")},
        "/v1/completions": {"post": operation(
            "createCompletion", "A text completion (OpenAI)", {**json_content(ref("Completion")), **SSE}, "CompletionRequest",
            gen, ok_why="The completion, or with stream: true its chunks as server-sent events")},
        "/v1/embeddings": {"post": operation("createEmbedding", "Embeddings (OpenAI)", json_content(ref("EmbeddingList")),
                                             "EmbeddingRequest", gen)},
        **{path: {"post": operation(op_id, "Documents scored against a query (llama.cpp's server; Jina, Cohere, "
                                          "TEI)", json_content(ref("Reranked")), "RerankRequest", gen)}
           for path, op_id in zip(RERANK_ROUTES, ("rerank", "rerankUnversioned", "reranking", "rerankingUnversioned"))},
        "/v1/models": {"get": operation("listModels", "The models a request may name", json_content(ref("ModelList")))},
        "/tokenize": {"post": operation("tokenize", "Text to token ids (llama.cpp's server)", json_content(ref("Tokens")),
                                        "TokenizeRequest", (400, 404, 413))},
        "/detokenize": {"post": operation("detokenize", "Token ids to text (llama.cpp's server)",
                                          json_content(ref("Detokenized")), "DetokenizeRequest", (400, 404, 413))},
    }


def _ollama_paths() -> dict:
    model = (400, 404, 413)
    generate = (400, 404, 413, 503)

    def op(op_id: str, summary: str, ok: dict, request: str | None = None, errors: tuple[int, ...] = (), **kw) -> dict:
        return operation(op_id, summary, ok, request, errors, ollama=True, **kw)

    return {
        "/api/chat": {"post": op("ollamaChat", "A chat reply (ollama)", {**json_content(ref("OllamaChatResponse")), **NDJSON},
                                 "OllamaChatRequest", generate, ok_why="NDJSON pieces (stream, the default) or one object")},
        "/api/generate": {"post": op("ollamaGenerate", "A completion (ollama)",
                                     {**json_content(ref("OllamaGenerateResponse")), **NDJSON}, "OllamaGenerateRequest",
                                     generate, ok_why="NDJSON pieces (stream, the default) or one object")},
        "/api/embed": {"post": op("ollamaEmbed", "Unit-length embeddings (ollama)", json_content(ref("OllamaEmbedResponse")),
                                  "OllamaEmbedRequest", generate)},
        "/api/embeddings": {"post": op("ollamaEmbeddings", "An embedding, not normalized (ollama's older route)",
                                       json_content(ref("OllamaEmbeddingsResponse")), "OllamaEmbeddingsRequest", generate)},
        "/api/show": {"post": op("ollamaShow", "A model's details, template and capabilities",
                                 json_content(ref("OllamaShow")), "OllamaShowRequest", model)},
        "/api/tags": {"get": op("ollamaTags", "The models a request may name", json_content(ref("OllamaTags")))},
        "/api/ps": {"get": op("ollamaPs", "The models loaded", json_content(ref("OllamaPs")))},
        "/api/version": {"get": op("ollamaVersion", "The ollama API level followed", json_content(ref("OllamaVersion")))},
        "/api/pull": {"post": op("ollamaPull", "Pull a model from the Hugging Face Hub (as `infer pull`)",
                                 {**json_content(ref("OllamaPullStatus")), **NDJSON}, "OllamaPullRequest", (400, 413),
                                 ok_why="NDJSON progress (stream, the default) or {\"status\": \"success\"}")},
        "/api/delete": {"delete": op("ollamaDelete", "Delete a pulled model", {}, "OllamaModel", (400, 404, 409, 413),
                                     ok_why="Deleted")},
    }


def _other_paths() -> dict:
    text = {"text/plain": {"schema": STRING}}
    root = {**text, "text/html": {"schema": STRING}}
    root_op = operation("root", "\"Ollama is running\" (ollama's clients probe it), or the chat page for a browser "
                        "(Accept: text/html) unless --no-webui", root, secured=False)
    return {
        "/": {"get": root_op, "head": {**root_op, "operationId": "rootHead"}},
        "/webui/app.js": {"get": operation("webuiScript", "The chat page's script (not with --no-webui)",
                                           {"text/javascript": {"schema": STRING}}, secured=False)},
        "/webui/style.css": {"get": operation("webuiStyle", "The chat page's styles (not with --no-webui)",
                                              {"text/css": {"schema": STRING}}, secured=False)},
        "/health": {"get": operation("health", "Liveness and the requests running and waiting",
                                     json_content(ref("Health")), secured=False)},
        "/metrics": {"get": operation("metrics", "Prometheus metrics", text, secured=False)},
        "/openapi.json": {"get": operation("openapi", "This document", json_content({"type": "object"}), secured=False)},
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


def document() -> dict:
    """The whole OpenAPI 3.1 document, plain dicts and lists made afresh each call (the caller may
    change it; the shared pieces above are read-only)."""
    schemas = {**_shared(), **_generation(), **_openai_requests(), **_ollama_requests(), **_openai_responses(),
               **_ollama_responses(), **openapi_responses.schemas(), **openapi_anthropic.schemas(),
               **openapi_llama.schemas()}
    return _plain({
        "openapi": "3.1.0",
        "info": {"title": "infer serve", "version": _version(),
                 "description": "OpenAI-compatible and ollama-compatible APIs over local quantized models, with "
                                "llama.cpp's /tokenize and /detokenize. Fields the server does not read are ignored."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {}],
        "paths": {**_other_paths(), **_openai_paths(), **_ollama_paths(),
                  **openapi_responses.paths(operation, SSE), **openapi_anthropic.paths(), **openapi_llama.paths()},
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "Only when the server runs with --api-key (or INFER_API_KEY): then every /v1, /api, "
                           "/tokenize and /detokenize route needs it."}}},
    })


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


async def endpoint(request: Request) -> Response:
    """GET /openapi.json (outside the API key's routes: describing the API gives nothing away)."""
    return JSONResponse(document())
