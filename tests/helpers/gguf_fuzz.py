"""Hostile GGUF files for the fuzz tests (tests/test_fuzz_gguf.py) and the long run
(scripts/fuzz_gguf.py): valid tiny models of every architecture, mutated where a loader must not
trust them, and a worker process that loads and runs each one.

mutate() picks fields of the header by what they are (counts, lengths, value types, dimension
counts, dimensions, tensor types, offsets, the alignment, token ids in the metadata) and gives
them extreme or random values; or flips bits, overwrites bytes, truncates, or appends.  The
worker (`python tests/helpers/gguf_fuzz.py`, one path per stdin line) answers one line per file: OK,
ERR <message> (one of the errors the CLI reports as one line), RUN <message> (a one-line error
too, but from a forward pass: the loader let a file through that a kernel then failed on), or
TB <exception> when an exception would have reached the user as a traceback.  A crash or a hang shows as the worker's
death or silence, which the caller detects.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

EXTREME = [0, 1, 2, 3, 4, 7, 31, 32, 255, 256, 2**16, 2**20, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62,
           2**63 - 1, 2**63, 2**64 - 1]
TOKEN_KEYS = (b"tokenizer.ggml.bos_token_id", b"tokenizer.ggml.eos_token_id", b"tokenizer.ggml.padding_token_id",
              b"tokenizer.ggml.unknown_token_id", b"tokenizer.ggml.eot_token_id")


def fields(b: bytes) -> list[tuple[str, int, int]]:
    """(kind, position, size) of the header's fields, as far as the header parses."""
    out: list[tuple[str, int, int]] = []
    pos = 8

    def u(n: int) -> int:
        nonlocal pos
        if pos + n > len(b):
            raise IndexError
        v = int.from_bytes(b[pos:pos + n], "little")
        pos += n
        return v

    def string(kind: str) -> bytes:
        nonlocal pos
        out.append((kind, pos, 8))
        n = u(8)
        s = b[pos:pos + n]
        pos += n
        return s

    try:
        out += [("n_tensors", pos, 8), ("n_kv", pos + 8, 8)]
        n_tensors, n_kv = u(8), u(8)
        for _ in range(min(n_kv, 10_000)):
            key = string("key_len")
            out.append(("vtype", pos, 4))
            vtype = u(4)
            value_at = pos
            if vtype == 8:
                string("str_len")
            elif vtype == 9:
                out.append(("atype", pos, 4))
                etype = u(4)
                out.append(("acount", pos, 8))
                count = u(8)
                if etype == 8:
                    for i in range(count):
                        string("str_len" if i < 4 else "vocab_len")
                else:
                    pos += count * {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}.get(etype, 1)
            else:
                size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}.get(vtype, 4)
                kind = "token_id" if key in TOKEN_KEYS else "alignment" if key == b"general.alignment" else "scalar"
                out.append((kind, value_at, size))
                pos += size
        for _ in range(min(n_tensors, 10_000)):
            string("name_len")
            out.append(("n_dims", pos, 4))
            n_dims = u(4)
            for _ in range(min(n_dims, 8)):
                out.append(("dim", pos, 8))
                u(8)
            out.append(("ttype", pos, 4))
            u(4)
            out.append(("offset", pos, 8))
            u(8)
    except IndexError:
        pass
    return out


def mutate(seed_bytes: bytes, rng: random.Random) -> bytes:
    b = bytearray(seed_bytes)
    fs = fields(bytes(b))
    header_end = max((p + s for _, p, s in fs), default=64)
    for _ in range(rng.randint(1, 3)):
        how = rng.random()
        if how < 0.6 and fs:
            kind, pos, size = rng.choice(fs)
            if kind in ("vtype", "atype", "ttype") and rng.random() < 0.7:
                v = rng.choice([rng.randrange(40), rng.choice(EXTREME)])
            elif kind in ("token_id", "n_dims") and rng.random() < 0.7:
                v = rng.choice([rng.randrange(1 << 20), 2**31 - 1, 2**32 - 1, 5])
            elif kind == "offset" and rng.random() < 0.5:  # another tensor's offset: overlapping data
                other = [p for k, p, _ in fs if k == "offset"]
                v = int.from_bytes(b[rng.choice(other):rng.choice(other) + 8], "little") if other else 0
            else:
                v = rng.choice(EXTREME) if rng.random() < 0.7 else rng.getrandbits(8 * size)
            b[pos:pos + size] = (v % (1 << (8 * size))).to_bytes(size, "little")
        elif how < 0.75:
            j = rng.randrange(min(header_end, len(b)))
            b[j] ^= 1 << rng.randrange(8)
        elif how < 0.85:
            j = rng.randrange(min(header_end, len(b)))
            k = rng.randint(1, 16)
            b[j:j + k] = bytes(rng.randrange(256) for _ in range(k))
        elif how < 0.95:
            del b[rng.randrange(len(b)):]
            break
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
    return bytes(b)


