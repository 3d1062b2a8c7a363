"""The OpenAPI paths and schemas of llama-server's native routes (llama_api.py, llama_props.py),
merged into openapi.document(); it refers to that document's shared schemas (GenerationOptions,
ChatMessage, Tool, ToolChoice, Health) by name."""
from __future__ import annotations

from infer.engine.sampler import MAX_LOGPROBS

from .llama_api import NEGATIVE_OFF, OFF_SAMPLERS
from .openapi_schema import BOOLEAN, INTEGER, STRING, json_content, nullable, number, obj, operation, ref

# a stream, described as schemathesis reads text/event-stream: its events
SSE = {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string", "description": "A chunk as JSON, the last one the final object (stop: true), no "
                                              "[DONE]; an error after the first chunk is an {\"error\": {...}} chunk."}}}}}
_WHY = {400: "A request the server refuses: bad JSON, a wrong field, a prompt over the context.",
        401: "--api-key is set and the request's key is missing or wrong.",
        404: "The model named is not served here.",
        413: "The body is larger than --max-body.",
        501: "Not supported here: a model without fill-in-the-middle tokens (/infill), changing properties or "
             "saving slots.",
        503: "The queue is full (--max-queue), or fail_on_no_slot and no idle slot."}


def _op(op_id: str, summary: str, ok: dict | None, request: str | None = None, errors: tuple[int, ...] = (),
        parameters: list | None = None, ok_why: str = "OK") -> dict:
    """One operation, its errors in llama-server's shape."""
    return operation(op_id, summary, ok, request, errors, why=_WHY, error="LlamaError", ok_why=ok_why,
                     parameters=parameters)


def _public(op: dict) -> dict:
    del op["responses"]["401"]
    return {**op, "security": []}


