"""Prefill and decode speed of infer against llama.cpp (llama-cpp-python) on the same GGUF.

Both run the same prompt token ids with the same number of threads, in one process, their
repetitions alternating.  Prefill: the whole prompt in one forward call (llama.cpp: one eval, n_batch 512).
Decode: after the prefill, single-token steps; only the steps are timed.  Each measurement is
repeated and the median reported (the best in brackets).

    python scripts/bench.py [--model PATH] [--threads 2] [--prompt-tokens 512] [--gen-tokens 128] [--repetitions 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded Gemma 3 270M Q4_K_M)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--skip-llama-cpp", action="store_true", help="measure infer only")
    return p.parse_args(argv)


def prompt_ids(llm_or_none, model, n: int) -> list[int]:
    """n token ids of ordinary text: BOS, then a paragraph repeated (the same ids for both engines)."""
    text = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
            "report on renewable energy, citing wind, solar and hydroelectric capacity figures. ")
    if llm_or_none is not None:
        ids = llm_or_none.tokenize(text.encode(), add_bos=False, special=False)
        bos = [llm_or_none.token_bos()] if llm_or_none.token_bos() >= 0 else []
    else:
        from infer.engine.tokenizer import Tokenizer

        tok = Tokenizer.from_metadata(model.metadata)
        ids = tok.encode(text, add_special=False, parse_special=False)
        bos = [tok.bos_id] if tok.bos_id is not None else []
    out = list(bos)
    while len(out) < n:
        out.extend(ids)
    return out[:n]


class InferRun:
    def __init__(self, model, prompt, gen, threads):
        import numba
        import numpy as np

        from infer.backends.cpu.runner import CpuRunner

        numba.set_num_threads(threads)
        self.runner = CpuRunner(model.config, model.weights, n_threads=threads)
        self.toks = np.asarray(prompt, np.int32)
        self.step = np.zeros(1, np.int32)
        self.gen = gen
        self.cache = self.runner.new_kv_cache(len(prompt) + gen + 1)
        # warm-up: compile (or load compiled code for) both the prefill and the decode paths
        self.runner.forward(self.toks, 0, self.cache)
        self.runner.forward(self.toks[:1], len(self.toks), self.cache)

    def run(self) -> tuple[float, float]:
        """(prefill tok/s, decode tok/s); decoding greedily from the prompt, timing only the forward calls."""
        n = len(self.toks)
        t = time.perf_counter()
        logits = self.runner.forward(self.toks, 0, self.cache)
        pre = n / (time.perf_counter() - t)
        nxt = int(logits[0].argmax())
        t_dec = 0.0
        for i in range(self.gen):
            self.step[0] = nxt
            t = time.perf_counter()
            logits = self.runner.forward(self.step, n + i, self.cache)
            t_dec += time.perf_counter() - t
            nxt = int(logits[0].argmax())
        return pre, self.gen / t_dec


class LlamaCppRun:
    def __init__(self, path, prompt, gen, threads):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt) + gen + 8, n_batch=512, n_ubatch=512,
                                   n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
        self.prompt = prompt
        # Greedy continuations would need the logits (a copy per step): the decode steps feed the
        # prompt's own ids again, one at a time (the cost of a step does not depend on the token).
        self.steps = [prompt[(i + 1) % len(prompt)] for i in range(gen)]
        self.llm.eval(prompt)  # warm-up

    def run(self) -> tuple[float, float]:
        self.llm.reset()  # the next eval drops the cached positions
        t = time.perf_counter()
        self.llm.eval(self.prompt)
        pre = len(self.prompt) / (time.perf_counter() - t)
        t = time.perf_counter()
        for tok in self.steps:
            self.llm.eval([tok])
        return pre, len(self.steps) / (time.perf_counter() - t)


_LOG_CALLBACK = None


def _quiet_llama_cpp(llama_cpp) -> None:
    """Drop llama.cpp's log lines (verbose=False leaves some warnings on stderr)."""
    global _LOG_CALLBACK
    import ctypes

    _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


def fmt(xs) -> str:
    return f"{statistics.median(xs):8.1f} [{max(xs):6.1f}]"


def main(argv=None) -> int:
    args = parse_args(argv)
    from infer.models.loader import load_model

    if args.model is None:
        from infer.models.default import default_model_path

        args.model = str(default_model_path())
    model = load_model(args.model)
    llm_tok = None
    if not args.skip_llama_cpp:
        import llama_cpp

        _quiet_llama_cpp(llama_cpp)
        llm_tok = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    prompt = prompt_ids(llm_tok, model, args.prompt_tokens)
    if llm_tok is not None:
        llm_tok.close()

    print(f"model: {args.model}")
    print(f"threads: {args.threads}, prompt: {len(prompt)} tokens, decode: {args.gen_tokens} tokens, "
          f"repetitions: {args.repetitions} (median [best], tokens/s); cpu count {os.cpu_count()}")
    runs = {"infer": InferRun(model, prompt, args.gen_tokens, args.threads)}
    if not args.skip_llama_cpp:
        runs["llama.cpp"] = LlamaCppRun(args.model, prompt, args.gen_tokens, args.threads)
    # repetitions alternate between the engines, so that a slow spell of a shared machine hits both
    results = {name: ([], []) for name in runs}
    for _ in range(args.repetitions):
        for name, run in runs.items():
            pre, dec = run.run()
            results[name][0].append(pre)
            results[name][1].append(dec)
    rows = [(name, *results[name]) for name in runs]
    print()
    print(f"{'engine':12s} {'prefill tok/s':>17s} {'decode tok/s':>17s}")
    for name, pre, dec in rows:
        print(f"{name:12s} {fmt(pre)} {fmt(dec)}")
    if len(rows) == 2:
        (_, p0, d0), (_, p1, d1) = rows
        print(f"{'infer/llama':12s} {statistics.median(p0) / statistics.median(p1):8.2f}x{'':8s} "
              f"{statistics.median(d0) / statistics.median(d1):8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
