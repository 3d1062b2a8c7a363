"""Options several commands share (run, chat, serve, bench): one declaration each, the same flags
everywhere, and LoadOptions, the loading flags gathered into the one EngineConfig they make."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import typer

TEMPERATURE = typer.Option(0.8, "--temperature", "-t", help="0 is greedy.")
TOP_K = typer.Option(40, "--top-k", help="0 disables.")
TOP_P = typer.Option(0.95, "--top-p", help="1.0 disables.")
MIN_P = typer.Option(0.05, "--min-p", help="0 disables.")
REPEAT_PENALTY = typer.Option(1.0, "--repeat-penalty", help="1.0 disables.")
SEED = typer.Option(None, "--seed", help="Seed for reproducible sampling.")
STOP = typer.Option([], "--stop", help="Stop at this string (repeatable).")
SYSTEM = typer.Option(None, "--system", help="System prompt.")
CTX = typer.Option(4096, "--ctx", "-c", help="Context size in tokens.")
THREADS = typer.Option(0, "--threads", help="CPU threads (0: all cores).")
BACKEND = typer.Option("auto", "--backend", "-b",
                       help="cpu, mlx, llama.cpp, or auto (MLX on Apple Silicon, llama.cpp with a GPU build, else cpu).")
GPU_LAYERS = typer.Option(-1, "--gpu-layers", "-ngl", help="llama.cpp backend: layers offloaded to the GPU (-1: all).")
MMAP = typer.Option(True, "--mmap/--no-mmap",
                    help="--no-mmap: read the weights into memory; nothing is read from the file after loading.")
MLOCK = typer.Option(False, "--mlock", help="Pin the weights in RAM so the OS never pages them out.")
CACHE_TYPE_K = typer.Option("f16", "--cache-type-k", "-ctk", help="KV cache type for K: f16 or q8_0 (half the memory).")
CACHE_TYPE_V = typer.Option("f16", "--cache-type-v", "-ctv", help="KV cache type for V: f16 or q8_0 (half the memory).")
STATE_SNAPSHOTS = typer.Option(-1, "--state-snapshots",
                               help="Hybrid models (Qwen3.5, LFM2): recurrent states kept at prompt ends so "
                                    "the prefix cache serves a chat's next turn (-1: 4 per sequence, 0: none; "
                                    "llama-server's --ctx-checkpoints).")
UBATCH = typer.Option(512, "--ubatch-size", "-ub",
                      help="Tokens one forward pass takes (llama.cpp's -ub): an embedding model whose attention "
                           "is not causal (BERT, EmbeddingGemma) embeds inputs up to this long.")
FORMAT = typer.Option(None, "--format", help="json: the reply is one JSON object (as ollama's --format json).")
JSON_SCHEMA = typer.Option(None, "--json-schema", metavar="FILE", help="The reply follows this JSON schema (a .json file).")
GRAMMAR = typer.Option(None, "--grammar", metavar="FILE", help="The reply follows this GBNF grammar (llama.cpp's syntax).")
SPEC = typer.Option(None, "--spec", help="ngram: speculative decoding by prompt lookup; draft: by a draft model "
                                         "(--draft). The output of plain decoding (on the cpu backend, token for "
                                         "token), faster where drafts are right.")
SPEC_NGRAM_N = typer.Option(6, "--spec-ngram-n", help="--spec ngram: tokens that must repeat before a draft is taken (llama.cpp: 12).")
DRAFT_MAX = typer.Option(8, "--draft-max", help="--spec: most tokens drafted per step.")
DRAFT = typer.Option(None, "--draft", "-md", help="A draft model of the same vocabulary (pulled name or .gguf path): "
                                                  "--spec draft.")
DRAFT_MIN = typer.Option(0, "--draft-min", help="--spec draft: shorter drafts are not verified.")
DRAFT_P_MIN = typer.Option(0.0, "--draft-p-min", help="--spec draft: stop drafting where the draft's top token is "
                                                      "less likely than this.")


def grammar(fmt: str | None, json_schema: str | None, gbnf: str | None):
    """The Grammar that --format / --json-schema / --grammar ask for (at most one of them), or None."""
    from pathlib import Path

    from infer.engine.grammar import Grammar, GrammarError

    given = [n for n, v in (("--format", fmt), ("--json-schema", json_schema), ("--grammar", gbnf)) if v is not None]
    if len(given) > 1:
        raise GrammarError(f"{' and '.join(given)} cannot be combined: give one")
    if fmt is not None:
        if fmt != "json":
            raise GrammarError(f"--format takes json, got {fmt!r}")
        return Grammar("json")
    if json_schema is not None:
        return Grammar.json_schema(Path(json_schema).read_text(encoding="utf-8"))
    if gbnf is not None:
        return Grammar("gbnf", Path(gbnf).read_text(encoding="utf-8"))
    return None


def spec(kind: str | None, ngram_n: int, draft_max: int, draft: str | None = None, draft_min: int = 0,
         draft_p_min: float = 0.0):
    """The SpecConfig of --spec / --spec-ngram-n / --draft-max / --draft (resolved as MODEL is; it
    implies --spec draft) / --draft-min / --draft-p-min."""
    from infer.engine.speculative import SpecConfig
    from infer.models.resolve import resolve_model

    path = str(resolve_model(draft)) if draft else ""
    return SpecConfig(kind or ("draft" if draft else ""), ngram_n, draft_max, path, draft_min, draft_p_min)


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model, as the flags give it (run, chat, serve and bench take these): one place
    that turns them into an EngineConfig, so that the commands cannot drift apart.

    Typer needs every flag as a parameter of the command, so the commands still list the flags;
    `of(locals())` gathers them by name (a command without --kv-memory keeps the default)."""

    # the flags' own defaults (one place: the Option declarations above)
    ctx: int = CTX.default
    threads: int = THREADS.default
    backend: str = BACKEND.default
    gpu_layers: int = GPU_LAYERS.default
    mmap: bool = MMAP.default
    mlock: bool = MLOCK.default
    cache_type_k: str = CACHE_TYPE_K.default
    cache_type_v: str = CACHE_TYPE_V.default
    kv_memory: str | None = None  # --kv-memory as typed (512M); serve and bench only
    state_snapshots: int = STATE_SNAPSHOTS.default
    ubatch_size: int = UBATCH.default
    spec: str | None = SPEC.default
    spec_ngram_n: int = SPEC_NGRAM_N.default
    draft_max: int = DRAFT_MAX.default
    draft: str | None = DRAFT.default
    draft_min: int = DRAFT_MIN.default
    draft_p_min: float = DRAFT_P_MIN.default

    @classmethod
    def of(cls, flags: Mapping[str, Any]) -> "LoadOptions":
        """The LoadOptions in a command's parameters (its locals(), taken before it defines others)."""
        return cls(**{f.name: flags[f.name] for f in fields(cls) if f.name in flags})

    def engine_config(self, max_seqs: int = 1, n_ctx: int | None = None, pooling: str = ""):
        """The EngineConfig of these options for a command running max_seqs sequences at once
        (n_ctx: the context size when the command needs more than --ctx). Resolves --draft as
        MODEL is resolved, so a missing draft model fails here."""
        from infer.engine.engine import EngineConfig

        from .sizes import parse_size

        return EngineConfig(
            n_ctx=self.ctx if n_ctx is None else n_ctx, n_threads=self.threads, max_seqs=max_seqs,
            backend=self.backend, gpu_layers=self.gpu_layers, mmap=self.mmap, mlock=self.mlock,
            cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v,
            spec=spec(self.spec, self.spec_ngram_n, self.draft_max, self.draft, self.draft_min, self.draft_p_min),
            kv_memory=parse_size(self.kv_memory) if self.kv_memory else 0, pooling=pooling,
            state_snapshots=self.state_snapshots, max_batch_tokens=self.ubatch_size)
