"""`infer chat [MODEL]`: an interactive terminal chat (or one answer, when stdin is piped)."""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import List, Optional

import typer
from rich.markup import escape

from . import options as opt
from .app import app
from .errors import reported, user_errors

HELP = """Commands:
  /help                 this list
  /system TEXT          set the system prompt
  /set NAME VALUE       temperature, top_p, top_k, min_p, max_tokens, seed, repeat_penalty
  /set think on|off     let a thinking model think (where its template can turn it off, as Qwen3's)
  /show                 model, parameters, context use
  /clear                start a new conversation (the system prompt stays)
  /save FILE            save the conversation as JSON
  /load FILE            load a conversation saved with /save
  /stats                speed and prompt-cache use of the last reply
  /bye                  exit (Ctrl-D too)
Start and end a message with \"\"\" to write several lines. Ctrl-C stops a reply."""

SETTABLE = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "max_tokens": int,
            "seed": int, "repeat_penalty": float}


@app.command(help="Chat with MODEL (a pulled name, a .gguf path, or the embedded default) in the terminal.")
def chat(
    model: Optional[str] = typer.Argument(None, help="Pulled name or .gguf path (default: the embedded model)."),
    max_tokens: int = typer.Option(1024, "--max-tokens", "-n", help="Most tokens per reply."),
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
    ctx: int = opt.CTX,
    threads: int = opt.THREADS,
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
    verbose: bool = typer.Option(False, "--verbose", help="Print the stats line after every reply."),
    as_json: bool = typer.Option(False, "--json", help="Piped input: print the reply as one JSON object."),
) -> None:
    load = opt.LoadOptions.of(locals())
    with reported():
        from infer.engine.conversation import Conversation
        from infer.engine.sampler import SamplingParams

        from .load import load_llm

        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            seed=seed, max_tokens=max_tokens, stop=tuple(stop), grammar=opt.grammar(fmt, json_schema, grammar),
        )
        interactive = sys.stdin.isatty()
        llm = load_llm(model, load.engine_config(), quiet=not interactive)
        conv = Conversation(llm, system)
        if not interactive:
            _answer_piped(conv, params, as_json, verbose)
            return
    _repl(llm, conv, params, verbose)


def _stats_line(st) -> str:
    new = st.prompt_tokens - st.cached_tokens
    return (f"ttft {st.ttft_ms:.0f} ms · decode {st.decode_tok_s:.1f} tok/s · prompt {st.prompt_tokens} tok "
            f"({st.cached_tokens} reused from the cache, {new} new) · reply {st.completion_tokens} tok")


