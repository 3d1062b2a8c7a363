"""The README's tables of architectures, backends and HTTP routes, written from the code that defines
them (the registry in models/arch/__init__.py and each architecture's module, backends/registry.py
and each backend package's docstring, the server's OpenAPI document in cli/server/openapi.py), so they
cannot drift from it; tests/test_readme.py checks the README holds exactly these blocks.

    python scripts/readme_tables.py          # rewrite the README's blocks in place
"""
from __future__ import annotations

import importlib
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SOURCES = {
    "architectures": "the registry in models/arch",
    "backends": "backends/registry.py",
    "routes": "the OpenAPI document, cli/server/openapi.py",
}


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}: written by scripts/readme_tables.py from {SOURCES[name]} -->", f"<!-- /{name} -->")


def _family(doc: str) -> str:
    """The first words of an architecture module's docstring: what it is, up to the first colon or
    full stop outside parentheses ("Qwen2 / Qwen2.5", "Gemma 3 (text)")."""
    depth = 0
    for i, c in enumerate(doc):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0 and (c == ":" or (c == "." and doc[i + 1:i + 2] in (" ", "\n", ""))):
            return " ".join(doc[:i].split())
    return " ".join(doc.split())


def _layer(a) -> str:
    """What sets an architecture's layer apart from llama's, read from its Architecture fields."""
    from infer.models.arch.spec import no_scalars

    parts = [a.attention_kind] if a.attention_kind else []
    if a.recurrent is not None:
        parts.append(f"{a.recurrent_kind} beside the attention layers, a state per sequence")
    if a.attn_output_gate:
        parts.append("sigmoid-gated attention output")
    shared = {"sigmoid": "sigmoid-gated shared expert", "plain": "ungated shared expert",
              "counted": "ungated shared experts"}.get(a.shared_expert, "")
    if a.experts == "always":
        gating = {"softmax_weight": ", router softmax over the top experts", "sigmoid": ", sigmoid router",
                  "sigmoid_logits": ", sigmoid router weighting the experts' inputs"}
        parts.append("mixture of experts" + gating.get(a.moe_gating, ""))
        if shared:
            parts.append(shared)
    elif a.experts == "optional" and a.shared_expert == "dense":  # Gemma 4: the dense FFN stays beside them
        parts.append("dense, or experts beside the dense FFN where the file has them")
    elif a.experts == "optional":
        parts.append("dense, or experts" + (f" with an {shared}" if shared else "") + " where the file has them")
    if a.qk_norm:
        parts.append({"head": "Q/K norms per head", "all": "Q/K norms over the whole projection"}[a.qk_norm])
    if a.bert_norms:  # the BERT family's post-norm encoder layer
        parts.append("LayerNorms with biases after each residual add and of the embeddings")
        if a.pos_embd:
            parts.append("absolute position embeddings")
        parts.append("GELU FFN without a gate" if not a.ffn_gated else "SwiGLU FFN")
    elif not a.pre_norms:
        parts.append("post-norms only")
    elif a.post_norms:
        parts.append("pre- and post-norms")
    if a.activation != "silu" and not a.bert_norms:
        parts.append({"gelu": "GELU", "swiglu_oai": "clamped SwiGLU"}.get(a.activation, a.activation))
    if a.layer_plan_kind:
        parts.append(a.layer_plan_kind)
    if a.layer_shapes is not None:  # the file's per-layer flags say which layers slide (Gemma 4)
        parts.append("sliding-window and global layers of different head sizes, shared-KV layers, "
                     "per-layer embeddings where the file has them")
    elif a.swa_pattern:
        parts.append(f"sliding window on {a.swa_pattern - 1} of {a.swa_pattern} layers")
    if any(a.default_softcaps):
        parts.append("soft caps")
    if a.attn_sinks:
        parts.append("attention sinks")
    if a.extra_biases:
        parts.append("biases")
    if a.scalars is not no_scalars:
        parts.append("scales of its own")
    return ", ".join(parts) or "the llama layer"


def architectures() -> list[str]:
    from infer.models.arch import architecture, names

    rows = ["| GGUF `general.architecture` | models | HF `model_type` | layer | built-in chat template |",
            "|---|---|---|---|---|"]
    for name in names():
        a = architecture(name)
        module = importlib.import_module(f"infer.models.arch.{name.replace('-', '_')}")
        if module.ARCHITECTURE is not a:
            raise SystemExit(f"models/arch: the module of {name!r} is not {module.__name__}")
        hf = ", ".join(f"`{t}`" for t in a.hf_model_types) or "-"
        rows.append(f"| `{name}` | {_family(module.__doc__ or '')} | {hf} | {_layer(a)} | {a.chat_template or 'none'} |")
    return rows


def backends() -> list[str]:
    from infer.backends.registry import BACKENDS, INSTALL_HINT

    rows = ["| `--backend` | install | what it is |", "|---|---|---|"]
    for name in BACKENDS:
        package = importlib.import_module(f"infer.backends.{name.replace('.', '')}")
        what = (package.__doc__ or "").strip().split("\n")[0].split(": ", 1)[-1]
        install = f"`{INSTALL_HINT[name]}`" if name in INSTALL_HINT else "included"
        rows.append(f"| `{name}` | {install} | {what} |")
    return rows


def routes() -> list[str]:
    from infer.cli.server.openapi import document

    paths = document()["paths"]

    def open_route(path: str) -> bool:  # needs no key even with --api-key
        return next(iter(paths[path].values())).get("security") == []

    def order(path: str) -> tuple[bool, int]:
        return open_route(path), 0 if path.startswith("/v1/") else 1 if path.startswith("/api/") else 2

    rows = ["| route | what | needs `--api-key`'s key |", "|---|---|---|"]
    for path in sorted(paths, key=order):  # sorted is stable: the document's order within each group
        if path.startswith("/webui/"):
            continue  # the chat page's own script and styles, not an API
        ops = paths[path]
        first = next(iter(ops.values()))
        methods = ", ".join(m.upper() for m in ops)
        what = "The OpenAPI 3.1 document of these routes" if path == "/openapi.json" else first["summary"]
        key = "no" if open_route(path) else "yes"
        rows.append(f"| `{methods} {path}` | {what.replace('|', '/')} | {key} |")
    return rows


BLOCKS = {"architectures": architectures, "backends": backends, "routes": routes}


def block(name: str) -> str:
    begin, end = markers(name)
    return "\n".join([begin, *BLOCKS[name](), end])


def main() -> int:
    text = README.read_text(encoding="utf-8")
    for name in BLOCKS:
        begin, end = markers(name)
        if begin not in text or end not in text:
            raise SystemExit(f"README.md has no {name} block: add the lines {begin} and {end} where it goes")
        start, stop = text.index(begin), text.index(end) + len(end)
        text = text[:start] + block(name) + text[stop:]
    README.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
