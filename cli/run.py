"""`infer run [MODEL] PROMPT`: one-shot generation, streamed to stdout."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from . import options as opt
from .app import app
from .errors import reported
from .load import load_llm


@app.command(help="Generate a reply to PROMPT (MODEL: a pulled name, a .gguf path, or the embedded default).")
def run(
    args: List[str] = typer.Argument(..., metavar="[MODEL] PROMPT", help="Optional model (pulled name or .gguf path), then the prompt ('-' reads stdin)."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", help="Most tokens to generate."),
    temperature: float = opt.TEMPERATURE,
    top_k: int = opt.TOP_K,
    top_p: float = opt.TOP_P,
    min_p: float = opt.MIN_P,
    repeat_penalty: float = opt.REPEAT_PENALTY,
    seed: Optional[int] = opt.SEED,
    stop: List[str] = opt.STOP,
    system: Optional[str] = opt.SYSTEM,
    fmt: Optional[str] = opt.FORMAT,
    json_schema: Optional[str] = opt.JSON_SCHEMA,
    grammar: Optional[str] = opt.GRAMMAR,
    raw: bool = typer.Option(False, "--raw", help="No chat template: tokenize the prompt as is."),
    ctx: int = opt.CTX,
    threads: int = opt.THREADS,
    backend: str = opt.BACKEND,
    gpu_layers: int = opt.GPU_LAYERS,
    mmap: bool = opt.MMAP,
    mlock: bool = opt.MLOCK,
    cache_type_k: str = opt.CACHE_TYPE_K,
    cache_type_v: str = opt.CACHE_TYPE_V,
    spec: Optional[str] = opt.SPEC,
    spec_ngram_n: int = opt.SPEC_NGRAM_N,
    draft_max: int = opt.DRAFT_MAX,
    draft: Optional[str] = opt.DRAFT,
    draft_min: int = opt.DRAFT_MIN,
    draft_p_min: float = opt.DRAFT_P_MIN,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming."),
) -> None:
    load = opt.LoadOptions.of(locals())
    if len(args) > 2:
        sys.stderr.write("error: expected [MODEL] PROMPT (quote the prompt if it has spaces)\n")
        raise typer.Exit(2)
    model_name, prompt = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    if prompt == "-":
        prompt = sys.stdin.read()
    if raw and system:
        raise typer.BadParameter("--system has no effect with --raw")
    with reported():
        from dataclasses import replace

        from infer.engine.reasoning import style
        from infer.engine.sampler import SamplingParams

        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            seed=seed, max_tokens=max_tokens, stop=tuple(stop), grammar=opt.grammar(fmt, json_schema, grammar),
        )
        llm = load_llm(model_name, load.engine_config(), quiet=as_json)
        if raw:
            ids = llm.encode_raw(prompt)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            ids = llm.encode_chat(messages)
            if style(llm.template.source) == "harmony":  # gpt-oss: its channel markers shown, as llama.cpp's CLI
                params = replace(params, special=True)
        _generate(llm, ids, params, as_json)


def _generate(llm, ids: list[int], params, as_json: bool) -> None:
    out = sys.stdout
    text_parts: list[str] = []
    final = None
    for chunk in llm.generate(ids, params):
        if chunk.text:
            if as_json:
                text_parts.append(chunk.text)
            else:
                out.write(chunk.text)
                out.flush()
        if chunk.finish_reason is not None:
            final = chunk
    st = final.usage
    if as_json:
        json.dump({
            "text": "".join(text_parts),
            "token_ids": final.token_ids,
            "prompt_token_ids": ids,
            "finish_reason": final.finish_reason,
            "prompt_tokens": st.prompt_tokens,
            "completion_tokens": st.completion_tokens,
            "ttft_ms": round(st.ttft_ms, 2),
            "prefill_tok_s": round(st.prefill_tok_s, 2),
            "decode_tok_s": round(st.decode_tok_s, 2),
            "drafted_tokens": st.drafted_tokens,
            "accepted_tokens": st.accepted_tokens,
        }, out, ensure_ascii=False)
        out.write("\n")
        return
    out.write("\n")
    sys.stderr.write(
        f"prompt {st.prompt_tokens} tok · ttft {st.ttft_ms:.0f} ms · prefill {st.prefill_tok_s:.1f} tok/s · "
        f"decode {st.decode_tok_s:.1f} tok/s ({st.completion_tokens} tok, {final.finish_reason})"
        + (f" · draft {st.accepted_tokens}/{st.drafted_tokens} accepted" if st.drafted_tokens else "") + "\n"
    )
