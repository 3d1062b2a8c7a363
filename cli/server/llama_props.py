"""llama-server's routes about the server rather than one completion: GET /props (what its web UI
and llama.vscode read first), GET /slots, POST /apply-template (a chat rendered by the template,
nothing generated); POST /props and POST /slots/{id} (save, restore, erase) answer 501 as
llama-server does when started without --props or --slot-save-path."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infer.engine.chat_template import ChatTemplateError

from . import openai_chat
from .llama_api import Native, SlotBook, llama_error, native_fields, settings
from .openai_request import APIError, chat_messages, parse_job
from .service import Service

BUILD_INFO = "infer"  # llama-server's build_info names its build; this is not one


async def set_props(request: Request) -> Response:
    return llama_error(APIError(501, "This server does not support changing global properties", None, "not_supported"))


async def slot_action(request: Request) -> Response:
    return llama_error(APIError(501, "This server does not save, restore or erase slots (llama-server's "
                                "--slot-save-path); the prefix cache keeps recent prompts by itself", None,
                                "not_supported"))


async def router_props(request: Request) -> Response:
    """GET /props of a several-models server without ?model=: llama-server's router answers so."""
    return JSONResponse({"role": "router", "model_alias": "infer", "model_path": "none",
                         "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": BUILD_INFO,
                         "modalities": {"vision": False, "video": False, "audio": False}, "is_sleeping": False})


async def router_slots(request: Request) -> Response:
    return llama_error(APIError(400, "this server runs several models: name one, GET /slots?model=NAME", "model",
                                "invalid_value"))


def router_props_routes() -> list[Route]:
    """The routes of a several-models server (model_router.py) for what one model's LlamaProps answers."""
    return [Route("/props", router_props, methods=["GET"]), Route("/props", set_props, methods=["POST"]),
            Route("/slots", router_slots, methods=["GET"]), Route("/slots/{id_slot}", slot_action, methods=["POST"])]


class LlamaProps:
    def __init__(self, service: Service, slots: SlotBook):
        self.service = service
        self.llm = service.llm
        self.slots = slots
        self.defaults: Native = native_fields({})

    def _tok_text(self, tid: int | None) -> str:
        return self.llm.tokenizer.token_text(tid) if tid is not None else ""

    async def props(self, request: Request) -> Response:
        eng = self.llm.engine
        src = self.llm.template.source
        return JSONResponse({
            "default_generation_settings": {"params": settings(self.defaults, self.defaults.job.params, -1),
                                            "n_ctx": eng.n_ctx},
            "total_slots": self.slots.n,
            "model_alias": self.service.config.model_id,
            "model_path": str(self.llm.model.path),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
            "ui": self.service.config.webui,
            "chat_template": src,
            # read off the template's text (llama-server renders probes): what a client checks first
            "chat_template_caps": {"supports_tools": "tools" in src, "supports_tool_calls": "tool_calls" in src,
                                   "supports_system_role": "system" in src, "supports_string_content": True},
            "bos_token": self._tok_text(self.llm.tokenizer.bos_id),
            "eos_token": self._tok_text(self.llm.tokenizer.eos_id),
            "build_info": BUILD_INFO,
            "is_sleeping": False,
        })

    async def get_slots(self, request: Request) -> Response:
        busy = self.slots.busy()
        if request.query_params.get("fail_on_no_slot") and all(busy):
            return llama_error(APIError(503, "no slot available", None, "unavailable"))
        n_ctx = self.llm.engine.n_ctx
        out = []
        for i, processing in enumerate(busy):
            s = {"id": i, "n_ctx": n_ctx, "speculative": bool(self.llm.engine.spec.kind), "is_processing": processing}
            last = self.slots.last.get(i)
            if last:
                s.update({"id_task": last["id_task"], "n_prompt_tokens": last["n_prompt_tokens"],
                          "n_prompt_tokens_processed": last["n_prompt_tokens"] - last["n_cached"],
                          "n_prompt_tokens_cache": last["n_cached"], "params": last["params"],
                          "next_token": [{"has_next_token": processing, "has_new_line": "\n" in last["generated"],
                                          "n_remain": -1, "n_decoded": last["n_decoded"]}]})
            out.append(s)
        return JSONResponse(out)

    async def apply_template(self, request: Request) -> Response:
        """{"messages", "tools"?, "tool_choice"?, "chat_template_kwargs"?, "add_generation_prompt"?
        (true)} -> {"prompt"}: the text the chat template makes of them, as /v1/chat/completions would
        feed the model."""
        try:
            body = await self.service.body(request)
            self.service.check_model(body)
            messages = chat_messages(body)
            job = parse_job({}, None)
            plan, _ = openai_chat.plan(openai_chat.plan_fields(body), messages, self.llm.template.source,
                                       self.service.config.reasoning_format, job, self.llm.tokenizer.token_id)
            gen = body.get("add_generation_prompt", True)
            if not isinstance(gen, bool):
                raise APIError(400, "'add_generation_prompt' must be true or false", "add_generation_prompt",
                               "invalid_type")
            prompt = await self.service.encode(
                lambda p: self.llm.template.render(p.messages, add_generation_prompt=gen, **p.variables), plan)
        except ChatTemplateError as e:
            return llama_error(APIError(400, str(e).splitlines()[0], None, "invalid_value"))
        except APIError as e:
            return llama_error(e)
        return JSONResponse({"prompt": prompt})
