"""infer against llama.cpp's native llama-bench and llama-server on random-weight GGUFs of real model shapes.

Random weights run at real speed: what decode and prefill cost depends on the shapes and the
storage types, not on the values.  For each shape the script writes an F16 GGUF with gguf's
writer (weights ~ N(0, 0.02), a SentencePiece-style vocabulary of the real size), quantizes it
with llama.cpp's own llama_model_quantize (llama-cpp-python) to each type, and measures on the
same file, with the same threads, one program after the other:

- pp512 / tg128: `llama-bench -p 512 -n 128` against `infer bench -p 512 -n 128` (tok/s, mean of
  the repetitions; the programs alternate for --rounds turns and each keeps its best), and each
  program's peak RSS;
- load: start-to-first-token of `llama-server` against `infer serve` (both -c 4096, one slot, one
  1-token completion of a short prompt, timed from process start), and each server's peak RSS.

Files are cached in $INFER_BENCH_CACHE (default ~/.cache/infer-bench): llama.cpp's programs are
built there once by scripts/build_llama_bench.sh (about 7 minutes), models once per shape and type.
Results are appended to a JSON-lines file as they come and printed as one table at the end.

    python scripts/bench_shapes.py [--shapes deepseek-r1-qwen-1.5b,...] [--types Q4_K_M,Q8_0]
        [--threads 2] [--repetitions 2] [--rounds 2] [--no-load] [--embedded] [--out FILE]
        [--cache-type q8_0] [--depth 16384]

--depth N adds tg128 after N tokens of context (llama-bench -d, infer bench -d) for both programs.
Each shape's KV cache bytes per token of context are printed for both (llama.cpp's from its log).
--cache-type sets both programs' K and V cache types (-ctk/-ctv; llama.cpp picks flash attention
itself, which a quantized V needs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_shapes_layers import Mla, add_vocab, gemma4_kvs, gemma4_tensors, mla_layer, qwen35_mixer

ROOT = Path(__file__).resolve().parent.parent
BENCH_CTX = 4096  # infer bench's context (-c), and llama.cpp's where its KV cache is sized
CACHE = Path(os.environ.get("INFER_BENCH_CACHE", Path.home() / ".cache" / "infer-bench"))


@dataclass(frozen=True)
class Shape:
    arch: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    tied: bool  # output projection shares the token embedding
    rope_base: float
    head_dim: int = 0  # 0: n_embd / n_head
    n_expert: int = 0  # a mixture of experts (qwen3moe): experts, used per token, each one's width
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0  # qwen35moe: a shared expert's width, scaled by a sigmoid gate
    # qwen35 / qwen35moe: every attn_interval-th layer gated attention (Q and its output gate), the
    # others gated delta nets with ssm_hk key heads and ssm_hv value heads of ssm_s dims, a
    # convolution of width 4; RoPE over n_rot dims of each head (IMROPE sections, NeoX for text)
    attn_interval: int = 0
    ssm_hk: int = 16
    ssm_hv: int = 32
    ssm_s: int = 128
    n_rot: int = 0
    n_ctx_train: int = 4096  # the file's context_length (the engine sizes no context past it; -d needs room)
    mla: Mla | None = None  # deepseek2: multi-head latent attention, shared experts, dense first layers
    # gemma4: every swa_period-th layer global (head size head_dim_global, RoPE over a quarter of it
    # through rope_freqs), the others sliding-window (head_dim, sliding_window tokens); per-layer
    # embeddings n_embd_per_layer wide; the last n_shared_kv layers keep no K/V and have FFNs twice
    # n_ff wide; final logits soft-capped at logit_softcap
    head_dim_global: int = 0
    swa_period: int = 0
    sliding_window: int = 0
    n_embd_per_layer: int = 0
    n_shared_kv: int = 0
    logit_softcap: float = 0.0


# The real models' hyperparameters (their config.json), with random weights.
SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, True, 1e6),
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, True, 5e5),
    "deepseek-r1-qwen-1.5b": Shape("qwen2", 1536, 8960, 28, 12, 2, 151936, False, 1e4),
    "llama-3.2-3b": Shape("llama", 3072, 8192, 28, 24, 8, 128256, True, 5e5),
    "qwen2.5-7b": Shape("qwen2", 3584, 18944, 28, 28, 4, 152064, False, 1e6),
    # Qwen3-30B-A3B's layers (128 experts of width 768, 8 per token), 4 of its 48 to fit this machine
    "qwen3-30b-a3b-4l": Shape("qwen3moe", 2048, 6144, 4, 32, 4, 151936, False, 1e6, 128, 128, 8, 768),
    # gpt-oss-20b's layers (32 experts of width 2880, 4 per token; sinks, biases, a 128-token window
    # every other layer, YaRN), 4 of its 24; its files are MXFP4_MOE (2880 is no multiple of 256)
    "gpt-oss-20b-4l": Shape("gpt-oss", 2880, 2880, 4, 64, 8, 201088, False, 150000, 64, 32, 4, 2880),
    # Qwen3.5-4B: 32 layers, every 4th gated attention (16 heads of 256, 4 KV heads), the rest gated
    # delta nets (16 key heads, 32 value heads of 128); tied embeddings, a 248k vocabulary
    "qwen3.5-4b": Shape("qwen35", 2560, 9216, 32, 16, 4, 248320, True, 1e7, 256, attn_interval=4, n_rot=64,
                        n_ctx_train=262144),
    # Qwen3.5-35B-A3B's layers (256 experts of width 512, 8 per token, a shared expert of 512), 4 of its 40
    "qwen3.5-35b-a3b-4l": Shape("qwen35moe", 2048, 512, 4, 16, 2, 248320, False, 1e7, 256, 256, 8, 512,
                                n_ff_shexp=512, attn_interval=4, n_rot=64, n_ctx_train=262144),
    # DeepSeek-V2-Lite's layers, 4 of its 27: MLA over a 512-wide latent (16 heads, no Q compression;
    # one KV head of latent | RoPE part, as llama.cpp's converter writes it), the first layer dense
    # (10944), then 64 experts of 1408, 6 per token, with 2 shared; softmax gating, YaRN x40
    "deepseek-v2-lite-4l": Shape("deepseek2", 2048, 10944, 4, 16, 1, 102400, False, 1e4, 0, 64, 6, 1408,
                                 n_ctx_train=163840, mla=Mla(512, 128, 64, 128, 1, 2, 40.0, 4096, 0.707)),
    # Gemma 4 E2B's text model (google/gemma-4-E2B config.json text_config, as llama.cpp's
    # convert_hf_to_gguf.py Gemma4Model writes it): hidden_size 1536, intermediate_size 6144,
    # num_hidden_layers 35, num_attention_heads 8, num_key_value_heads 1 (num_global_key_value_heads
    # null: one KV head on every layer), vocab_size 262144, tie_word_embeddings; head_dim 256 on the
    # sliding layers, global_head_dim 512 on the full ones; layer_types 4 sliding + 1 full, repeated
    # (full at 4, 9, ..., 34), sliding_window 512; rope_parameters: full_attention theta 1e6 with
    # partial_rotary_factor 0.25 (rope_freqs), sliding_attention theta 1e4; hidden_size_per_layer_input
    # 256; num_kv_shared_layers 20 with use_double_wide_mlp (layers 15-34 12288 wide);
    # attention_k_eq_v false (every layer with K/V has its own attn_v); final_logit_softcapping 30;
    # max_position_embeddings 131072 (llama.cpp's llama-model.cpp names a 35-layer gemma4 E2B)
    "gemma4-e2b": Shape("gemma4", 1536, 6144, 35, 8, 1, 262144, True, 1e6, 256, head_dim_global=512,
                        swa_period=5, sliding_window=512, n_embd_per_layer=256, n_shared_kv=20,
                        logit_softcap=30.0, n_ctx_train=131072),
}
# llama.cpp's llama_ftype of each target type
FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7, "MXFP4_MOE": 38}


def write_f16(shape: Shape, path: Path) -> None:
    """The shape as an F16 GGUF, streamed tensor by tensor (a 7B never sits in memory whole)."""
    import gguf

    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 24) * 0.02).astype(np.float16)
    D, F, H, Hkv = shape.n_embd, shape.n_ff, shape.n_head, shape.n_head_kv
    hd = shape.head_dim or D // H
    E, Fe = shape.n_expert, shape.n_ff_exp
    tensors: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (shape.n_vocab, D), True),
                                                       ("output_norm.weight", (D,), False)]
    if not shape.tied:
        tensors.append(("output.weight", (shape.n_vocab, D), True))
    oss = shape.arch == "gpt-oss"
    if shape.arch == "gemma4":
        tensors += gemma4_tensors(shape)
    for i in range(shape.n_layer if shape.arch != "gemma4" else 0):
        p = f"blk.{i}."
        if shape.mla is not None:
            tensors += mla_layer(shape, p, i)
            continue
        if shape.attn_interval:
            tensors += qwen35_mixer(shape, p, (i + 1) % shape.attn_interval == 0)
        else:
            tensors += [(p + "attn_norm.weight", (D,), False), (p + "attn_q.weight", (H * hd, D), True),
                        (p + "attn_k.weight", (Hkv * hd, D), True), (p + "attn_v.weight", (Hkv * hd, D), True),
                        (p + "attn_output.weight", (D, H * hd), True),
                        (p + ("post_attention_norm" if oss else "ffn_norm") + ".weight", (D,), False)]
        if shape.n_ff_shexp:  # qwen35moe's shared expert and its gate
            Fs = shape.n_ff_shexp
            tensors += [(p + "ffn_gate_inp_shexp.weight", (D,), False), (p + "ffn_gate_shexp.weight", (Fs, D), True),
                        (p + "ffn_up_shexp.weight", (Fs, D), True), (p + "ffn_down_shexp.weight", (D, Fs), True)]
        if E and shape.attn_interval:
            tensors += [(p + "ffn_gate_inp.weight", (E, D), True), (p + "ffn_gate_exps.weight", (E, Fe, D), True),
                        (p + "ffn_up_exps.weight", (E, Fe, D), True), (p + "ffn_down_exps.weight", (E, D, Fe), True)]
        elif E:  # the router and the experts' 3-D tensors; qwen3's Q/K norms
            tensors += [] if oss else [(p + "attn_q_norm.weight", (hd,), False), (p + "attn_k_norm.weight", (hd,), False)]
            tensors += [(p + "ffn_gate_inp.weight", (E, D), True), (p + "ffn_gate_exps.weight", (E, Fe, D), True),
                        (p + "ffn_up_exps.weight", (E, Fe, D), True), (p + "ffn_down_exps.weight", (E, D, Fe), True)]
        if oss:  # its sinks and biases (vectors, and a bias row per expert), kept in F32 by the quantizer
            tensors += [(p + "attn_sinks.weight", (H,), False), (p + "attn_output.bias", (D,), False),
                        (p + "ffn_gate_inp.bias", (E,), False), (p + "ffn_gate_exps.bias", (E, Fe), False),
                        (p + "ffn_up_exps.bias", (E, Fe), False), (p + "ffn_down_exps.bias", (E, D), False)]
        elif not (E and shape.attn_interval):  # qwen35moe's layers have no dense FFN
            tensors += [(p + "ffn_gate.weight", (F, D), True), (p + "ffn_up.weight", (F, D), True),
                        (p + "ffn_down.weight", (D, F), True)]
        if shape.arch in ("qwen2", "gpt-oss"):
            tensors += [(p + "attn_q.bias", (H * hd,), False), (p + "attn_k.bias", (Hkv * hd,), False),
                        (p + "attn_v.bias", (Hkv * hd,), False)]
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), shape.arch)
    w.add_name(path.stem)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(D)
    w.add_block_count(shape.n_layer)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    if shape.arch == "gemma4":
        gemma4_kvs(w, shape)
    else:
        w.add_feed_forward_length(F)
    if shape.head_dim and shape.arch != "gemma4":
        w.add_key_length(hd)
        w.add_value_length(hd)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(Fe)
    w.add_rope_freq_base(shape.rope_base)
    if shape.attn_interval:
        w.add_full_attention_interval(shape.attn_interval)
        w.add_ssm_conv_kernel(4)
        w.add_ssm_state_size(shape.ssm_s)
        w.add_ssm_group_count(shape.ssm_hk)
        w.add_ssm_time_step_rank(shape.ssm_hv)
        w.add_ssm_inner_size(shape.ssm_hv * shape.ssm_s)
        w.add_rope_dimension_count(shape.n_rot)
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if shape.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(shape.n_ff_shexp)
    if shape.mla is not None:
        shape.mla.add_metadata(w)
    if oss:
        w.add_sliding_window(128)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(1)  # MOSTLY_F16
    add_vocab(w, shape.n_vocab)
    for name, shp, matrix in tensors:
        dt = np.float16 if matrix else np.float32
        w.add_tensor_info(name, shp, np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, matrix in tensors:
        n = int(np.prod(shp))
        if name.endswith((".ssm_a", "ssm_conv1d.weight")):  # decays -exp(A_log) < 0; a short random kernel
            a = (-rng.uniform(0.05, 1.0, n) if name.endswith(".ssm_a") else rng.uniform(-0.5, 0.5, n)).astype(np.float32)
        elif name == "rope_freqs.weight":  # proportional RoPE: a quarter of the pairs rotate, 1e30 stands still
            a = np.array([1.0] * (n // 4) + [1e30] * (n - n // 4), np.float32)
        elif not matrix:
            ones = name.endswith(("norm.weight", "layer_output_scale.weight"))
            a = np.ones(n, np.float32) if ones else np.zeros(n, np.float32)
        else:
            a = np.empty(n, np.float16)
            for s in range(0, n, 1 << 22):
                m = min(1 << 22, n - s)
                o = int(rng.integers(0, pool.size - m))
                a[s:s + m] = pool[o:o + m]
        w.write_tensor_data(a.reshape(shp))
    w.close()
    tmp.rename(path)


def model_file(name: str, qtype: str, threads: int) -> Path:
    """The shape quantized to qtype by llama.cpp, written (and cached) if missing."""
    d = CACHE / "models"
    d.mkdir(parents=True, exist_ok=True)
    out = d / f"{name}-{qtype}.gguf"
    if out.exists():
        return out
    src = d / f"{name}-F16.gguf"
    if not src.exists():
        print(f"writing {src} ...", file=sys.stderr, flush=True)
        write_f16(SHAPES[name], src)
    quantize(src, out, qtype, threads)
    return out


def quantize(src: Path, out: Path, qtype: str, threads: int) -> None:
    """src (F16) quantized to qtype by llama.cpp's llama_model_quantize, written to out whole or not at all."""
    import llama_cpp

    print(f"quantizing {out.name} with llama_model_quantize ...", file=sys.stderr, flush=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[qtype]
    params.nthread = threads
    tmp = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed for {out.name}")
    tmp.rename(out)


# Runs argv[1:] as its child and reports the child's peak RSS alone on stderr (RUSAGE_CHILDREN of a
# process with one child); SIGTERM is passed on, so a server can be stopped through it.
_PEAK_WRAPPER = ("import resource,signal,subprocess,sys; p=subprocess.Popen(sys.argv[1:]); "
                 "signal.signal(signal.SIGTERM, lambda *a: p.terminate()); rc=p.wait(); "
                 "sys.stderr.write(f'\\nPEAK_RSS_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n'); "
                 "sys.exit(rc)")


def _peak_mb(stderr: str) -> float:
    kb = [int(line.split()[1]) for line in stderr.splitlines() if line.startswith("PEAK_RSS_KB")]
    return kb[-1] / 1024 if kb else float("nan")


def measured(cmd: list[str], env=None) -> tuple[str, float]:
    """Run cmd to completion; (its stdout, its peak RSS in MiB)."""
    p = subprocess.run([sys.executable, "-c", _PEAK_WRAPPER, *cmd], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return p.stdout, _peak_mb(p.stderr)


def llama_bench(binary: Path, model: Path, threads: int, reps: int, cache_type: str) -> dict:
    out, rss = measured([str(binary), "-m", str(model), "-p", "512", "-n", "128", "-t", str(threads),
                         "-r", str(reps), "-ctk", cache_type, "-ctv", cache_type, "-o", "json"])
    rows = json.loads(out)
    pp = next(r for r in rows if r["n_prompt"] == 512 and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] == 128 and r["n_prompt"] == 0)
    return {"pp512": pp["avg_ts"], "tg128": tg["avg_ts"], "rss_mb": rss}


def llama_bench_depth(binary: Path, model: Path, threads: int, reps: int, cache_type: str, depth: int) -> float:
    """tg128 after `depth` tokens of context (llama-bench -d: the context computed once, then its
    saved state restored for each repetition)."""
    out, _ = measured([str(binary), "-m", str(model), "-p", "0", "-n", "128", "-d", str(depth), "-t", str(threads),
                       "-r", str(reps), "-ctk", cache_type, "-ctv", cache_type, "-o", "json"])
    return next(r for r in json.loads(out) if r["n_gen"] == 128)["avg_ts"]


def infer_bench_depth(model: Path, threads: int, reps: int, cache_type: str, depth: int) -> float:
    """tg128 after `depth` tokens of context (infer bench -d: computed once, then from the prefix cache)."""
    out, _ = measured([sys.executable, "-m", "infer.cli", "bench", str(model), "-p", "16", "-n", "128",
                       "-d", str(depth), "-c", str(depth + 256), "-t", str(threads), "-r", str(reps), "--backend", "cpu", "-ctk", cache_type,
                       "-ctv", cache_type, "--json"])
    return json.loads(out.strip().splitlines()[-1])["decode_tok_s"]


def infer_bench(model: Path, threads: int, reps: int, cache_type: str) -> dict:
    out, rss = measured([sys.executable, "-m", "infer.cli", "bench", str(model), "-p", "512", "-n", "128",
                         "-c", str(BENCH_CTX), "-t", str(threads), "-r", str(reps), "--backend", "cpu", "-ctk", cache_type,
                         "-ctv", cache_type, "--json"])
    row = json.loads(out.strip().splitlines()[-1])
    return {"pp512": row["prefill_tok_s"], "tg128": row["decode_tok_s"], "rss_mb": rss,
            "kv_mb": (row["kv_pool_bytes"] + row.get("state_pool_bytes", 0)) / 2**20,
            "kv_bytes_per_token": row["kv_pool_bytes"] / BENCH_CTX}


def llama_kv_bytes_per_token(model: Path, cache_type: str) -> float:
    """llama.cpp's K and V cache bytes per token of context: the sizes its log gives its KV caches
    (MiB, two decimals) over BENCH_CTX, as llama-cpp-python creates them. Its defaults keep a
    full-size sliding-window cache (swa_full) and, without flash attention, pad every layer's V to
    the widest (Gemma 4): llama-server's own defaults (a window-sized cache) take less there."""
    code = ("import sys, llama_cpp; from infer.backends.llamacpp.runner import GGML_TYPES as T; "
            "t = T[sys.argv[2]]; llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[3]), type_k=t, type_v=t, "
            "flash_attn=sys.argv[2] != 'f16', verbose=True)")
    p = subprocess.run([sys.executable, "-c", code, str(model), cache_type, str(BENCH_CTX)], capture_output=True,
                       text=True)
    # one line per cache: a model with sliding-window layers (Gemma) has a second, of the window's cells
    sizes = re.findall(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells", p.stderr)
    if not sizes:
        raise RuntimeError(f"no KV cache size in llama.cpp's log:\n{p.stderr[-2000:]}")
    return sum(float(mib) for mib, _ in sizes) * 2**20 / BENCH_CTX


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def first_token(cmd: list[str], port: int, path: str, body: dict) -> dict:
    """Start a server, wait for it to answer, time one 1-token completion from the start; stop it."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", _PEAK_WRAPPER, *cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {p.stderr.read()[-2000:]}")
            try:
                _post(f"http://127.0.0.1:{port}{path}", body)
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        ttft = time.perf_counter() - t0
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    return {"first_token_s": ttft, "rss_mb": _peak_mb(err)}


def load_times(server: Path, model: Path, threads: int, cache_type: str) -> tuple[dict, dict]:
    body = {"prompt": "The capital of France is", "max_tokens": 1, "n_predict": 1, "temperature": 0}
    port = _free_port()
    ref = first_token([str(server), "-m", str(model), "-t", str(threads), "-c", "4096", "-np", "1",
                       "--port", str(port), "--no-webui", "-ctk", cache_type, "-ctv", cache_type], port, "/completion", body)
    port = _free_port()
    ours = first_token([sys.executable, "-m", "infer.cli", "serve", str(model), "--port", str(port),
                        "--threads", str(threads), "--ctx", "4096", "--parallel", "1", "--backend", "cpu",
                        "-ctk", cache_type, "-ctv", cache_type],
                       port, "/v1/completions", body)
    return ref, ours


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decode step reads: every tensor but the token embeddings (one row of them:
    token_embd unless the output projection is the embedding itself, Gemma 4's per_layer_token_embd);
    of a mixture of experts' 3-D tensors, the share of the experts a token uses."""
    from infer.models.gguf_file import read_gguf

    g = read_gguf(path)
    t, arch = g.tensors, g.metadata["general.architecture"]
    used = g.metadata.get(f"{arch}.expert_used_count", 1) / g.metadata.get(f"{arch}.expert_count", 1)
    total = sum(x.raw.nbytes * (used if "_exps." in name else 1) for name, x in t.items())
    rows = t["per_layer_token_embd.weight"].raw.nbytes if "per_layer_token_embd.weight" in t else 0
    return int(total) - rows - (t["token_embd.weight"].raw.nbytes if "output.weight" in t else 0)


def read_bandwidth(threads: int) -> float:
    """GB/s this machine streams from memory with `threads` threads (a sum over 1 GiB): the
    ceiling for decode, which reads every weight once per token."""
    import numba
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def rsum(a, out):
        for c in prange(a.shape[0]):
            s = np.float32(0)
            for i in range(a.shape[1]):
                s += a[c, i]
            out[c] = s

    numba.set_num_threads(threads)
    a = np.ones((64, 2**28 // 64), np.float32)
    out = np.zeros(64, np.float32)
    rsum(a, out)
    best = min(_timed(rsum, a, out) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(f, *args) -> float:
    t = time.perf_counter()
    f(*args)
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--types", default=",".join(FTYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=2, help="repetitions inside each program's run")
    ap.add_argument("--rounds", type=int, default=2,
                    help="turns each program takes, alternating (best kept); 0 with --depth: the depth test alone")
    ap.add_argument("--no-load", action="store_true", help="skip the servers' start-to-first-token runs")
    ap.add_argument("--embedded", action="store_true", help="also the embedded Gemma 3 270M")
    ap.add_argument("--out", default=str(CACHE / "results.jsonl"), help="JSON lines, appended")
    ap.add_argument("--cache-type", default="f16", choices=["f16", "q8_0"], help="K and V cache type of both")
    ap.add_argument("--depth", type=int, default=0,
                    help="also tg128 after this many tokens of context (llama-bench -d), one round each")
    a = ap.parse_args(argv)
    bins = Path(subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_bench.sh")], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
    jobs = []
    if a.embedded:
        from infer.models.default import default_model_path

        jobs.append(("gemma3-270m (embedded)", "Q4_K_M", default_model_path()))
    for name in a.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        for qtype in a.types.split(","):
            if qtype not in FTYPES:
                raise SystemExit(f"unknown type {qtype!r}; known: {', '.join(FTYPES)}")
            jobs.append((name, qtype, None))
    results = []
    bandwidth = read_bandwidth(a.threads)
    print(f"memory read bandwidth, {a.threads} threads: {bandwidth:.1f} GB/s", file=sys.stderr, flush=True)
    for name, qtype, path in jobs:
        path = path or model_file(name, qtype, a.threads)
        row = {"shape": name, "type": qtype, "file_mb": path.stat().st_size / 2**20, "threads": a.threads,
               "gb_per_token": bytes_per_token(path) / 1e9, "read_gb_s": bandwidth, "cache_type": a.cache_type}
        # The machine is shared and its speed drifts over minutes: the two programs take turns,
        # and each keeps its best round (rates: the highest; RSS: the highest too).
        rounds = {"llama": [], "infer": []}
        for i in range(a.rounds):
            print(f"{name} {qtype}: round {i + 1}: llama-bench, infer bench ...", file=sys.stderr, flush=True)
            rounds["llama"].append(llama_bench(bins / "llama-bench", path, a.threads, a.repetitions, a.cache_type))
            rounds["infer"].append(infer_bench(path, a.threads, a.repetitions, a.cache_type))
        for k, rs in rounds.items():
            row[k] = {**max(rs, key=lambda r: r["tg128"]), "pp512": max(r["pp512"] for r in rs),
                      "rss_mb": max(r["rss_mb"] for r in rs), "rounds": rs} if rs else None
        if rounds["infer"]:  # the cache's size per token of context (MLA: the latent and the RoPE part)
            row["llama_kv_bytes_per_token"] = llama_kv_bytes_per_token(path, a.cache_type)
            print(f"{name} {qtype}: KV cache bytes per token, {a.cache_type}: llama.cpp "
                  f"{row['llama_kv_bytes_per_token']:.0f}, infer {row['infer']['kv_bytes_per_token']:.0f}",
                  file=sys.stderr, flush=True)
        if not a.no_load:
            print(f"{name} {qtype}: servers ...", file=sys.stderr, flush=True)
            row["llama_server"], row["infer_serve"] = load_times(bins / "llama-server", path, a.threads, a.cache_type)
        if a.rounds:  # --rounds 0: the depth test alone
            results.append(row)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(table([row]), file=sys.stderr, flush=True)
        if a.depth:  # after the row is kept: the context's prefill takes each program minutes
            print(f"{name} {qtype}: tg128 @ d{a.depth}: llama-bench, infer bench ...", file=sys.stderr, flush=True)
            lt = llama_bench_depth(bins / "llama-bench", path, a.threads, a.repetitions, a.cache_type, a.depth)
            it = infer_bench_depth(path, a.threads, a.repetitions, a.cache_type, a.depth)
            with open(a.out, "a") as f:
                f.write(json.dumps({"shape": name, "type": qtype, "depth": a.depth, "threads": a.threads,
                                    "llama_tg128": lt, "infer_tg128": it}) + "\n")
            print(f"{name} {qtype}: tg128 @ d{a.depth}: llama.cpp {lt:.2f}, infer {it:.2f} tok/s ({it / lt:.2f}x)",
                  flush=True)
    print(f"memory read bandwidth, {a.threads} threads: {bandwidth:.1f} GB/s")
    print(table(results))


def table(rows: list[dict]) -> str:
    head = ("| model | file MiB | pp512 llama.cpp | pp512 infer | ratio | tg128 llama.cpp | tg128 infer | ratio "
            "| decode GB/s llama.cpp / infer | bench RSS MiB llama.cpp / infer (KV + state) | serve RSS MiB llama.cpp / infer "
            "| first token s llama.cpp / infer |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lb, ib = r["llama"], r["infer"]
        srv = (f"{r['llama_server']['rss_mb']:.0f} / {r['infer_serve']['rss_mb']:.0f}",
               f"{r['llama_server']['first_token_s']:.2f} / {r['infer_serve']['first_token_s']:.2f}") \
            if "infer_serve" in r else ("", "")
        kv = "" if r.get("cache_type", "f16") == "f16" else f", KV {r['cache_type']}"
        lines.append(f"| {r['shape']} {r['type']}{kv} | {r['file_mb']:.0f} | {lb['pp512']:.1f} | {ib['pp512']:.1f} | "
                     f"{ib['pp512'] / lb['pp512']:.2f}x | {lb['tg128']:.1f} | {ib['tg128']:.1f} | "
                     f"{ib['tg128'] / lb['tg128']:.2f}x | {lb['tg128'] * r['gb_per_token']:.1f} / "
                     f"{ib['tg128'] * r['gb_per_token']:.1f} | {lb['rss_mb']:.0f} / {ib['rss_mb']:.0f} ({ib['kv_mb']:.0f}) | "
                     f"{srv[0]} | {srv[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
