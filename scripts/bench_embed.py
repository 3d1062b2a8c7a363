"""Embedding throughput: `infer serve` against llama.cpp's native `llama-server --embedding` on the same GGUF.

    python scripts/bench_embed.py                         # the embedded chat model
    python scripts/bench_embed.py model.gguf --threads 2 --texts 1000 --batch 32 --clients 4
    python scripts/bench_embed.py --bert-base --type Q8_0 # a random-weight BERT-base

Both servers run alone, one after the other, on the same file with the same threads, the same
sequences at once (infer --parallel, llama-server -np), the same context per sequence (--ctx)
and the same tokens per forward pass (infer's 512-token step; llama-server -b/-ub --ubatch, at
least the longest input, as it needs to pool a whole input in one pass), mean pooling in both.
--texts deterministic English sentences of 5 to 30 words go out as /v1/embeddings requests of
--batch inputs each, from --clients clients at once; each server first embeds two batches to warm
up.  Reported per server: texts/s and tokens/s (the tokens of the responses' usage over the wall
time of all requests), then infer's over llama.cpp's; with --rounds N the two take N turns,
alternating which goes first, each turn a fresh start.  After its timed run each server embeds
the first --sample texts again one a request (nothing batched with them): the two servers'
vectors of those are compared (cosine: min and mean), so are the timed runs' of every text, and
each server's batched vectors with its own one-a-request ones; a warning where their token counts differ.

Models: a GGUF path; by default the embedded chat model (infer.models.default); --bert-base a
random-weight BERT-base (12 layers, 768 wide, 12 heads, FFN 3072, 512 positions, 2 token types,
llama.cpp's 30522-token WordPiece vocabulary of bge, models/ggml-vocab-bert-bge.gguf in the sdist
of the installed llama-cpp-python, else a generated one) written with gguf's writer as F16 and
quantized to --type (F16, Q8_0, Q4_K_M) by llama.cpp's llama_model_quantize.  Files and
llama.cpp's programs (scripts/build_llama_bench.sh) are cached in $INFER_BENCH_CACHE (default
~/.cache/infer-bench).  --json prints the rows as JSON.
"""
from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_serve import free_port, wait_up
from bench_shapes import CACHE, quantize

ROOT = Path(__file__).resolve().parent.parent

WORDS = ("the a of and to in is was for on with as by at from that this it he she they we you "
         "river mountain city garden window morning evening winter summer music market library "
         "teacher student doctor farmer engineer painter children family friend neighbor village "
         "quickly slowly quietly carefully often never always sometimes almost perhaps together "
         "walks reads writes builds carries opens closes finds watches remembers explains follows "
         "green bright old young small large warm cold heavy gentle ancient modern simple strange "
         "bread coffee letter story picture question answer problem idea journey bridge station "
         "light water stone paper wood glass metal cloud rain snow wind fire road house door table "
         "book clock lamp chair ship train car bicycle street park forest field lake ocean island "
         "after before during under over between through across behind near beyond without").split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """n sentences of 5 to 30 words, the same for a seed: every text differs from the start."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 30))]
        out.append(f"{i} " + " ".join(words).capitalize() + ".")
    return out


# -- a random-weight BERT-base ------------------------------------------------------------------

@dataclass(frozen=True)
class BertShape:
    n_embd: int = 768
    n_ff: int = 3072
    n_layer: int = 12
    n_head: int = 12
    n_ctx_train: int = 512
    n_token_types: int = 2
    n_vocab: int = 30522


BERT_BASE = BertShape()


def bert_tensors(shape: BertShape) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, numpy shape, is a matrix) of each tensor, as llama.cpp's converter names BERT's
    (src/models/bert.cpp loads them; positions and token types in F32, as the converter keeps
    them): embeddings of tokens, types and positions with their norm,
    then per layer Q, K, V, the output projection, its norm, the FFN up and down, and its norm."""
    D, F = shape.n_embd, shape.n_ff
    out = [("token_embd.weight", (shape.n_vocab, D), True), ("token_types.weight", (shape.n_token_types, D), False),
           ("position_embd.weight", (shape.n_ctx_train, D), False), ("token_embd_norm.weight", (D,), False),
           ("token_embd_norm.bias", (D,), False)]
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        for m in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out += [(p + m + ".weight", (D, D), True), (p + m + ".bias", (D,), False)]
        out += [(p + "attn_output_norm.weight", (D,), False), (p + "attn_output_norm.bias", (D,), False),
                (p + "ffn_up.weight", (F, D), True), (p + "ffn_up.bias", (F,), False),
                (p + "ffn_down.weight", (D, F), True), (p + "ffn_down.bias", (D,), False),
                (p + "layer_output_norm.weight", (D,), False), (p + "layer_output_norm.bias", (D,), False)]
    return out


