"""Where the cpu backend's numbers part from llama.cpp's, layer by layer, on one prompt.

Runs the prompt through llama.cpp (llama-cpp-python's low-level API, with an eval callback that
copies every float32 tensor it computes) and through infer's cpu backend (CpuRunner.trace,
which names its intermediates as llama.cpp does), then decodes -n tokens, both sides fed
llama.cpp's greedy choice.  Prints, for the last step, each intermediate's largest difference
relative to llama.cpp's largest value and how many elements are not bit-identical; and, for every
step, the logits' largest difference and whether the argmax agrees.

    python scripts/compare_llamacpp.py [--model PATH] [--prompt TEXT] [-n 8] [--threads 2] [--flash-attn]
    python scripts/compare_llamacpp.py --force [--model PATH] [--prompt TEXT]
    python scripts/compare_llamacpp.py --greedy PROMPTS.json [--model PATH] [-n 32]

Why it exists: both engines round activations to 8 bits before each quantized product, so a
one-ulp difference in a float sum (llama.cpp sums in SIMD lanes whose order depends on the kernel
and the CPU) moves some quants by a step, and the difference grows layer by layer.

--force measures each op alone instead (forced_ops): every intermediate of infer's is replaced by
llama.cpp's once compared, so each op starts from llama.cpp's own inputs.  The products then
differ in their last bits (the order of their sums), and everything else should be identical:
an op that is not is computing something else (issue 41 found the RoPE's fused multiply-adds,
Q4_1/Q5_1's Q8_1 sums and the GELU table's rounding this way).

--greedy measures what a user sees (greedy_agreement): infer's greedy continuations against
llama.cpp's default path, beside llama.cpp's flash-attention path as the yardstick of its own
spread; run it on two checkouts to bisect a change in agreement.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
from dataclasses import dataclass, field

import numpy as np

ALIASES = {"sa_out": "ffn_inp", "ffn_geglu": "ffn_act", "ffn_swiglu": "ffn_act",
           # lfm2 (llama.cpp's src/models/lfm2.cpp names them after the HF modules)
           "model.layers.{}.operator_norm": "attn_norm", "model.layers.{}.conv.in_proj": "shortconv_in_proj",
           "model.layers.{}.conv.out_proj": "shortconv_out_proj", "model.layers.{}.ffn_norm": "ffn_norm"}
# names that mean another thing in another architecture's graph: olmo2's "attn_post_norm" is the
# attention output's norm, qwen35's the FFN's input norm
ARCH_ALIASES = {
    # qwen35 (src/models/qwen35.cpp): the residual before the FFN, its norm, the attention before its output gate
    "qwen35": {"attn_residual": "ffn_inp", "attn_post_norm": "ffn_norm", "attn_pregate": "kqv_out"},
    # qwen35moe, qwen3next (src/models/qwen35moe.cpp, qwen3next.cpp): qwen35's names
    "qwen35moe": {"attn_residual": "ffn_inp", "attn_post_norm": "ffn_norm", "attn_pregate": "kqv_out"},
    "qwen3next": {"attn_residual": "ffn_inp", "attn_post_norm": "ffn_norm", "attn_pregate": "kqv_out"},
    # llama4 (src/models/llama4.cpp): its "ffn_out" is the residual sum after the FFN, the experts and
    # shared expert's sum "ffn_moe_out_merged"; in a layer of experts its "ffn_norm" names the
    # attention's output, not the norm: neither is compared
    "llama4": {"ffn_out": "llama4_ffn_residual", "ffn_moe_out_merged": "ffn_out", "ffn_moe_shexp": "ffn_shexp",
               "ffn_norm": "llama4_ffn_norm"},
}


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
        arch = ctypes.create_string_buffer(64)
        L.llama_model_meta_val_str(self.model, b"general.architecture", arch, len(arch))
        self.aliases = {**ALIASES, **ARCH_ALIASES.get(arch.value.decode(), {})}

    def _on_tensor(self, t, ask, _user):
        if ask:
            return True  # yes, show it to us once computed
        tt = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        ne, nb = list(tt.ne), list(tt.nb)
        if tt.type != 0 or not tt.data or 0 in ne or nb[1] != 4 * ne[0] or nb[2] != nb[1] * ne[1] or nb[3] != nb[2] * ne[2]:
            return True  # only contiguous float32 tensors
        name = tt.name.decode()
        m = re.fullmatch(r"(.+)-(\d+)", name)
        if m and m.group(1) in self.aliases:
            name = f"{self.aliases[m.group(1)]}-{m.group(2)}"
        n = ne[0] * ne[1] * ne[2] * ne[3]
        a = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float)), shape=(n,))
        rows = n // ne[0]
        self.seen[name] = a.reshape(rows, ne[0]).copy()
        # and by width: a name llama.cpp gives several tensors (deepseek2's "q": Q's compression,
        # its norm, attn_q_b's product, that reshaped per head) is found by the width infer's has
        self.seen[f"{name}@{ne[0]}"] = self.seen[name]
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
        """What was seen, with infer's stacked products assembled from llama.cpp's parts: "qkv" from
        the Q, K and V products (or the fused one, "wqkv"), "ffn_gate_up" from the gate and up ones
        (or a fused up, which holds both)."""
        out = dict(self.seen)
        for il in range(1000):
            if f"l_out-{il}" not in out:
                break
            for name, parts in (("qkv", ("Qcur@mm", "Kcur@mm", "Vcur@mm")), ("qkv", ("wqkv",)),
                                ("ffn_gate_up", ("ffn_gate", "ffn_up")), ("ffn_gate_up", ("ffn_up",))):
                arrs = [out.get(f"{n}-{il}") for n in parts]
                if f"{name}-{il}" not in out and all(a is not None for a in arrs) and len({a.shape[0] for a in arrs}) == 1:
                    out[f"{name}-{il}"] = np.concatenate(arrs, axis=1)
            self._qwen35(out, il)
        return out

    @staticmethod
    def _qwen35(out: dict[str, np.ndarray], il: int) -> None:
        """qwen35's products as infer stacks them: a gated attention's "qkv" is Q|K|V|gate (llama.cpp's
        Qcur_full interleaves each head's Q and gate), a gated delta net's "ssm_in" is Q|K|V, z,
        beta, alpha side by side (beta's product reshaped to one value per row there)."""
        full, k, v, q_normed = (out.get(f"{n}-{il}") for n in ("Qcur_full", "Kcur@mm", "Vcur@mm", "Qcur_normed"))
        if full is not None and k is not None and v is not None and q_normed is not None:
            T, hd = full.shape[0], q_normed.shape[1]
            heads = full.reshape(T, -1, 2, hd)
            out[f"qkv-{il}"] = np.concatenate([heads[:, :, 0].reshape(T, -1), k, v, heads[:, :, 1].reshape(T, -1)], 1)
        parts = [out.get(f"{n}-{il}") for n in ("linear_attn_qkv_mixed", "z", "beta", "alpha")]
        if all(a is not None for a in parts):
            T = parts[0].shape[0]
            out[f"ssm_in-{il}"] = np.concatenate([a.reshape(T, -1) for a in parts], axis=1)


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


def forced_ops(runner, ref: LlamaCppTracer, tokens: list[int], pos: int, cache) -> dict[str, list]:
    """Feed tokens at pos through llama.cpp and through runner, replacing each of runner's traced
    intermediates by llama.cpp's once compared (where llama.cpp has it: the rows it keeps), so each
    op is measured from llama.cpp's inputs.  Returns {op: [elements not bit-identical, elements,
    max |diff| / max |llama.cpp|]} over the layers ("attn_norm" for every "attn_norm-il")."""
    ref.decode(tokens)
    seen = ref.intermediates()
    stats: dict[str, list] = {}

    def on(name, a):
        a2 = a.reshape(a.shape[0], -1)
        b = seen.get(name)
        if b is not None and b.shape[1:] != a2.shape[1:]:
            b = seen.get(f"{name}@{a2.shape[1]}", b)
        if b is None or b.shape[1:] != a2.shape[1:] or b.shape[0] > a2.shape[0]:
            return
        mine = a2[a2.shape[0] - b.shape[0]:]  # llama.cpp keeps only the output rows at its last layer
        st = stats.setdefault(re.sub(r"-\d+$", "", name), [0, 0, 0.0])
        st[0] += int((mine != b).sum())
        st[1] += b.size
        st[2] = max(st[2], float(np.abs(mine - b).max()) / (float(np.abs(b).max()) or 1.0))
        mine[:] = b

    runner.trace = on
    try:
        runner.forward(np.array(tokens, np.int32), pos, cache)
    finally:
        runner.trace = None
    return stats


# -- greedy agreement: infer and llama.cpp's flash-attention path, each against its default path ---

@dataclass
class Agreement:
    """How close greedy continuations are to llama.cpp's default path's."""

    first: int  # prompts whose first greedy token is the default path's
    whole: int  # prompts whose whole continuation is
    prefix: float  # mean tokens in common with it from the start

    @classmethod
    def of(cls, runs: list[list[int]], refs: list[list[int]]) -> "Agreement":
        common = [next((i for i, (a, b) in enumerate(zip(r, f)) if a != b), len(f)) for r, f in zip(runs, refs)]
        return cls(sum(r[0] == f[0] for r, f in zip(runs, refs)), sum(r == f for r, f in zip(runs, refs)),
                   float(np.mean(common)))

    def at_least(self, other: "Agreement") -> bool:
        return self.first >= other.first and self.whole >= other.whole and self.prefix >= other.prefix


class LlamaCppSteps:
    """One llama-cpp-python context stepped a token at a time (its default path, or flash attention)."""

    def __init__(self, path: str, n_ctx: int, n_threads: int, flash_attn: bool):
        import llama_cpp

        self.L = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False,
                                   flash_attn=flash_attn)

    def _logits(self) -> np.ndarray:
        ptr = self.L.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).copy()

    def start(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return self._logits()

    def step(self, tok: int) -> np.ndarray:
        self.llm.eval([tok])
        return self._logits()

    def close(self) -> None:
        self.llm.close()


class InferSteps:
    """An infer runner stepped the same way: the prompt in one call, then a token per call."""

    def __init__(self, runner, n_ctx: int):
        self.runner, self.n_ctx = runner, n_ctx

    def start(self, ids: list[int]) -> np.ndarray:
        self.cache, self.pos = self.runner.new_kv_cache(self.n_ctx), len(ids)
        return self.runner.forward(np.array(ids, np.int32), 0, self.cache)[0].copy()

    def step(self, tok: int) -> np.ndarray:
        out = self.runner.forward(np.array([tok], np.int32), self.pos, self.cache)[0].copy()
        self.pos += 1
        return out


def greedy(side, ids: list[int], n: int, forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens after ids (each step fed forced's token instead, if given) and the logits
    each came from."""
    logits = side.start(ids)
    toks, seen = [], []
    for i in range(n):
        seen.append(logits)
        toks.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = side.step(toks[-1] if forced is None else forced[i])
    return toks, seen


@dataclass
class AgreementReport:
    ours: Agreement
    fa: Agreement  # llama.cpp's flash-attention path: the yardstick
    dist_ours: float  # teacher forced (fed the default path's tokens): max |logit diff|, mean over prompts
    dist_fa: float
    # prompts whose first token differs from the default path's: (prompt ids, how far below its
    # top llama.cpp scores ours, how far llama.cpp's two paths differ there)
    first_gaps: list[tuple[list[int], float, float]] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"infer {self.ours}, llama.cpp flash attention {self.fa}; teacher-forced max |logit diff| "
                f"(mean over prompts) infer {self.dist_ours:.4g}, flash attention {self.dist_fa:.4g}")


def greedy_agreement(ours, ref: LlamaCppSteps, fa: LlamaCppSteps, prompts: list[list[int]], n: int) -> AgreementReport:
    """ours (InferSteps) and fa against ref (llama.cpp's default path), n greedy tokens per prompt."""
    refs, mine, theirs, dist_ours, dist_fa, gaps = [], [], [], [], [], []
    for ids in prompts:
        r, r_logits = greedy(ref, ids, n)
        refs.append(r)
        mine.append(greedy(ours, ids, n)[0])
        theirs.append(greedy(fa, ids, n)[0])
        for side, dist in ((ours, dist_ours), (fa, dist_fa)):
            _, logits = greedy(side, ids, n, forced=r)
            dist.append(max(float(np.abs(a - b).max()) for a, b in zip(logits, r_logits)))
        if mine[-1][0] != r[0]:
            lr = r_logits[0]
            gaps.append((ids, float(lr.max() - lr[mine[-1][0]]), float(np.abs(lr - fa.start(ids)).max())))
    return AgreementReport(Agreement.of(mine, refs), Agreement.of(theirs, refs), float(np.mean(dist_ours)),
                           float(np.mean(dist_fa)), gaps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded Gemma 3 270M Q4_K_M)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("-n", "--steps", type=int, default=None, help="greedy decode steps after the prompt (default 8; "
                   "--greedy: 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash-attention path")
    p.add_argument("--force", action="store_true", help="each op from llama.cpp's inputs (forced_ops): "
                   "the prompt, then one decode step")
    p.add_argument("--greedy", metavar="PROMPTS.json", help="greedy agreement (greedy_agreement) over a JSON "
                   "list of prompts, -n tokens each (default 32), against llama.cpp's default path")
    args = p.parse_args(argv)
    args.steps = args.steps or (32 if args.greedy else 8)

    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.models.default import default_model_path

    path = str(args.model or default_model_path())
    llm = LLM.load(path, EngineConfig(n_ctx=args.ctx, n_threads=args.threads, backend="cpu"))
    runner = llm.runner
    if args.greedy:
        with open(args.greedy, encoding="utf-8") as f:
            texts = json.load(f)
        ref, fa = (LlamaCppSteps(path, args.ctx, args.threads, a) for a in (False, True))
        prompts = [ref.llm.tokenize(t.encode(), add_bos=True, special=True) for t in texts]
        print(f"{len(prompts)} prompts x {args.steps} greedy tokens against llama.cpp's default path:")
        print(greedy_agreement(InferSteps(runner, args.ctx), ref, fa, prompts, args.steps))
        return 0
    seen: dict[str, np.ndarray] = {}
    runner.trace = lambda name, a: seen.__setitem__(name, a.copy())
    ref = LlamaCppTracer(path, args.ctx, args.threads, args.flash_attn)

    ids = llm.tokenizer.encode(args.prompt, add_special=True, parse_special=True)
    cache = runner.new_kv_cache(args.ctx)
    if args.force:
        runner.trace = None
        for what, feed, pos in (("prompt", ids, 0), ("decode step", ids[-1:], len(ids))):
            print(f"{what} ({len(feed)} tokens), each op from llama.cpp's inputs: "
                  "elements not bit-identical, max |diff| / max |llama.cpp|")
            for name, (n_diff, n, rel) in forced_ops(runner, ref, feed, pos, cache).items():
                print(f"  {name:16s} {n_diff:9d}/{n:<9d} {rel:.2e}")
        return 0
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
