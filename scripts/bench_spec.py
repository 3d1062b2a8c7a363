"""Prompt-lookup speculative decoding: infer plain vs `--spec ngram`, beside llama.cpp's llama-server
plain vs `--spec-type ngram-simple`, on inputs where lookup helps, same file, same threads.

Inputs (greedy, the same token ids to both programs):
- code: a ~400-token Python file (from this repo) to be repeated with one change (a rename);
- quote: a passage (from this README) to be quoted back exactly;
- loop: a raw prompt the model continues by repeating itself (its own repetitive continuation).

infer runs in this process (the engine, one stream); llama-server (built by
scripts/build_llama_bench.sh, one slot) gets the same prompt ids on /completion and reports its
decode speed and draft counts in `timings`. infer's speculative output must be token for token
its plain output (checked). Decode tok/s is generated tokens after the first over the time after
the first, as each program reports it.

    python scripts/bench_spec.py [MODEL.gguf] [--threads 2] [--max-tokens 256] [--rounds 2] [--no-llama]
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def inputs(llm) -> dict[str, list[int]]:
    code = (ROOT / "engine" / "stop.py").read_text()
    readme = (ROOT / "README.md").read_text()
    start = readme.index("An OpenAI-compatible endpoint")
    passage = readme[start:start + 1200]
    return {
        "code": llm.encode_chat([{"role": "user", "content": "Here is a Python file:\n\n```python\n" + code +
                                  "```\n\nRewrite the whole file with the class StopMatcher renamed to StopFinder. "
                                  "Change nothing else."}]),
        "quote": llm.encode_chat([{"role": "user", "content": "Quote this passage back exactly, word for word:\n\n"
                                   + passage}]),
        "loop": llm.encode_raw("Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,"),
    }


def infer_runs(model: str, threads: int, max_tokens: int, n: int, m: int) -> tuple[dict, dict]:
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.engine.sampler import SamplingParams
    from infer.engine.speculative import SpecConfig

    out = {}
    prompts = None
    for kind in ("", "ngram"):
        llm = LLM.load(model, EngineConfig(n_ctx=4096, n_threads=threads, max_seqs=1, spec=SpecConfig(kind, n, m)))
        llm.runner.warmup()
        prompts = prompts or inputs(llm)
        for name, ids in prompts.items():
            ev = list(llm.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens)))[-1]
            u = ev.usage
            out[(name, kind)] = {"tok_s": u.decode_tok_s, "tokens": ev.token_ids, "drafted": u.drafted_tokens,
                                 "accepted": u.accepted_tokens}
        del llm
    return out, prompts


def llama_runs(server: Path, model: str, threads: int, max_tokens: int, prompts: dict, n: int, m: int) -> dict:
    out = {}
    for kind, extra in (("", []), ("ngram", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
                                              "--spec-ngram-simple-size-m", str(m)])):
        port = _free_port()
        p = subprocess.Popen([str(server), "-m", model, "-t", str(threads), "-c", "4096", "-np", "1", "--port",
                              str(port), "--no-webui", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        try:
            _wait(port, p)
            for name, ids in prompts.items():
                r = _post(f"http://127.0.0.1:{port}/completion",
                          {"prompt": ids, "n_predict": max_tokens, "temperature": 0, "cache_prompt": False,
                           "return_tokens": True})
                t = r["timings"]
                out[(name, kind)] = {"tok_s": t["predicted_per_second"], "tokens": r.get("tokens", []),
                                     "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}
        finally:
            p.terminate()
            p.communicate(timeout=60)
    return out


def _wait(port: int, p: subprocess.Popen) -> None:
    while True:
        if p.poll() is not None:
            raise RuntimeError(f"llama-server exited: {p.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="a .gguf (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="turns each program takes (best kept)")
    ap.add_argument("--ngram-n", type=int, default=6, help="both programs' lookup n-gram")
    ap.add_argument("--draft-max", type=int, default=8, help="both programs' longest draft (llama.cpp's m-gram)")
    ap.add_argument("--no-llama", action="store_true", help="infer only")
    a = ap.parse_args(argv)
    if a.model:
        model = str(Path(a.model).expanduser())
    else:
        from infer.models.default import default_model_path

        model = str(default_model_path())
    best: dict = {}
    for _ in range(a.rounds):
        ours, prompts = infer_runs(model, a.threads, a.max_tokens, a.ngram_n, a.draft_max)
        runs = {("infer",) + k: v for k, v in ours.items()}
        if not a.no_llama:
            bins = Path(subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_bench.sh")], check=True,
                                       capture_output=True, text=True).stdout.strip().splitlines()[-1])
            theirs = llama_runs(bins / "llama-server", model, a.threads, a.max_tokens, prompts, a.ngram_n, a.draft_max)
            runs.update({("llama.cpp",) + k: v for k, v in theirs.items()})
        for k, v in runs.items():
            if k not in best or v["tok_s"] > best[k]["tok_s"]:
                best[k] = v
    print(f"model {Path(model).name}, {a.threads} threads, greedy, {a.max_tokens} tokens, n-gram {a.ngram_n}, "
          f"draft max {a.draft_max}, best of {a.rounds}")
    print("| input | program | plain tok/s | ngram tok/s | speedup | accepted / drafted | same output |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name in prompts:
        for prog in ("infer", "llama.cpp"):
            if (prog, name, "") not in best:
                continue
            p, s = best[(prog, name, "")], best[(prog, name, "ngram")]
            same = "yes" if p["tokens"] == s["tokens"] else ("no" if p["tokens"] else "-")
            print(f"| {name} | {prog} | {p['tok_s']:.1f} | {s['tok_s']:.1f} | {s['tok_s'] / p['tok_s']:.2f}x | "
                  f"{s['accepted']} / {s['drafted']} | {same} |")
        if ("llama.cpp", name, "ngram") in best:
            ratio = best[("infer", name, "ngram")]["tok_s"] / best[("llama.cpp", name, "ngram")]["tok_s"]
            print(f"| {name} | infer / llama.cpp, both speculating | | | {ratio:.2f}x | | |")
    for name in prompts:
        if best[("infer", name, "")]["tokens"] != best[("infer", name, "ngram")]["tokens"]:
            sys.exit(f"infer's speculative output differs from its plain output on {name}")


if __name__ == "__main__":
    main()