def seeds(folder: Path) -> list[Path]:
    """A valid tiny model of every architecture that generates (and llama with experts), written once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` for this file run as a worker
    from helpers.tiny_models import DECODERS, write_tiny_model

    out = []
    for arch in [*DECODERS, "llama-moe"]:
        p = folder / f"seed-{arch}.gguf"
        if not p.exists():
            write_tiny_model(p, arch)
        out.append(p)
    return out


def run_cases(cases: list[Path], timeout: float = 60.0, worker_argv: list[str] | None = None) -> list[tuple[Path, str]]:
    """Each case through the worker: (path, answer) with answer OK / ERR ... / TB ... from the
    worker, or CRASH <signal or exit code> / HANG when the worker died or said nothing for
    `timeout` seconds on that case (a new worker takes the next one). The worker is this file's
    (load and run a model) unless `worker_argv` names another script speaking the same protocol
    (serve())."""
    import os
    import selectors
    import subprocess

    results: list[tuple[Path, str]] = []
    proc = None
    for case in cases:
        if proc is None:
            proc = subprocess.Popen([sys.executable, *(worker_argv or [__file__])], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("the fuzz worker did not start")
        proc.stdin.write(f"{case}\n")
        proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        answer = proc.stdout.readline().strip() if sel.select(timeout) else None
        sel.close()
        if answer:
            results.append((case, answer))
            continue
        if answer is None:  # silent past the timeout
            proc.kill()
            results.append((case, "HANG"))
        else:
            code = proc.wait()
            results.append((case, f"CRASH {code}"))
        proc.wait()
        proc = None
    if proc is not None:
        proc.stdin.close()
        proc.wait()
    return results


def serve(handle) -> None:
    """The worker's loop: `handle(path)` for each path on stdin, one answer line each: OK when it
    returns, ERR / RUN for the errors the CLI reports as one line, TB for anything else."""
    import traceback

    from infer.cli.errors import user_errors
    from infer.engine.engine import ModelRunError

    expected = user_errors()
    print("READY", flush=True)
    for line in sys.stdin:
        path = line.strip()
        if path.endswith((".selftest-crash", ".selftest-hang", ".selftest-tb")):  # the harness's own checks
            import os
            import signal
            import time

            if path.endswith("crash"):
                os.kill(os.getpid(), signal.SIGSEGV)
            if path.endswith("hang"):
                time.sleep(3600)
            print("TB RuntimeError: selftest at gguf_fuzz.py", flush=True)
            continue
        try:
            handle(path)
            answer = "OK"
        except ModelRunError as e:  # one line for the user, but a kernel ran on what the loader let through
            answer = "RUN " + str(e).splitlines()[0][:200]
        except expected as e:
            answer = "ERR " + (str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        except Exception as e:  # what the CLI would show as a traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            answer = f"TB {type(e).__name__}: {str(e)[:120]!r} at {Path(where.filename).name}:{where.lineno}"
        print(answer.replace("\n", " "), flush=True)


def worker() -> None:
    """Load each model (file or folder) named on stdin and generate two tokens from it."""
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.engine.sampler import SamplingParams

    def load_and_run(path: str) -> None:
        llm = LLM.load(path, EngineConfig(n_ctx=64, n_threads=1, max_seqs=1))
        ids = llm.encode_raw("Hello world")[:32]
        list(llm.generate(ids, SamplingParams(max_tokens=2, temperature=0)))

    serve(load_and_run)


if __name__ == "__main__":
    worker()
