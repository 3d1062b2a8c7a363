"""Fuzzing `infer serve` over HTTP from its own OpenAPI document (cli/server/openapi.py), with
schemathesis, for tests/test_openapi.py (a bounded budget) and scripts/fuzz_api.py (a long run).

Every operation gets requests that fit its schema (positive) and requests that break it
(negative); each goes to the real server over a real connection, so that a dropped connection
or a hang shows as what it is.  A request must get a 2xx or a 4xx in the route's documented
error shape: schemathesis checks the status is not a 5xx, that it is documented, and that the
content type and the JSON body match the document.  Failures are collected, not raised, so one
run reports all of them.
"""
from __future__ import annotations

import collections
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from helpers.server import Server, raw
from helpers.tiny_models import add_fim_ids, write_tiny_model
from infer.cli.server.model_router import MODEL_ROUTES

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
TIMEOUT = 120  # seconds a request may take before it counts as a hang (a reply of the whole context takes 1-2 s)


@dataclass
class Report:
    requests: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    by_operation: dict[str, collections.Counter] = field(default_factory=dict)  # "POST /x positive" -> statuses
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def counts(c: collections.Counter) -> str:
            return ", ".join(f"{s}: {n}" for s, n in sorted(c.items(), key=str))

        lines = [f"{self.requests} requests; statuses: {counts(self.statuses)}"]
        lines += [f"  {op:40} {counts(c)}" for op, c in sorted(self.by_operation.items())]
        lines.append(f"{len(self.failures)} failures")
        return "\n".join(lines + self.failures)


def serve(folder: Path, several: bool, *args: str) -> tuple[Server, str]:
    """`infer serve` on a tiny random model (a reply of the whole context takes a fraction of a
    second), one model or several-models mode, with --ctx 256 and --parallel 2; (the server, the
    name requests give its model).  Sandboxed: its own INFER_HOME and HF_HOME, offline, so a
    fuzzed /api/pull fetches nothing and a fuzzed /api/delete can only touch the sandbox."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny = write_tiny_model(folder / "tiny.gguf", "qwen2", extra=add_fim_ids)  # FIM tokens: /infill runs
    env = {"INFER_HOME": str(folder / "infer"), "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1"}
    common = ("--ctx", "256", "--parallel", "2", "--threads", "2", *args)
    if not several:
        return Server(tiny, folder, *common, env_extra=env), tiny.stem
    name = _stand_in_for_default(tiny, folder / "infer")
    server = Server(None, folder, *common, "--keep-alive", "-1", env_extra=env)
    status, _, tags = raw(server.port, "GET", "/api/tags")
    if status != 200 or [m["size"] for m in tags["models"]] != [tiny.stat().st_size]:
        server.stop()
        raise RuntimeError(f"the tiny model does not stand in for the embedded one: {tags}")
    return server, name


def _stand_in_for_default(tiny: Path, home: Path) -> str:
    """Put the tiny model where the several-models server finds the default chat model
    (models/default.py: the file and its verified stamp under INFER_HOME), so that requests that
    name no model, which go to it, run as fast as the others; its name."""
    from infer.models.default import CHAT_MODEL, stamp_verified

    target = home / "models" / "default" / CHAT_MODEL.file
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny, target)
    stamp_verified(target, CHAT_MODEL.sha256)
    return target.stem


def load(base_url: str) -> schemathesis.BaseSchema:
    """The server's own document, as a client would get it.  Failures are reported with the
    request as sent: schemathesis would otherwise mask fields named like secrets (max_tokens).
    A 501 is an answer, not a server error (llama-server's for what it was not started to do:
    POST /props, saving slots); status_code_conformance still fails it where it is not documented."""
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}, "checks": {
        "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "501"]}}})
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)


def fuzz(schema, base_url: str, examples: int, model: str | None = None, seed: int | None = None,
         report: Report | None = None) -> Report:
    """examples positive and examples negative requests per operation (operations without a body:
    the one request they have).  model: the served model's name, put in half the requests of the
    routes that run on a model, so that they reach generation instead of stopping at a 404.
    seed: the same requests every run (None: new ones)."""
    report = report or Report()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            op = result.ok()
            modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.body else [])
            for mode in modes:
                _fuzz_operation(op, mode, base_url, examples if op.body else 1, model, seed, session, report)
    return report


def _fuzz_operation(op, mode: GenerationMode, base_url: str, examples: int, model: str | None, seed: int | None,
                    session, report: Report) -> None:
    named = model is not None and op.method.upper() == "POST" and op.path in MODEL_ROUTES

    # generate only: a failure is recorded, not raised, so there is nothing to shrink
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode), rename=st.booleans())
    def run(case, rename: bool) -> None:
        if named and rename and isinstance(case.body, dict):
            case.body["model"] = model
        report.requests += 1
        statuses = report.by_operation.setdefault(f"{op.label} {mode.value}", collections.Counter())
        try:
            response = case.call(base_url=base_url, session=session, timeout=TIMEOUT)
        except requests.RequestException as e:  # a dropped connection, a hang, a stream cut short
            report.failures.append(f"{op.label} ({mode.value}): no answer: {type(e).__name__}: {e}\n"
                                   f"    {case.as_curl_command()}")
            statuses["none"] += 1
            return
        report.statuses[response.status_code] += 1
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as e:
            report.failures.append(f"{op.label} ({mode.value}): {e}")

    (run if seed is None else fixed_seed(seed)(run))()