def bert_vocab(n_vocab: int) -> tuple[list[str], list[int]]:
    """A WordPiece vocabulary in the converter's form (a word's first piece after "\u2581", a
    continuation bare, [X] specials): llama.cpp's bge vocabulary where it is reachable and has
    n_vocab tokens, else one generated in BERT's layout ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
    [MASK] 103, then characters, the benchmark's words and filler words)."""
    path = bge_vocab_file()
    if path is not None:
        import gguf

        r = gguf.GGUFReader(str(path))
        f = r.fields["tokenizer.ggml.tokens"]
        tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0])
                 for i in r.fields["tokenizer.ggml.token_type"].data]
        if len(tokens) == n_vocab:
            return tokens, types
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] * len(tokens)
    chars = [chr(c) for c in range(33, 127)]
    pieces = ["\u2581" + c for c in chars] + chars + ["\u2581" + w for w in WORDS]
    pieces += ["\u2581" + w for w in sorted({w.capitalize() for w in WORDS})]
    pieces += [str(d) for d in range(10, 1000)] + ["\u2581" + str(d) for d in range(10, 1000)]
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            seen.add(p)
            tokens.append(p)
    i = 0
    while len(tokens) < n_vocab:  # filler: letter pairs, triples, ... not yet present
        s, j = "", i
        while True:
            s += chr(97 + j % 26)
            j //= 26
            if j == 0:
                break
        i += 1
        if "\u2581" + s not in seen:
            seen.add("\u2581" + s)
            tokens.append("\u2581" + s)
    tokens = tokens[:n_vocab]
    return tokens, types + [1] * (len(tokens) - len(types))


