"""`infer bench [MODEL]`: prefill and decode speed, like llama-bench, plus parallel streams."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from . import options as opt
from .app import app
from .errors import reported


@app.command(help="Measure prefill and decode tok/s on MODEL (a pulled name, a .gguf path, or the embedded default).")
def bench(
    model: Optional[str] = typer.Argument(None, help="Pulled name or .gguf path (default: the embedded model)."),
    prompt_tokens: int = typer.Option(512, "--prompt-tokens", "-p", help="Prompt length of the prefill test."),
    gen_tokens: int = typer.Option(128, "--gen-tokens", "-n", help="Tokens each stream generates."),
    parallel: int = typer.Option(1, "--parallel", help="Concurrent streams in the decode test."),
    depth: int = typer.Option(0, "--depth", "-d", help="Tokens of context both tests run after (llama-bench's -d)."),
    repetitions: int = typer.Option(3, "--repetitions", "-r", help="Runs per test (mean ± sd)."),
    ctx: int = typer.Option(4096, "--ctx", "-c", help="Context size in tokens."),
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory", help="KV pool size, e.g. 512M (default: --parallel full contexts)."),
    threads: int = typer.Option(0, "--threads", "-t", help="CPU threads (0: all cores)."),
    backend: str = opt.BACKEND,
    gpu_layers: int = opt.GPU_LAYERS,
    mmap: bool = opt.MMAP,
    mlock: bool = opt.MLOCK,
    cache_type_k: str = opt.CACHE_TYPE_K,
    cache_type_v: str = opt.CACHE_TYPE_V,
    state_snapshots: int = opt.STATE_SNAPSHOTS,
    spec: Optional[str] = opt.SPEC,
    spec_ngram_n: int = opt.SPEC_NGRAM_N,
    draft_max: int = opt.DRAFT_MAX,
    draft: Optional[str] = opt.DRAFT,
    draft_min: int = opt.DRAFT_MIN,
    draft_p_min: float = opt.DRAFT_P_MIN,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    load = opt.LoadOptions.of(locals())
    with reported():
        from infer.engine.benchmark import BenchResult, run_bench

        from .load import load_llm

        config = load.engine_config(max_seqs=max(parallel, 1), n_ctx=max(ctx, depth + prompt_tokens + 1, depth + gen_tokens + 8))
        llm = load_llm(model, config, quiet=True)
        res = run_bench(llm, prompt_tokens, gen_tokens, parallel, repetitions, depth)
        ms = BenchResult.mean_sd
        kv = llm.engine.usage()
        name = llm.model.config.name or llm.model.path.name
        row = {
            "model": name,
            "path": str(llm.model.path),
            "backend": llm.backend,
            "devices": llm.runner.devices(),
            "threads": llm.runner.n_threads,
            "parallel": parallel,
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "depth": depth,
            "repetitions": repetitions,
            "prefill_tok_s": round(ms(res.prefill_tok_s)[0], 2),
            "prefill_tok_s_sd": round(ms(res.prefill_tok_s)[1], 2),
            "decode_tok_s": round(ms(res.decode_tok_s)[0], 2),
            "decode_tok_s_sd": round(ms(res.decode_tok_s)[1], 2),
            "aggregate_decode_tok_s": round(ms(res.aggregate_decode_tok_s)[0], 2),
            "aggregate_decode_tok_s_sd": round(ms(res.aggregate_decode_tok_s)[1], 2),
            "ttft_ms": round(ms(res.ttft_ms)[0], 2),
            "kv_pool_bytes": kv.bytes_total,
            # a hybrid model's recurrent states (its sequences' and the prefix cache's snapshots)
            "state_pool_bytes": llm.engine.states.nbytes if llm.engine.states is not None else 0,
            "cache_type_k": cache_type_k,
            "cache_type_v": cache_type_v,
            "spec": spec or "",
            "drafted_tokens": llm.engine.drafted,
            "accepted_tokens": llm.engine.accepted,
            "acceptance": round(llm.engine.accepted / llm.engine.drafted, 4) if llm.engine.drafted else None,
        }
        if as_json:
            json.dump(row, sys.stdout)
            sys.stdout.write("\n")
            return
        out = sys.stdout
        out.write(f"model: {name} ({llm.model.path})\n")
        out.write(f"backend {llm.backend} ({', '.join(llm.runner.devices())}), threads {row['threads']}, KV pool {kv.bytes_total / 2**20:.1f} MiB "
                  f"(K {cache_type_k}, V {cache_type_v}, {' + '.join(str(n) for n in kv.blocks_total)} blocks of {kv.block_size} tokens)"
                  + (f", state pool {row['state_pool_bytes'] / 2**20:.1f} MiB" if row["state_pool_bytes"] else "") + "\n\n")
        out.write(f"| {'test':<22} | {'t/s':>18} |\n|{'-' * 24}|{'-' * 20}|\n")

        def line(test, xs):
            m, sd = ms(xs)
            out.write(f"| {test:<22} | {m:>9.2f} ± {sd:<6.2f} |\n")

        at = f" @ d{depth}" if depth else ""  # llama-bench's label
        line(f"pp{prompt_tokens}{at}", res.prefill_tok_s)
        line(f"tg{gen_tokens}{at}" + (f" per stream x{parallel}" if parallel > 1 else ""), res.decode_tok_s)
        if parallel > 1:
            line(f"tg{gen_tokens}{at} aggregate x{parallel}", res.aggregate_decode_tok_s)
        out.write(f"\nttft (pp{prompt_tokens}): {row['ttft_ms']:.1f} ms\n")
        if spec:
            out.write(f"speculation ({spec}): {row['accepted_tokens']} of {row['drafted_tokens']} drafted tokens "
                      f"accepted\n")
