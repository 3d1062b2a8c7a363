"""Where the cpu backend's numbers part from llama.cpp's, layer by layer, on one prompt.

Runs the prompt through llama.cpp (llama-cpp-python's low-level API, with an eval callback that
copies every float32 tensor it computes) and through infer's cpu backend (CpuTransformer.trace,
which names its intermediates as llama.cpp does), then decodes -n tokens, both sides fed
llama.cpp's greedy choice.  Prints, for the last step, each intermediate's largest difference
relative to llama.cpp's largest value and how many elements are not bit-identical; and, for every
step, the logits' largest difference and whether the argmax agrees.

    python scripts/compare_llamacpp.py [--model PATH] [--prompt TEXT] [-n 8] [--threads 2] [--flash-attn]

Why it exists: both engines round activations to 8 bits before each quantized product, so a
one-ulp difference in a float sum (llama.cpp sums in SIMD lanes whose order depends on the kernel
and the CPU) moves some quants by a step, and the difference grows layer by layer.
"""
from __future__ import annotations

import argparse
import ctypes
import re

import numpy as np

ALIASES = {"sa_out": "ffn_inp", "ffn_geglu": "ffn_act", "ffn_swiglu": "ffn_act"}


class _Tensor(ctypes.Structure):
    # struct ggml_tensor (ggml.h), as far as the name: GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


class LlamaCppTracer:
    """One llama.cpp context whose eval callback keeps the last value of every named f32 tensor."""

    def __init__(self, path: str, n_ctx: int, n_threads: int, flash_attn: bool):
        import llama_cpp as L

        self.L = L
        self.seen: dict[str, np.ndarray] = {}
        self._cb = L.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with the context
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_ctx, n_ctx
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.cb_eval = self._cb
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))

    def _on_tensor(self, t, ask, _user):
        if ask:
            return True  # yes, show it to us once computed
        tt = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        ne, nb = list(tt.ne), list(tt.nb)
        if tt.type != 0 or not tt.data or nb[1] != 4 * ne[0] or nb[2] != nb[1] * ne[1] or nb[3] != nb[2] * ne[2]:
            return True  # only contiguous float32 tensors
        name = tt.name.decode()
        m = re.fullmatch(r"(\w+)-(\d+)", name)
        if m and m.group(1) in ALIASES:
            name = f"{ALIASES[m.group(1)]}-{m.group(2)}"
        n = ne[0] * ne[1] * ne[2] * ne[3]
        a = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float)), shape=(n,))
        rows = n // ne[0]
        self.seen[name] = a.reshape(rows, ne[0]).copy()
        if m and m.group(1) in ("Qcur", "Kcur", "Vcur"):
            # the first tensor of that name in a decode is the product (then norms and RoPE reuse it)
            self.seen.setdefault(f"{m.group(1)}@mm-{m.group(2)}", self.seen[name])
        return True

    def decode(self, tokens: list[int]) -> np.ndarray:
        L = self.L
        self.seen.clear()
        arr = (L.llama_token * len(tokens))(*tokens)
        if L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()

    def intermediates(self) -> dict[str, np.ndarray]:
        out = dict(self.seen)
        for il in range(1000):
            parts = [out.get(f"{n}@mm-{il}") for n in ("Qcur", "Kcur", "Vcur")]
            if parts[0] is None:
                break
            out[f"qkv-{il}"] = np.concatenate(parts, axis=1)
        return out


def compare(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> list[tuple[str, float, int, int]]:
    """(name, max |diff| / max |ref|, elements not bit-identical, elements) for the last row of every
    intermediate both sides have, in our order."""
    rows = []
    for name, a in ours.items():
        b = ref.get(name)
        if b is None or b.shape[1] != a.shape[1]:
            continue
        a, b = a[-1], b[-1]  # llama.cpp keeps only the output rows at its last layer
        scale = float(np.abs(b).max()) or 1.0
        rows.append((name, float(np.abs(a - b).max()) / scale, int((a != b).sum()), a.size))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded Gemma 3 270M Q4_K_M)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("-n", "--steps", type=int, default=8, help="greedy decode steps after the prompt")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash-attention path")
    args = p.parse_args(argv)

    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.models.default import default_model_path

    path = str(args.model or default_model_path())
    llm = LLM.load(path, EngineConfig(n_ctx=args.ctx, n_threads=args.threads, backend="cpu"))
    runner = llm.runner
    seen: dict[str, np.ndarray] = {}
    runner.trace = lambda name, a: seen.__setitem__(name, a.copy())
    ref = LlamaCppTracer(path, args.ctx, args.threads, args.flash_attn)

    ids = llm.tokenizer.encode(args.prompt, add_special=True, parse_special=True)
    cache = runner.new_kv_cache(args.ctx)
    feed, pos = ids, 0
    print(f"{len(ids)} prompt tokens, then {args.steps} decode steps (both fed llama.cpp's greedy token)")
    print("step  max|logit diff|  max|logit|  argmax same  top-2 margin (llama.cpp)")
    for step in range(args.steps + 1):
        seen.clear()
        lr = ref.decode(feed)
        lo = runner.forward(np.array(feed, np.int32), pos, cache)[0].copy()
        top2 = np.sort(lr)[-2:]
        print(f"{step:4d}  {np.abs(lr - lo).max():15.4f}  {np.abs(lr).max():10.2f}  "
              f"{str(int(np.argmax(lo)) == int(np.argmax(lr))):>11s}  {top2[1] - top2[0]:.4f}")
        pos += len(feed)
        feed = [int(np.argmax(lr))]
    print("\nlast step, each intermediate (last token): max|diff| / max|llama.cpp|, elements not bit-identical")
    for name, rel, n_diff, n in compare(seen, ref.intermediates()):
        print(f"  {name:16s} {rel:10.2e}  {n_diff:6d}/{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