def bge_vocab_file() -> Path | None:
    """llama.cpp's models/ggml-vocab-bert-bge.gguf from the installed llama-cpp-python's sdist,
    fetched once with pip into the cache; None where it cannot be had."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None
    out = CACHE / f"ggml-vocab-bert-bge-{version}.gguf"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                            "--no-binary", ":all:", "-q", "-d", tmp], capture_output=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if p.returncode != 0 or not sdists:
            return None
        with tarfile.open(sdists[0]) as tf:
            member = next((m for m in tf.getmembers() if m.name.endswith("vendor/llama.cpp/models/ggml-vocab-bert-bge.gguf")),
                          None)
            if member is None:
                return None
            with tf.extractfile(member) as src:
                CACHE.mkdir(parents=True, exist_ok=True)
                part = out.with_suffix(".partial")
                part.write_bytes(src.read())
                part.rename(out)
    return out


def write_bert_f16(shape: BertShape, path: Path) -> None:
    """shape as an F16 GGUF (weights ~ N(0, 0.02), norms' weights 1 and biases 0, other biases
    small), with the keys llama.cpp's convert_hf_to_gguf.py writes for BertModel (mean pooling)."""
    import gguf

    rng = np.random.default_rng(0)
    tokens, types = bert_vocab(shape.n_vocab)
    tensors = bert_tensors(shape)
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "bert")
    w.add_name(path.stem)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_block_count(shape.n_layer)
    w.add_head_count(shape.n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(1)  # MOSTLY_F16
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(shape.n_token_types)
    w.add_unk_token_id(tokens.index("[UNK]"))
    w.add_sep_token_id(tokens.index("[SEP]"))
    w.add_pad_token_id(tokens.index("[PAD]"))
    w.add_bos_token_id(tokens.index("[CLS]"))  # llama.cpp starts a WordPiece text with its BOS: [CLS]
    w.add_uint32("tokenizer.ggml.cls_token_id", tokens.index("[CLS]"))  # as the converter's files (no add_ method)
    w.add_mask_token_id(tokens.index("[MASK]"))
    for name, shp, matrix in tensors:
        dt = np.float16 if matrix else np.float32
        w.add_tensor_info(name, shp, np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, matrix in tensors:
        if matrix:
            a = (rng.standard_normal(shp, np.float32) * 0.02).astype(np.float16)
        elif name.endswith("norm.weight"):
            a = np.ones(shp, np.float32)
        elif name.endswith("norm.bias"):
            a = np.zeros(shp, np.float32)
        else:  # positions and token types (F32, as the converter keeps them), the biases
            a = (rng.standard_normal(shp, np.float32) * 0.02).astype(np.float32)
        w.write_tensor_data(a)
    w.close()
    tmp.rename(path)


def bert_file(qtype: str, threads: int, shape: BertShape = BERT_BASE, name: str = "bert-base") -> Path:
    """The random BERT as qtype (F16: as written), written and quantized once into the cache."""
    d = CACHE / "models"
    d.mkdir(parents=True, exist_ok=True)
    src = d / f"{name}-F16.gguf"
    if not src.exists():
        print(f"writing {src} ...", file=sys.stderr, flush=True)
        write_bert_f16(shape, src)
    if qtype == "F16":
        return src
    out = d / f"{name}-{qtype}.gguf"
    if not out.exists():
        quantize(src, out, qtype, threads)
    return out


# -- the clients --------------------------------------------------------------------------------

def embed_all(port: int, texts: list[str], batch: int, clients: int) -> tuple[float, int, np.ndarray]:
    """Every text embedded through /v1/embeddings, batch inputs a request, clients at once:
    (wall seconds, tokens the responses' usage counts, the vectors, one row per text)."""
    starts = list(range(0, len(texts), batch))
    vectors: list[np.ndarray | None] = [None] * len(texts)
    tokens = [0] * len(starts)
    errors: list[str] = []
    lock = threading.Lock()
    nxt = iter(range(len(starts)))

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            while True:
                with lock:
                    j = next(nxt, None)
                if j is None or errors:
                    return
                s = starts[j]
                chunk = texts[s:s + batch]
                conn.request("POST", "/v1/embeddings", json.dumps({"input": chunk}),
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    errors.append(f"HTTP {resp.status}: {body[:300]!r}")
                    return
                out = json.loads(body)
                for d in out["data"]:
                    vectors[s + d["index"]] = np.asarray(d["embedding"], np.float32)
                tokens[j] = out.get("usage", {}).get("prompt_tokens", 0)
        except OSError as e:
            errors.append(str(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        sys.exit(f"a request failed: {errors[0]}")
    return wall, sum(tokens), np.stack(vectors)  # type: ignore[arg-type]


def bench_server(name: str, cmd: list[str], port: int, texts: list[str], batch: int, clients: int,
                 sample: int) -> dict:
    """One server started, warmed up, timed on every text, then asked for the first `sample` texts
    one at a time; stopped.  The row, with "vectors" (the timed run's) and "alone" (the sample's)."""
    log = Path(tempfile.mkstemp(prefix=f"bench-embed-{name}-", suffix=".log")[1])
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        wait_up(proc, port, "/health", log, timeout=900)
        embed_all(port, texts[:2 * batch], batch, 1)  # warm-up: compiled kernels, first-use allocations
        wall, tokens, vecs = embed_all(port, texts, batch, clients)
        _, _, alone = embed_all(port, texts[:sample], 1, 1)  # one text a request: nothing batched with it
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink(missing_ok=True)
    row = {"server": name, "texts": len(texts), "tokens": tokens, "wall_s": wall,
           "texts_s": len(texts) / wall, "tok_s": tokens / wall}
    print(f"  {name:<10} {row['texts_s']:.1f} texts/s, {row['tok_s']:.0f} tok/s ({tokens} tokens, {wall:.1f} s)",
          file=sys.stderr, flush=True)
    return {**row, "vectors": vecs, "alone": alone}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of a with the same row of b."""
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF path (default: the embedded chat model)")
    ap.add_argument("--bert-base", action="store_true", help="a random-weight BERT-base (see --type)")
    ap.add_argument("--type", default="F16", choices=["F16", "Q8_0", "Q4_K_M"], help="--bert-base's storage type")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32, help="inputs per /v1/embeddings request")
    ap.add_argument("--clients", type=int, default=4, help="requests in flight at once")
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once (infer --parallel, llama-server -np)")
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence")
    ap.add_argument("--ubatch", type=int, default=512, help="tokens per forward pass (llama-server -b/-ub)")
    ap.add_argument("--rounds", type=int, default=1, help="turns each server takes, alternating which goes first")
    ap.add_argument("--sample", type=int, default=32, help="texts also embedded one a request, for the agreement")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    if a.bert_base and a.model:
        sys.exit("pass a model path or --bert-base, not both")
    if a.bert_base:
        model = bert_file(a.type, a.threads)
    elif a.model:
        model = Path(a.model).expanduser()
    else:
        from infer.models.default import default_model_path

        model = default_model_path()
    if a.type != "F16" and not a.bert_base:
        sys.exit("--type is --bert-base's; a given file is benchmarked as it is")
    bins = Path(subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_bench.sh")], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
    texts = make_texts(a.texts)
    print(f"model {model}, threads {a.threads}, {a.texts} texts in batches of {a.batch}, {a.clients} clients, "
          f"{a.parallel} sequences at once", file=sys.stderr, flush=True)

    def infer_cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "infer.cli", "serve", str(model), "--port", str(port), "--threads", str(a.threads),
                "--parallel", str(a.parallel), "--ctx", str(a.ctx), "--backend", "cpu", "--pooling", "mean",
                "--max-queue", str(a.texts + 64), "--no-webui"]

    def llama_cmd(port: int) -> list[str]:
        return [str(bins / "llama-server"), "-m", str(model), "--port", str(port), "-t", str(a.threads),
                "-tb", str(a.threads), "-np", str(a.parallel), "-c", str(a.ctx * a.parallel),
                "-b", str(a.ubatch), "-ub", str(a.ubatch), "--embedding", "--pooling", "mean", "--no-webui"]

    rows: list[dict] = []
    for r in range(a.rounds):
        order = [("infer", infer_cmd), ("llama.cpp", llama_cmd)]
        for name, cmd in order if r % 2 == 0 else order[::-1]:
            port = free_port()
            rows.append({**bench_server(name, cmd(port), port, texts, a.batch, a.clients, min(a.sample, a.texts)),
                         "round": r + 1})
    last = {row["server"]: row for row in rows}
    vi, vl = last["infer"]["vectors"], last["llama.cpp"]["vectors"]
    ai, al = last["infer"]["alone"], last["llama.cpp"]["alone"]
    cos, cos_alone = cosines(vi, vl), cosines(ai, al)
    agreement = {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "sample": len(ai),
                 "alone_cos_min": float(cos_alone.min()), "alone_cos_mean": float(cos_alone.mean()),
                 "infer_batched_vs_alone_min": float(cosines(vi[:len(ai)], ai).min()),
                 "llama_batched_vs_alone_min": float(cosines(vl[:len(al)], al).min()),
                 "tokens_infer": last["infer"]["tokens"], "tokens_llama": last["llama.cpp"]["tokens"]}
    for row in rows:
        row.pop("vectors", None)
        row.pop("alone", None)
    if a.json:
        json.dump({"rows": rows, "agreement": agreement}, sys.stdout, indent=1)
        print()
    else:
        print(f"model {model.name}, threads {a.threads}, {a.texts} texts, batch {a.batch}, {a.clients} clients, "
              f"{a.parallel} sequences at once")
        print("| round | server | texts/s | tok/s | wall s |")
        print("|---:|---|---:|---:|---:|")
        for row in rows:
            print(f"| {row['round']} | {row['server']} | {row['texts_s']:.1f} | {row['tok_s']:.0f} | {row['wall_s']:.1f} |")
        for r in range(a.rounds):
            by = {row["server"]: row for row in rows if row["round"] == r + 1}
            print(f"| {r + 1} | infer / llama.cpp | {by['infer']['texts_s'] / by['llama.cpp']['texts_s']:.2f}x | | |")
        g = agreement
        print(f"cosine infer vs llama.cpp, the {g['sample']} texts sent one a request: min {g['alone_cos_min']:.5f}, "
              f"mean {g['alone_cos_mean']:.5f}; every text of the timed (batched) run: min {g['cos_min']:.5f}, "
              f"mean {g['cos_mean']:.5f}")
        print(f"each server's batched vectors against its own one-a-request ones (min cosine): infer "
              f"{g['infer_batched_vs_alone_min']:.5f}, llama.cpp {g['llama_batched_vs_alone_min']:.5f}; "
              f"tokens {g['tokens_infer']} / {g['tokens_llama']}")
    if agreement["tokens_infer"] != agreement["tokens_llama"]:
        print("warning: the servers counted different tokens (tokenization or usage differs)", file=sys.stderr)


if __name__ == "__main__":
    main()