def _query(name: str, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": STRING, "description": description}


def schemas() -> dict:
    ids_or_text = {"type": "array", "items": {"anyOf": [number(0, kind="integer"), STRING]},
                   "description": "Token ids (each below the vocabulary's size) and text, one prompt."}
    one = {"anyOf": [STRING, ids_or_text, obj({"prompt_string": {"anyOf": [STRING, ids_or_text]}},
                                              ("prompt_string",), "No multimodal_data: text only.")]}
    native = {
        "n_predict": nullable(number(-1, 2**31 - 1, kind="integer",
                                     description="-1 (default): to the end of the context; 0: the prompt is "
                                                 "evaluated into the cache, nothing generated.")),
        "n_probs": nullable(number(0, MAX_LOGPROBS, kind="integer",
                                   description="completion_probabilities with this many alternatives.")),
        "post_sampling_probs": nullable(BOOLEAN),
        "cache_prompt": nullable(BOOLEAN),
        "return_tokens": nullable(BOOLEAN),
        "response_fields": nullable({"type": "array", "items": STRING}),
        "n_keep": nullable(number(-1, 2**31 - 1, kind="integer", description="Accepted; the context never shifts.")),
        "n_discard": nullable(number(0, 2**31 - 1, kind="integer", description="Accepted; the context never shifts.")),
        "id_slot": nullable(number(-1, 2**31 - 1, kind="integer")),
        "samplers": {"description": "Ignored: the chain is penalties, top_k, top_p, min_p, temperature."},
        **{name: nullable({"const": off}, description="A sampler this server does not have: only its off value.")
           for name, off in OFF_SAMPLERS.items()},
        **{name: nullable({"type": "number", "exclusiveMaximum": 0}, description="Off (negative) only.")
           for name in NEGATIVE_OFF},
    }
    completion = {"index": INTEGER, "content": STRING, "tokens": {"type": "array", "items": INTEGER},
                  "id_slot": INTEGER, "stop": BOOLEAN, "model": STRING, "tokens_predicted": INTEGER,
                  "tokens_evaluated": INTEGER, "generation_settings": {"type": "object"}, "prompt": STRING,
                  "has_new_line": BOOLEAN, "truncated": BOOLEAN,
                  "stop_type": {"enum": ["eos", "limit", "word", "none"]}, "stopping_word": STRING,
                  "tokens_cached": INTEGER, "timings": {"type": "object"},
                  "completion_probabilities": {"type": "array", "items": {"type": "object"}}}
    return {
        "LlamaError": obj({"error": obj({"code": INTEGER, "message": STRING, "type": STRING},
                                        ("code", "message", "type"))}, ("error",), "llama-server's error shape."),
        "LlamaNative": obj(native),
        "LlamaCompletionRequest": {"allOf": [ref("GenerationOptions"), ref("LlamaNative"), obj({
            "prompt": {"anyOf": [one, {"type": "array", "minItems": 1, "items": {"anyOf": [STRING, ids_or_text, one]}}],
                       "description": "One prompt, or an array of prompts (answered with an array)."}},
            ("prompt",))]},
        "LlamaInfillRequest": {"allOf": [ref("GenerationOptions"), ref("LlamaNative"), obj({
            "input_prefix": {"anyOf": [STRING, ids_or_text]}, "input_suffix": {"anyOf": [STRING, ids_or_text]},
            "input_extra": nullable({"type": "array", "items": obj({"filename": STRING, "text": STRING}, ("text",))}),
            "prompt": STRING}, ("input_prefix", "input_suffix"))]},
        "LlamaCompletion": obj(completion, description="Only the response_fields asked for, when some are."),
        "LlamaApplyTemplateRequest": obj({"messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
                                          "tools": nullable({"type": "array", "items": ref("Tool")}),
                                          "tool_choice": nullable(ref("ToolChoice")),
                                          "add_generation_prompt": BOOLEAN,
                                          "chat_template_kwargs": nullable({"type": "object", "not": {"anyOf": [
                                              {"required": ["messages"]}, {"required": ["add_generation_prompt"]}]}})},
                                         ("messages",)),
        "LlamaProps": obj({"default_generation_settings": {"type": "object"}, "total_slots": INTEGER,
                           "model_path": STRING, "chat_template": STRING, "bos_token": STRING, "eos_token": STRING,
                           "build_info": STRING, "modalities": {"type": "object"}, "is_sleeping": BOOLEAN},
                          ("default_generation_settings", "model_path", "build_info")),
        "LlamaSlot": obj({"id": INTEGER, "n_ctx": INTEGER, "speculative": BOOLEAN, "is_processing": BOOLEAN,
                          "params": {"type": "object"}, "next_token": {"type": "array"}},
                         ("id", "n_ctx", "speculative", "is_processing")),
    }


def paths() -> dict:
    gen = (400, 404, 413, 503)
    streamed = "The completion (an array for several prompts), or with stream: true per-token chunks and the final " \
               "object as server-sent events (no [DONE])"
    completion = {**json_content({"anyOf": [ref("LlamaCompletion"), {"type": "array", "items": ref("LlamaCompletion")}]}),
                  **SSE}
    model = _query("model", "Several-models server: the model whose props or slots (without it: the router's "
                            "props, and a 400 for slots).")
    return {
        "/completion": {"post": _op("llamaCompletion", "A completion (llama-server's native API)", completion,
                                    "LlamaCompletionRequest", gen, ok_why=streamed)},
        "/completions": {"post": _op("llamaCompletions", "/completion's other name", completion,
                                     "LlamaCompletionRequest", gen, ok_why=streamed)},
        "/infill": {"post": _op("llamaInfill", "Fill in the middle (llama-server), with the model's FIM tokens",
                                completion, "LlamaInfillRequest", (*gen, 501), ok_why=streamed)},
        "/apply-template": {"post": _op("llamaApplyTemplate", "A chat rendered by the model's template, nothing "
                                        "generated", json_content(obj({"prompt": STRING}, ("prompt",))),
                                        "LlamaApplyTemplateRequest", (400, 404, 413))},
        "/props": {"get": _op("llamaProps", "The server's properties (llama-server)", json_content(ref("LlamaProps")),
                              errors=(400, 404), parameters=[model]),
                   "post": _op("llamaSetProps", "Not supported (llama-server without --props)", None, errors=(501,))},
        "/slots": {"get": _op("llamaSlots", "The --parallel slots and what they run (llama-server)",
                              json_content({"type": "array", "items": ref("LlamaSlot")}), errors=(400, 404, 503),
                              parameters=[model, _query("fail_on_no_slot", "Any value: a 503 when no slot is idle.")])},
        "/slots/{id_slot}": {"post": _op("llamaSlotAction", "Not supported: saving, restoring, erasing slots", None,
                                         errors=(501,), parameters=[
                                             {"name": "id_slot", "in": "path", "required": True, "schema": STRING}])},
        "/v1/health": {"get": _public(_op("healthV1", "/health's other name", json_content(ref("Health"))))},
    }