def _answer_piped(conv, params, as_json: bool, verbose: bool) -> None:
    from infer.engine.conversation import TurnStats

    text = sys.stdin.read().strip()
    if not text:
        raise typer.BadParameter("nothing on stdin to answer")
    st = TurnStats()
    parts = []
    for ev in conv.turn(text, params, st):
        parts.append(ev.text)
        if not as_json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    if as_json:
        json.dump({"reply": "".join(parts), "finish_reason": st.finish_reason, "prompt_tokens": st.prompt_tokens,
                   "completion_tokens": st.completion_tokens, "ttft_ms": round(st.ttft_ms, 2),
                   "decode_tok_s": round(st.decode_tok_s, 2)}, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    if verbose:
        sys.stderr.write(_stats_line(st) + "\n")


def _read_message(console) -> str | None:
    """One message from the user (None: exit).  \"\"\" starts and ends a multi-line message."""
    import readline

    try:
        line = input(">>> ")
    except EOFError:
        console.print()
        return None
    except KeyboardInterrupt:
        if readline.get_line_buffer().strip():
            console.print()
            return ""  # Ctrl-C on a half-typed line: drop it, ask again
        console.print()
        return None
    if not line.lstrip().startswith('"""'):
        return line
    body = line.lstrip()[3:]
    if body.rstrip().endswith('"""') and body.strip() != "":
        return body.rstrip()[:-3]
    lines = [body] if body else []
    while True:
        try:
            nxt = input("... ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return ""
        if nxt.rstrip().endswith('"""'):
            lines.append(nxt.rstrip()[:-3])
            return "\n".join(lines)
        lines.append(nxt)


def _repl(llm, conv, params, verbose: bool) -> None:
    import atexit
    import readline

    from rich.console import Console

    from infer.engine.conversation import TurnStats
    from infer.models.default import infer_home

    console = Console(highlight=False)
    hist = infer_home() / "chat_history"
    try:
        hist.parent.mkdir(parents=True, exist_ok=True)
        if hist.exists():
            readline.read_history_file(hist)
        readline.set_history_length(1000)
        atexit.register(lambda: readline.write_history_file(hist))
    except OSError:
        pass  # a read-only home: chat without saved history
    from infer.engine.reasoning import opened_in_prompt, reply_stream, style

    thinking = style(llm.template.source)  # a model that thinks: its thoughts shown dimmed, apart
    engine = llm.engine
    engine.start()  # Ctrl-C then lands in this thread, never inside an engine step
    name = llm.model.config.name or llm.model.path.name
    console.print(f"[bold]{name}[/] · /help for commands · Ctrl-D or /bye to exit")
    last: TurnStats | None = None
    try:
        while True:
            text = _read_message(console)
            if text is None:
                return
            if not text.strip():
                continue
            if text.startswith("/"):
                result = _command(text, llm, conv, params, last, console)
                if result == "bye":
                    return
                if result is not None:
                    params = result
                continue
            st = TurnStats()
            try:
                think = None
                for ev in conv.turn(text, params, st):
                    if think is None:  # the prompt is rendered by now: did it open a <think>?
                        # JSON held from the first token leaves no room to think (--format, --json-schema)
                        forced = params.grammar is not None and params.grammar.kind in ("json", "json_schema")
                        think = reply_stream(thinking, opened_in_prompt(conv.prompt_text) and not forced) \
                            if thinking else False
                    _show(console, think.feed(ev.text) if think else ("", ev.text))
                if think:
                    _show(console, think.finish())
                console.print()
            except KeyboardInterrupt:
                console.print("\n[dim](stopped)[/]")
            except user_errors() as e:
                console.print(f"[red]error:[/] {escape(str(e).splitlines()[0])}")
                continue
            if st.dropped_turns:
                console.print(f"[yellow](the conversation outgrew the context of {engine.n_ctx} tokens: "
                              f"dropped the {st.dropped_turns} oldest messages, kept the system prompt)[/]")
            last = st
            if verbose and st.finish_reason:
                console.print(f"[dim]{_stats_line(st)}[/]")
    finally:
        engine.stop()


def _show(console, parts: tuple[str, str]) -> None:
    """A piece of a reply: (thinking, answer), the thinking dimmed."""
    reasoning, content = parts
    if reasoning:
        console.print(reasoning, end="", markup=False, soft_wrap=True, style="dim")
    if content:
        console.print(content, end="", markup=False, soft_wrap=True)


def _command(text: str, llm, conv, params, last, console):
    """Run a slash command; returns "bye", new sampling params, or None."""
    from infer.engine.conversation import ConversationError
    from infer.engine.sampler import InvalidSamplingParams

    cmd, _, arg = text.strip().partition(" ")
    arg = arg.strip()
    if cmd in ("/bye", "/exit", "/quit"):
        return "bye"
    if cmd in ("/help", "/?"):
        console.print(HELP, markup=False)
    elif cmd == "/system":
        conv.system = arg or None
        console.print("system prompt set" if arg else "system prompt cleared")
    elif cmd == "/set" and arg.split(" ")[0] == "think":
        value = arg.partition(" ")[2].strip()
        if value not in ("on", "off"):
            console.print("usage: /set think on|off")
        elif "enable_thinking" not in llm.template.source:
            console.print("this model's chat template has no switch for thinking")
        else:
            conv.variables["enable_thinking"] = value == "on"
            console.print(f"thinking {value}")
    elif cmd == "/set":
        name, _, value = arg.partition(" ")
        if name not in SETTABLE or not value.strip():
            console.print(f"usage: /set NAME VALUE, NAME one of {', '.join(SETTABLE)}")
            return None
        try:
            new = dataclasses.replace(params, **{name: SETTABLE[name](value.strip())})
        except (ValueError, InvalidSamplingParams) as e:
            console.print(f"[red]error:[/] {escape(str(e))}")
            return None
        console.print(f"{name} = {getattr(new, name)}")
        return new
    elif cmd == "/show":
        cfg = llm.model.config
        ids = llm.encode_chat(conv.full_messages()) if conv.full_messages() else []
        kv = llm.engine.usage()
        console.print(f"model: {cfg.name or '?'} ({llm.model.path})\narchitecture: {cfg.arch}, {cfg.n_layer} layers, "
                      f"n_embd {cfg.n_embd}\n"
                      f"parameters: temperature {params.temperature}, top_k {params.top_k}, top_p {params.top_p}, "
                      f"min_p {params.min_p}, repeat_penalty {params.repeat_penalty}, max_tokens {params.max_tokens}, "
                      f"seed {params.seed}\n"
                      f"system: {conv.system!r}\n"
                      f"context: {len(ids)} of {llm.engine.n_ctx} tokens used by {len(conv.messages)} messages; "
                      f"KV pool {kv.bytes_total / 2**20:.1f} MiB", markup=False)
    elif cmd == "/clear":
        conv.clear()
        console.print("new conversation")
    elif cmd in ("/save", "/load"):
        saving = cmd == "/save"
        if not arg:
            console.print(f"usage: {cmd} FILE")
        else:
            try:
                (conv.save if saving else conv.load)(arg)
                console.print(f"{'saved' if saving else 'loaded'} {len(conv.messages)} messages "
                              f"{'to' if saving else 'from'} {arg}", markup=False)
            except (OSError, ConversationError) as e:
                console.print(f"[red]error:[/] {escape(str(e))}")
    elif cmd == "/stats":
        console.print(_stats_line(last) if last else "no reply yet", markup=False)
    else:
        console.print(f"unknown command {cmd!r}; /help lists the commands", markup=False)
    return None
