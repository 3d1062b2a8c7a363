"""Tokenizing speed, infer against llama.cpp, on the same vocabulary files and the same text.

    python scripts/bench_tokenize.py VOCAB.gguf|FOLDER ... [--mb 1] [--rounds 3]

For each GGUF (a folder: every *.gguf in it, e.g. the llama.cpp test vocabularies the test suite
fetches into ~/.cache/infer-tests/llama-cpp-python-<version>-vocab/), encodes about --mb MB of
mixed prose and code (this repository's README and Python sources, repeated) with infer's
Tokenizer and with llama.cpp's llama_tokenize (called once through llama-cpp-python's C binding,
with room for every id: Llama.tokenize may call it twice), no BOS, no special parsing, taking
turns for --rounds rounds and keeping each side's best; prints seconds, the ratio and whether
the ids agree.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sample_text(mb: float) -> str:
    parts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    parts += [p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("*/*.py"))]
    text = "\n".join(parts)
    want = int(mb * 1_000_000)
    return (text * (want // len(text.encode()) + 1))[:want]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--mb", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import llama_cpp

    from infer.engine.tokenizer import Tokenizer
    from infer.models.gguf_file import read_gguf

    files = [f for path in args.paths for f in (sorted(path.glob("*.gguf")) if path.is_dir() else [path])]
    text = sample_text(args.mb)
    data = text.encode()
    print(f"{len(data) / 1e6:.2f} MB of prose and code, best of {args.rounds}")
    print(f"{'vocabulary':32s} {'type':6s} {'infer s':>8s} {'llama.cpp s':>11s} {'ratio':>6s}  ids")
    for f in files:
        tok = Tokenizer.from_metadata(read_gguf(f).metadata)
        ref = llama_cpp.Llama(model_path=str(f), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(ref.model)
        buf = (llama_cpp.llama_token * (len(data) + 16))()

        def llama_tokenize(raw: bytes) -> list[int]:
            n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)
            assert n >= 0
            return buf[:n]

        tok.encode(text[:1000], False, False)  # compile or warm up both
        llama_tokenize(data[:1000])
        best = {"infer": float("inf"), "llama.cpp": float("inf")}
        for _ in range(args.rounds):
            t = time.perf_counter()
            ours = tok.encode(text, False, False)
            best["infer"] = min(best["infer"], time.perf_counter() - t)
            t = time.perf_counter()
            theirs = llama_tokenize(data)
            best["llama.cpp"] = min(best["llama.cpp"], time.perf_counter() - t)
        ratio = best["llama.cpp"] / best["infer"]
        print(f"{f.name:32s} {tok.model_type:6s} {best['infer']:8.3f} {best['llama.cpp']:11.3f} {ratio:5.2f}x  "
              f"{'same' if ours == theirs else 'DIFFER'}")
        ref.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
