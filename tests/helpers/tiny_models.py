"""Tiny random-weight GGUF models, written with gguf's writer, for comparing logits with llama.cpp."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT

from infer.models.arch import architecture, names

# Weights are drawn like HF initializes these architectures (initializer_range 0.02); wider random
# weights amplify 1-ulp differences through Q8 activation rounding until llama.cpp disagrees with itself.
WEIGHT_STD = 0.02

# The architectures write_tiny_model writes: all but the BERT family (Architecture.bert_norms), whose
# tiny models carry a real vocabulary of llama.cpp's (tiny_encoders.write_tiny_encoder;
# tests/test_encoders.py), and ModernBERT (Architecture.layer_norms: tiny_modern_bert.py;
# tests/test_modern_bert.py)
TINY_ARCHS = tuple(a for a in names() if not (architecture(a).bert_norms or architecture(a).layer_norms))

# Where each K-quant block keeps its f16 scales (byte offsets) and a scale that keeps weights within ~±0.04.
_KQUANT_SCALES = {
    GT.Q2_K: ((80, 82), 0.04 / 45),
    GT.Q3_K: ((108,), 0.04 / 128),
    GT.Q4_K: ((0, 2), 0.04 / 945),
    GT.Q5_K: ((0, 2), 0.04 / 1953),
    GT.Q6_K: ((208,), 0.04 / 4000),
}

ARCH_TYPES = {
    # Each architecture's test covers a different mix of storage types.
    "llama": {"attn_q": GT.Q4_0, "attn_k": GT.Q4_1, "attn_v": GT.Q5_0, "attn_output": GT.Q5_1,
              "ffn_gate": GT.Q8_0, "ffn_up": GT.Q4_K, "ffn_down": GT.Q6_K, "token_embd": GT.Q8_0, "output": GT.Q6_K},
    "qwen2": {"attn_q": GT.Q2_K, "attn_k": GT.Q3_K, "attn_v": GT.Q4_K, "attn_output": GT.Q5_K,
              "ffn_gate": GT.Q6_K, "ffn_up": GT.Q5_0, "ffn_down": GT.Q4_K, "token_embd": GT.Q4_K},
    "qwen3": {"attn_q": GT.F16, "attn_k": GT.BF16, "attn_v": GT.F32, "attn_output": GT.Q8_0,
              "ffn_gate": GT.BF16, "ffn_up": GT.F16, "ffn_down": GT.F32, "token_embd": GT.F16},
    "gemma3": {"attn_q": GT.Q5_0, "attn_k": GT.Q5_0, "attn_v": GT.Q8_0, "attn_output": GT.Q4_K,
               "ffn_gate": GT.Q5_0, "ffn_up": GT.Q5_0, "ffn_down": GT.Q6_K, "token_embd": GT.Q8_0},
    "gemma2": {"attn_q": GT.Q8_0, "attn_k": GT.Q4_K, "attn_v": GT.Q5_K, "attn_output": GT.Q4_0,
               "ffn_gate": GT.Q6_K, "ffn_up": GT.Q4_K, "ffn_down": GT.Q8_0, "token_embd": GT.Q6_K},
    "olmo2": {"attn_q": GT.Q4_K, "attn_k": GT.Q5_0, "attn_v": GT.Q8_0, "attn_output": GT.Q5_K,
              "ffn_gate": GT.Q4_K, "ffn_up": GT.Q5_K, "ffn_down": GT.Q8_0, "token_embd": GT.Q4_K, "output": GT.Q8_0},
    "granite": {"attn_q": GT.Q4_K, "attn_k": GT.Q4_K, "attn_v": GT.Q6_K, "attn_output": GT.Q4_K,
                "ffn_gate": GT.Q4_K, "ffn_up": GT.Q4_K, "ffn_down": GT.Q6_K, "token_embd": GT.Q8_0},
    "phi3": {"attn_qkv": GT.Q4_K, "attn_output": GT.Q5_K, "ffn_up": GT.Q4_K, "ffn_down": GT.Q8_0,
             "token_embd": GT.Q8_0, "output": GT.Q5_0},
    "qwen3moe": {"attn_q": GT.Q8_0, "attn_k": GT.Q4_K, "attn_v": GT.Q6_K, "attn_output": GT.Q4_K,
                 "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q4_K, "ffn_up_exps": GT.Q5_0, "ffn_down_exps": GT.Q8_0,
                 "token_embd": GT.Q8_0},
    # experts packed alike (gate and up of one type): the cpu backend's one-loop path (moe.experts_ffn);
    # qwen3moe's mixed gate/up types take its expert-by-expert path
    "llama-moe": {"attn_q": GT.Q8_0, "attn_k": GT.Q8_0, "attn_v": GT.Q6_K, "attn_output": GT.Q5_K,
                  "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q4_K, "ffn_up_exps": GT.Q4_K, "ffn_down_exps": GT.Q6_K,
                  "token_embd": GT.Q8_0, "output": GT.Q8_0},
    # lfm2: short convolutions (in_proj, out_proj) between the attention layers
    "lfm2": {"attn_q": GT.Q8_0, "attn_k": GT.Q5_K, "attn_v": GT.Q4_1, "attn_output": GT.Q6_K,
             "shortconv.in_proj": GT.Q4_K, "shortconv.out_proj": GT.Q5_1, "ffn_gate": GT.Q5_K, "ffn_up": GT.Q8_0,
             "ffn_down": GT.Q4_K, "token_embd": GT.Q6_K},
    # lfm2moe: lfm2's layers, a dense FFN first, then experts packed alike (gate and up of one type).
    # Float products around the experts and expert types without per-block minimums (Q6_K, Q3_K):
    # random Q4_K/Q5_K bytes give every row the same offset, which the experts' gating squares and
    # lfm2's B * x * C cubes, until the residual stream of a few tokens is 100x the others' and the
    # 8-bit activations of llama.cpp (and the cpu backend) put the logits 30% from exact arithmetic
    "lfm2moe": {"attn_q": GT.F16, "attn_k": GT.BF16, "attn_v": GT.F32, "attn_output": GT.F16,
                "shortconv.in_proj": GT.F16, "shortconv.out_proj": GT.F32, "ffn_gate": GT.F16, "ffn_up": GT.BF16,
                "ffn_down": GT.F16, "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q6_K, "ffn_up_exps": GT.Q6_K,
                "ffn_down_exps": GT.Q3_K, "token_embd": GT.Q8_0},
    # qwen35: gated delta nets (attn_qkv, attn_gate, ssm_beta/alpha, ssm_out) around gated attention
    "qwen35": {"attn_q": GT.Q5_K, "attn_k": GT.Q8_0, "attn_v": GT.Q4_K, "attn_output": GT.Q5_0,
               "attn_qkv": GT.Q8_0, "attn_gate": GT.Q4_K, "ssm_beta": GT.F16, "ssm_alpha": GT.BF16,
               "ssm_out": GT.Q5_1, "ffn_gate": GT.Q4_K, "ffn_up": GT.Q6_K, "ffn_down": GT.Q8_0,
               "token_embd": GT.Q8_0},
    # granitehybrid: Mamba-2 mixers (ssm_in, ssm_out) around attention without RoPE
    "granitehybrid": {"attn_q": GT.Q8_0, "attn_k": GT.Q5_1, "attn_v": GT.Q4_K, "attn_output": GT.Q5_K,
                      "ssm_in": GT.Q4_K, "ssm_out": GT.Q6_K, "ffn_gate": GT.Q5_K, "ffn_up": GT.Q4_K,
                      "ffn_down": GT.Q8_0, "token_embd": GT.Q6_K},
    # granitehybrid-moe: granitehybrid's layers with experts packed alike (Granite 4.0 H Tiny's
    # layout: experts feed_forward_length wide) and an ungated shared expert
    "granitehybrid-moe": {"attn_q": GT.Q5_0, "attn_k": GT.Q8_0, "attn_v": GT.Q6_K, "attn_output": GT.Q4_K,
                          "ssm_in": GT.Q8_0, "ssm_out": GT.Q5_K, "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q5_K,
                          "ffn_up_exps": GT.Q5_K, "ffn_down_exps": GT.Q6_K, "ffn_gate_shexp": GT.Q6_K,
                          "ffn_up_shexp": GT.Q4_K, "ffn_down_shexp": GT.Q5_0, "token_embd": GT.Q8_0},
    # qwen35moe: qwen35's layers with experts packed alike and a shared expert (its gate a (D,) F32 row)
    "qwen35moe": {"attn_q": GT.Q8_0, "attn_k": GT.Q5_K, "attn_v": GT.Q8_0, "attn_output": GT.Q4_K,
                  "attn_qkv": GT.Q5_K, "attn_gate": GT.Q8_0, "ssm_beta": GT.BF16, "ssm_alpha": GT.F16,
                  "ssm_out": GT.Q4_0, "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q4_K, "ffn_up_exps": GT.Q4_K,
                  "ffn_down_exps": GT.Q8_0, "ffn_gate_shexp": GT.Q5_K, "ffn_up_shexp": GT.Q8_0,
                  "ffn_down_shexp": GT.Q4_K, "token_embd": GT.Q8_0},
    # qwen3next: beta and alpha in one ssm_ba, experts of mixed types (the expert-by-expert path)
    "qwen3next": {"attn_q": GT.Q5_K, "attn_k": GT.Q8_0, "attn_v": GT.Q8_0, "attn_output": GT.Q5_0,
                  "attn_qkv": GT.Q8_0, "attn_gate": GT.Q8_0, "ssm_ba": GT.F16, "ssm_out": GT.Q8_0,
                  "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q8_0, "ffn_up_exps": GT.Q4_K,
                  "ffn_down_exps": GT.Q8_0, "ffn_gate_shexp": GT.Q5_K, "ffn_up_shexp": GT.Q8_0,
                  "ffn_down_shexp": GT.Q4_K, "token_embd": GT.Q8_0, "output": GT.Q8_0},
    # llama4: dense and expert layers in turn, experts packed alike, a shared expert
    "llama4": {"attn_q": GT.Q8_0, "attn_k": GT.Q6_K, "attn_v": GT.Q5_0, "attn_output": GT.Q4_K,
               "ffn_gate": GT.Q5_K, "ffn_up": GT.Q8_0, "ffn_down": GT.Q4_0, "ffn_gate_inp": GT.F32,
               "ffn_gate_exps": GT.Q5_K, "ffn_up_exps": GT.Q5_K, "ffn_down_exps": GT.Q8_0,
               "ffn_gate_shexp": GT.Q4_K, "ffn_up_shexp": GT.Q6_K, "ffn_down_shexp": GT.Q5_0,
               "token_embd": GT.Q8_0},
    # gpt-oss: biases, sinks and swiglu_oai; its real files keep the experts in MXFP4
    "gpt-oss": {"attn_q": GT.Q8_0, "attn_k": GT.Q5_0, "attn_v": GT.Q8_0, "attn_output": GT.Q4_K,
                "ffn_gate_inp": GT.F32, "ffn_gate_exps": GT.Q4_K, "ffn_up_exps": GT.Q4_K, "ffn_down_exps": GT.Q8_0,
                "token_embd": GT.Q8_0, "output": GT.Q6_K},
    # smollm3: llama's layers, every 4th without RoPE (N_LAYER: 4, so the last)
    "smollm3": {"attn_q": GT.Q5_1, "attn_k": GT.Q6_K, "attn_v": GT.Q4_0, "attn_output": GT.Q8_0,
                "ffn_gate": GT.Q5_K, "ffn_up": GT.Q4_1, "ffn_down": GT.Q5_0, "token_embd": GT.Q8_0},
    # mistral3: llama's layers, YaRN with its betas and log multiplier, Llama 4's attention temperature
    "mistral3": {"attn_q": GT.Q6_K, "attn_k": GT.Q5_1, "attn_v": GT.Q8_0, "attn_output": GT.Q4_1,
                 "ffn_gate": GT.Q5_0, "ffn_up": GT.Q6_K, "ffn_down": GT.Q4_K, "token_embd": GT.Q6_K,
                 "output": GT.Q8_0},
    # glm4moe: Q/K/V biases, a dense FFN first, then sigmoid-gated experts packed alike and an
    # ungated shared expert
    "glm4moe": {"attn_q": GT.Q8_0, "attn_k": GT.Q5_0, "attn_v": GT.Q8_0, "attn_output": GT.Q6_K,
                "ffn_gate": GT.Q5_K, "ffn_up": GT.Q8_0, "ffn_down": GT.Q4_K, "ffn_gate_inp": GT.F32,
                "ffn_gate_exps": GT.Q8_0, "ffn_up_exps": GT.Q8_0, "ffn_down_exps": GT.Q6_K,
                "ffn_gate_shexp": GT.Q8_0, "ffn_up_shexp": GT.Q5_K, "ffn_down_shexp": GT.Q8_0, "token_embd": GT.Q8_0},
    # glm4moe-air: GLM-4.5-Air's layout (no Q/K norms), two shared experts, and no gating or
    # weights keys: llama.cpp's defaults (sigmoid, weights neither renormalized nor scaled)
    "glm4moe-air": {"attn_q": GT.Q5_K, "attn_k": GT.Q8_0, "attn_v": GT.Q6_K, "attn_output": GT.Q8_0,
                    "ffn_gate": GT.Q8_0, "ffn_up": GT.Q4_K, "ffn_down": GT.Q8_0, "ffn_gate_inp": GT.F32,
                    "ffn_gate_exps": GT.Q6_K, "ffn_up_exps": GT.Q6_K, "ffn_down_exps": GT.Q8_0,
                    "ffn_gate_shexp": GT.Q4_K, "ffn_up_shexp": GT.Q8_0, "ffn_down_shexp": GT.Q5_K,
                    "token_embd": GT.Q8_0, "output": GT.Q8_0},
}
# A tiny mixture of experts: 8 experts of width 256 (a K-quant block), 3 of them per token
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 3, 256
# gpt-oss's chat format's markers, control tokens of its vocabulary (<|return|> and <|call|> end a reply)
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
# How many layers each tiny model has: enough for a sliding-window pattern to have both kinds.
N_LAYER = {"gemma3": 6, "gemma2": 4, "gpt-oss": 4, "lfm2": 4, "qwen35": 4, "lfm2moe": 4, "granitehybrid": 4,
           "qwen35moe": 4, "qwen3next": 4, "smollm3": 4, "glm4moe": 3, "llama4": 4}
# lfm2's layers: short convolutions (True) around one attention layer, and the convolution's width
LFM2_RECURRENT, LFM2_L_CACHE = (True, True, False, True), 3
# lfm2moe (lfm2's layers): its first layer dense, then 6 experts, 2 of them per token (sigmoid
# gating, a selection bias)
LFM2MOE_DENSE_LEAD, LFM2MOE_EXPERTS, LFM2MOE_USED = 1, 6, 2
# How much each router's weights are scaled beyond WEIGHT_STD: decisive softmaxes; lfm2moe's
# sigmoids mostly short of saturating, so the experts' weights differ (its choice's closest call
# is then 0.005 apart, 5x the MLX-to-cpu differences at the router)
ROUTER_SCALE = {"lfm2moe": 10, "glm4moe": 10, "llama4": 10}
# llama4: experts in every 2nd layer (the 4th without RoPE), one of them per token as Scout's. Its
# seed (TINY_SEEDS) gives routers whose top two logits are >= 0.6 apart at every position of the
# tests' prompt (seed 15's were 0.1 apart: 8-bit activations chose another expert than exact
# arithmetic, in llama.cpp as in the cpu backend, 86% of max |logit| away from exact)
LLAMA4_MOE_STEP, LLAMA4_USED = 2, 1
# qwen35: every 3rd layer full attention (recurrent, recurrent, attention, recurrent); the gated
# delta net's convolution width, head size S, key heads, value heads (GQA-like: 2 value heads per
# key head); RoPE over the first 32 of each head's 64 dims in IMROPE sections that are NeoX for text
QWEN35_INTERVAL, QWEN35_CONV, QWEN35_S, QWEN35_HK, QWEN35_HV = 3, 4, 32, 2, 4
QWEN35_N_ROT, QWEN35_SECTIONS = 32, (6, 5, 5, 0)
# granitehybrid: Mamba-2 layers (True) around one attention layer; the convolution's width, the
# state size N, the groups of B and C, the heads (inner size 2 n_embd, so 64 per head)
GRANITEH_RECURRENT, GRANITEH_CONV, GRANITEH_N, GRANITEH_G, GRANITEH_H = (True, False, True, True), 4, 16, 2, 8
# the gated delta net's architectures (qwen35's layers); those of them with experts take 2 per token
# and have a shared expert of this width
GDN_ARCHS, GDN_EXPERTS_USED, N_FF_SHEXP = ("qwen35", "qwen35moe", "qwen3next"), 2, 256
# mistral3: YaRN over 4 tokens (so the attention temperature, whose step is that original context,
# changes every 4 positions of the test prompt), its betas away from llama.cpp's defaults, the
# log multiplier and temperature of Ministral 3's files
MISTRAL3_YARN, MISTRAL3_BETAS, MISTRAL3_LOG_MUL, MISTRAL3_TEMP = ("yarn", 4.0, 4), (16.0, 2.0), 1.0, 0.1
# glm4moe: its first layer dense, RoPE over half of each head (as GLM-4.5's partial_rotary_factor),
# one shared expert, the experts' weights renormalized and then scaled (routed_scaling_factor)
GLM4MOE_DENSE_LEAD, GLM4MOE_N_ROT, GLM4MOE_SHARED, GLM4MOE_SCALE = 1, 32, 1, 2.5


# Each tiny model's seed where the tests compare every architecture (test_models,
# test_llamacpp_agreement): fixed per architecture, so that registering another one changes no
# other model's weights (a seed once was the architecture's place in the registry, and the tests
# that judge a random model's agreement against llama.cpp's own spread were tuned on those weights).
TINY_SEEDS = {"llama": 0, "qwen2": 1, "qwen3": 2, "gemma3": 3, "gemma2": 4, "olmo2": 5, "granite": 6, "phi3": 7,
              "qwen3moe": 8, "gpt-oss": 9, "lfm2": 10, "qwen35": 11, "llama-moe": 12, "lfm2moe": 12,
              "granitehybrid": 12, "qwen35moe": 12, "qwen3next": 13, "granitehybrid-moe": 14, "smollm3": 20,
              "mistral3": 16, "glm4moe": 15, "glm4moe-air": 16,
              "deepseek2": 15, "deepseek2-lite": 16, "llama4": 22,
              "gemma4": 15, "gemma4-shared": 15, "gemma4-ple": 15, "gemma4-moe": 25,
              "deepseek2-kvb": 15, "deepseek2-lite-kvb": 16, "gemma-embedding": 23}  # -kvb: the same weights in the older layout


def tiny_seed(arch: str) -> int:
    if arch not in TINY_SEEDS:
        raise KeyError(f"{arch}: give its tiny model a seed in TINY_SEEDS (tests/helpers/tiny_models.py)")
    return TINY_SEEDS[arch]

def random_tensor(rng: np.random.Generator, shape: tuple[int, int], qtype: GT) -> tuple[np.ndarray, GT]:
    rows, n = shape
    if qtype in _KQUANT_SCALES:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows, n // block_size, type_size), dtype=np.uint8)
        offsets, scale = _KQUANT_SCALES[qtype]
        for off in offsets:
            f16 = (rng.uniform(0.5, 1.5, size=(rows, n // block_size)) * scale).astype(np.float16)
            raw[:, :, off:off + 2] = f16.view(np.uint8).reshape(rows, n // block_size, 2)
        return raw.reshape(rows, -1), qtype
    x = rng.normal(0, WEIGHT_STD, size=shape).astype(np.float32)
    if qtype == GT.F32:
        return x, qtype
    if qtype == GT.F16:
        return x.astype(np.float16), qtype
    return gguf.quants.quantize(x, qtype), qtype


def _spm_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(tokens) < n_vocab:
        tokens.append("▁" + letters[i % 26] + letters[(i // 26) % 26])
        types.append(1)
        i += 1
    scores = [0.0] * 259 + [-float(j) for j in range(len(tokens) - 259)]
    return tokens, scores, types


def add_common_kvs(w, arch: str, D: int, F: int, n_layer: int, H: int, Hkv: int | list[int], hd: int,
                   n_ctx: int = 256) -> None:
    """The hyperparameters every tiny test model writes the same way."""
    w.add_name(f"tiny-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(D)
    w.add_block_count(n_layer)
    if F:  # 0: none written (Qwen3.5 MoE's files have none)
        w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)


def add_spm_vocab(w, n_vocab: int, controls: tuple[str, ...] = ()) -> None:
    """A SentencePiece-style vocabulary (see _spm_vocab) with BOS 1 and EOS 2; `controls` replace its
    last tokens as control tokens."""
    tokens, scores, ttypes = _spm_vocab(n_vocab)
    for i, text in enumerate(controls):
        tokens[n_vocab - 1 - i], ttypes[n_vocab - 1 - i] = text, 3
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(ttypes)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


FIM_IDS = {"fim_pre": 315, "fim_suf": 316, "fim_mid": 317, "fim_rep": 318, "fim_sep": 319}  # of a 320-token vocab


def add_fim_ids(w) -> None:
    """Fill-in-the-middle tokens (FIM_IDS: the SPM vocabulary's last five) named in the metadata, as
    a coder model's converter writes them; for write_tiny_model's extra."""
    for name, tid in FIM_IDS.items():
        w.add_uint32(f"tokenizer.ggml.{name}_token_id", tid)


def write_tiny_model(path: Path, arch: str, seed: int = 0, n_vocab: int = 320, split_max_tensors: int = 0,
                     chat_template: str | None = None, n_ctx: int = 256,
                     rope_scaling: tuple[str, float, int] | None = None, nextn: int = 0,
                     extra: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """A tiny random-weight model of `arch` ("llama-moe": llama with experts, Mixtral's layout;
    "granitehybrid-moe": granitehybrid with experts and a shared expert, Granite 4.0 H Tiny's;
    "glm4moe-air": glm4moe without Q/K norms, GLM-4.5-Air's, and without the optional MoE keys);
    split_max_tensors > 0 writes it as llama.cpp's gguf-split does, in shards
    PATHSTEM-00001-of-0000N.gguf of at most that many tensors (returns the first); chat_template:
    its tokenizer.chat_template; n_ctx: its training context; rope_scaling: (type, factor, original
    context) of its RoPE scaling; nextn (qwen35, qwen35moe, qwen3next, glm4moe): that many multi-token-prediction
    blocks after the others, as llama.cpp's converter writes them (a full-attention layer and the
    blk.N.nextn.* tensors), drawn after every other tensor so the rest equal the file without them;
    extra(writer): more keys and tensors, written after all others (an embedding model's pooling
    head), so the rest equal the file without them."""
    if arch in ("deepseek2", "deepseek2-lite", "deepseek2-kvb", "deepseek2-lite-kvb"):  # MLA: its own writer
        from .tiny_deepseek2 import write_tiny_deepseek2
        return write_tiny_deepseek2(path, arch, seed, n_vocab, n_ctx, chat_template)
    if arch == "gemma-embedding":  # an encoder: tiny_encoders.py
        from .tiny_encoders import write_tiny_gemma_embedding
        return write_tiny_gemma_embedding(path, seed, n_vocab, n_ctx)
    if arch in ("gemma4", "gemma4-shared", "gemma4-ple", "gemma4-moe"):
        return write_tiny_gemma4(path, seed, n_vocab, chat_template, n_ctx, shared=arch == "gemma4-shared",
                                 per_layer=GEMMA4_PER_LAYER if arch == "gemma4-ple" else 0, moe=arch == "gemma4-moe")
    rng = np.random.default_rng(seed)
    moe = arch in ("qwen3moe", "llama-moe", "gpt-oss", "lfm2moe", "qwen35moe", "qwen3next", "granitehybrid-moe",
                   "glm4moe", "glm4moe-air", "llama4")
    gdn = arch in GDN_ARCHS
    if arch == "gpt-oss" and rope_scaling is None:  # as its real files: YaRN (here over 16 tokens)
        rope_scaling = ("yarn", 8.0, 16)
    if arch == "mistral3" and rope_scaling is None:  # as Ministral 3's files: YaRN and its keys
        rope_scaling = MISTRAL3_YARN
    types = ARCH_TYPES[arch]
    glm_air = arch == "glm4moe-air"
    n_shared = 2 if glm_air else GLM4MOE_SHARED
    arch = {"llama-moe": "llama", "granitehybrid-moe": "granitehybrid", "glm4moe-air": "glm4moe"}.get(arch, arch)
    D, H, Hkv, hd, F = 256, 4, 2, 64, 512
    n_layer = N_LAYER.get(arch, 2)
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    lfm = arch in ("lfm2", "lfm2moe")
    recurrent = (LFM2_RECURRENT if lfm else GRANITEH_RECURRENT if arch == "granitehybrid" else
                 tuple((i + 1) % QWEN35_INTERVAL != 0 for i in range(n_layer)) if gdn else (False,) * n_layer)
    if nextn:
        if not gdn and arch != "glm4moe":
            raise ValueError(f"no multi-token-prediction blocks for {arch}")
        recurrent += (False,) * nextn
        n_layer += nextn  # block_count counts them
    # lfm2, granitehybrid: head_count_kv per layer, 0 for a recurrent layer (as llama.cpp's converter writes it)
    add_common_kvs(w, arch, D, 0 if arch == "qwen35moe" else F, n_layer, H,
                   [0 if r else Hkv for r in recurrent] if lfm or arch == "granitehybrid" else Hkv, hd, n_ctx)
    if lfm:
        w.add_shortconv_l_cache(LFM2_L_CACHE)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    if gdn:
        w.add_full_attention_interval(QWEN35_INTERVAL)
        w.add_ssm_conv_kernel(QWEN35_CONV)
        w.add_ssm_state_size(QWEN35_S)
        w.add_ssm_group_count(QWEN35_HK)
        w.add_ssm_time_step_rank(QWEN35_HV)
        w.add_ssm_inner_size(QWEN35_HV * QWEN35_S)
        if arch != "qwen3next":  # IMROPE's sections (qwen3next: plain NeoX RoPE)
            w.add_rope_dimension_sections(list(QWEN35_SECTIONS))
    if arch == "granitehybrid":  # as llama.cpp's converter writes Granite 4.0 H: no RoPE
        w.add_ssm_conv_kernel(GRANITEH_CONV)
        w.add_ssm_state_size(GRANITEH_N)
        w.add_ssm_group_count(GRANITEH_G)
        w.add_ssm_time_step_rank(GRANITEH_H)
        w.add_ssm_inner_size(2 * D)
        w.add_rope_scaling_finetuned(False)
    w.add_rope_dimension_count(QWEN35_N_ROT if gdn else GLM4MOE_N_ROT if arch == "glm4moe" else hd)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_layer_norm_rms_eps(1e-6 if arch.startswith("gemma") else 1e-5)
    w.add_rope_freq_base(10000.0 if arch != "gemma3" else 1000000.0)
    if rope_scaling is not None:
        kind, factor, orig = rope_scaling
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(orig)
    if arch == "mistral3":
        w.add_rope_scaling_yarn_beta_fast(MISTRAL3_BETAS[0])
        w.add_rope_scaling_yarn_beta_slow(MISTRAL3_BETAS[1])
        w.add_rope_scaling_yarn_log_mul(MISTRAL3_LOG_MUL)
        w.add_attn_temperature_scale(MISTRAL3_TEMP)
    if arch.startswith("gemma") or arch == "gpt-oss":
        w.add_sliding_window(6)  # smaller than the test prompt, so the window is exercised
    if arch == "gemma2":  # caps small enough to bend these tiny models' scores and logits
        w.add_attn_logit_softcapping(0.1)
        w.add_final_logit_softcapping(2.0)
    if arch == "phi3":  # LongRoPE: short factors within 256 tokens of context, long ones beyond
        w.add_rope_scaling_orig_ctx_len(256)
        w.add_rope_scaling_attn_factors(1.19)
        for kind in ("long", "short"):
            w.add_tensor(f"rope_factors_{kind}.weight", rng.uniform(1.0, 6.0 if kind == "long" else 1.5,
                                                                      size=hd // 2).astype(np.float32))
    n_expert = LFM2MOE_EXPERTS if arch == "lfm2moe" else N_EXPERT
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(LFM2MOE_USED if arch == "lfm2moe" else GDN_EXPERTS_USED if gdn else
                                LLAMA4_USED if arch == "llama4" else N_EXPERT_USED)
        if arch == "llama4":
            w.add_interleave_moe_layer_step(LLAMA4_MOE_STEP)
        if arch == "lfm2moe":  # as llama.cpp's converter writes them
            w.add_leading_dense_block_count(LFM2MOE_DENSE_LEAD)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if arch == "glm4moe":  # as llama.cpp's converter writes GLM-4.5's
            w.add_leading_dense_block_count(GLM4MOE_DENSE_LEAD)
            w.add_expert_shared_count(n_shared)
            if not glm_air:
                w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
                w.add_expert_weights_scale(GLM4MOE_SCALE)
                w.add_expert_weights_norm(True)
        if arch not in ("llama", "granitehybrid"):  # those take feed_forward_length as the experts' width
            w.add_expert_feed_forward_length(N_FF_EXP)
        if gdn or arch == "granitehybrid":
            w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    if arch in ("granite", "granitehybrid"):  # the four multipliers, each away from 1
        w.add_embedding_scale(3.0)
        w.add_residual_scale(0.5)
        w.add_attention_scale(0.09)
        w.add_logit_scale(0.25)
    # llama.cpp marks a phi3 model's <|endoftext|> (and fails to load one without it)
    add_spm_vocab(w, n_vocab, ("<|endoftext|>",) if arch == "phi3" else HARMONY_TOKENS if arch == "gpt-oss" else ())
    w.add_unk_token_id(0)

    def add(name: str, shape: tuple[int, ...], qtype: GT | None = None) -> None:
        if len(shape) == 1:  # norms and biases stay F32
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shape)).astype(np.float32))
            return
        data, qt = random_tensor(rng, (int(np.prod(shape[:-1])), shape[-1]), qtype)  # 3-D: experts' rows
        data = data.reshape(*shape[:-1], -1)
        if name.endswith("ffn_gate_inp.weight"):  # a decisive router: near-ties would let 1-ulp
            data = data * np.float32(ROUTER_SCALE.get(arch, 20))  # roundings pick other experts (F32: exact)
        if qt in (GT.F32, GT.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    add("token_embd.weight", (n_vocab, D), types["token_embd"])
    add("token_embd_norm.weight" if lfm else "output_norm.weight", (D,))
    if "output" in types:
        add("output.weight", (n_vocab, D), types["output"])
    for i in range(n_layer):
        p = f"blk.{i}."
        if arch != "olmo2":  # olmo2 normalizes after each block only
            add(p + "attn_norm.weight", (D,))
        if recurrent[i] and gdn:  # a gated delta net in place of the attention
            S, Hk, Hv = QWEN35_S, QWEN35_HK, QWEN35_HV
            C = 2 * Hk * S + Hv * S
            add(p + "attn_qkv.weight", (C, D), types["attn_qkv"])
            add(p + "attn_gate.weight", (Hv * S, D), types["attn_gate"])
            if arch == "qwen3next":  # per key head its value heads' beta rows, then their alpha rows
                add(p + "ssm_ba.weight", (2 * Hv, D), types["ssm_ba"])
            else:
                add(p + "ssm_beta.weight", (Hv, D), types["ssm_beta"])
                add(p + "ssm_alpha.weight", (Hv, D), types["ssm_alpha"])
            bound = 1 / np.sqrt(QWEN35_CONV)  # nn.Conv1d's initialization, as lfm2's
            w.add_tensor(p + "ssm_conv1d.weight", rng.uniform(-bound, bound, size=(C, QWEN35_CONV)).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(0.5, 1.5, size=Hv).astype(np.float32))
            # -exp(A_log): slow decays, so the state carries far enough for the tests to see it
            w.add_tensor(p + "ssm_a", -rng.uniform(0.05, 1.0, size=Hv).astype(np.float32))
            add(p + "ssm_norm.weight", (S,))
            add(p + "ssm_out.weight", (D, Hv * S), types["ssm_out"])
        elif recurrent[i] and arch == "granitehybrid":  # a Mamba-2 mixer in place of the attention
            Hs, G, Nst, inner = GRANITEH_H, GRANITEH_G, GRANITEH_N, 2 * D
            C = inner + 2 * G * Nst
            add(p + "ssm_in.weight", (inner + C + Hs, D), types["ssm_in"])
            bound = 1 / np.sqrt(GRANITEH_CONV)  # nn.Conv1d's initialization, as lfm2's
            w.add_tensor(p + "ssm_conv1d.weight", rng.uniform(-bound, bound, size=(C, GRANITEH_CONV)).astype(np.float32))
            w.add_tensor(p + "ssm_conv1d.bias", rng.uniform(-bound, bound, size=C).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-1.0, 0.5, size=Hs).astype(np.float32))
            # -exp(A_log) and D per head, stored (H, 1) as llama.cpp's converter writes them
            w.add_tensor(p + "ssm_a", -rng.uniform(0.05, 1.0, size=(Hs, 1)).astype(np.float32))
            w.add_tensor(p + "ssm_d", rng.uniform(0.5, 1.5, size=(Hs, 1)).astype(np.float32))
            w.add_tensor(p + "ssm_norm.weight", (1.0 + rng.normal(0, 0.1, size=(G, inner // G))).astype(np.float32))
            add(p + "ssm_out.weight", (D, inner), types["ssm_out"])
        elif recurrent[i]:  # a short convolution in place of the attention
            add(p + "shortconv.in_proj.weight", (3 * D, D), types["shortconv.in_proj"])
            # the depthwise kernel as HF initializes it (nn.Conv1d: uniform within 1/sqrt(fan_in), fan_in
            # = L), so that what the state carries moves the logits
            bound = 1 / np.sqrt(LFM2_L_CACHE)
            w.add_tensor(p + "shortconv.conv.weight",
                         rng.uniform(-bound, bound, size=(D, LFM2_L_CACHE)).astype(np.float32))
            add(p + "shortconv.out_proj.weight", (D, D), types["shortconv.out_proj"])
        elif arch == "phi3":  # Q, K, V in one matrix
            add(p + "attn_qkv.weight", ((H + 2 * Hkv) * hd, D), types["attn_qkv"])
        elif gdn:  # Q and the output gate interleaved per head
            add(p + "attn_q.weight", (2 * H * hd, D), types["attn_q"])
            add(p + "attn_k.weight", (Hkv * hd, D), types["attn_k"])
            add(p + "attn_v.weight", (Hkv * hd, D), types["attn_v"])
        else:
            add(p + "attn_q.weight", (H * hd, D), types["attn_q"])
            add(p + "attn_k.weight", (Hkv * hd, D), types["attn_k"])
            add(p + "attn_v.weight", (Hkv * hd, D), types["attn_v"])
        if not recurrent[i]:
            add(p + "attn_output.weight", (D, H * hd), types["attn_output"])
        if arch == "gpt-oss":
            add(p + "attn_output.bias", (D,))
            add(p + "attn_sinks.weight", (H,))
        if arch in ("qwen2", "gpt-oss", "glm4moe"):
            add(p + "attn_q.bias", (H * hd,))
            add(p + "attn_k.bias", (Hkv * hd,))
            add(p + "attn_v.bias", (Hkv * hd,))
        if arch in ("qwen3", "gemma3", "qwen3moe") or arch == "glm4moe" and not glm_air or (lfm or gdn) and not recurrent[i]:
            add(p + "attn_q_norm.weight", (hd,))
            add(p + "attn_k_norm.weight", (hd,))
        if arch == "olmo2":  # over the whole projection
            add(p + "attn_q_norm.weight", (H * hd,))
            add(p + "attn_k_norm.weight", (Hkv * hd,))
        if arch in ("gemma3", "gemma2", "olmo2"):
            add(p + "post_attention_norm.weight", (D,))
            add(p + "post_ffw_norm.weight", (D,))
        if arch in ("gpt-oss", "glm4moe") or gdn:  # their pre-FFN norm's name
            add(p + "post_attention_norm.weight", (D,))
        elif arch != "olmo2":
            add(p + "ffn_norm.weight", (D,))
        layer_moe = moe and not (arch == "lfm2moe" and i < LFM2MOE_DENSE_LEAD
                                 or arch == "glm4moe" and i < GLM4MOE_DENSE_LEAD
                                 or arch == "llama4" and (i + 1) % LLAMA4_MOE_STEP)
        if layer_moe:  # the router and the experts' 3-D tensors
            t = types
            Fe = F if arch in ("llama", "granitehybrid") else N_FF_EXP
            add(p + "ffn_gate_inp.weight", (n_expert, D), t["ffn_gate_inp"])
            for name, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
                add(p + f"ffn_{name}_exps.weight", (n_expert, *shape), t[f"ffn_{name}_exps"])
            if arch in ("lfm2moe", "glm4moe"):  # the selection bias: spread as widely as the sigmoids, so it moves the choice
                w.add_tensor(p + "exp_probs_b.bias", rng.normal(0, 0.3, size=n_expert).astype(np.float32))
            if arch == "gpt-oss":  # the router's and each expert's biases
                add(p + "ffn_gate_inp.bias", (N_EXPERT,))
                for name, width in (("gate", Fe), ("up", Fe), ("down", D)):
                    add(p + f"ffn_{name}_exps.bias", (N_EXPERT, width), GT.F32)
            if gdn or arch in ("granitehybrid", "llama4"):  # the shared expert (llama4's as wide as an expert)
                Fs = N_FF_EXP if arch == "llama4" else N_FF_SHEXP
                for name, shape in (("gate", (Fs, D)), ("up", (Fs, D)), ("down", (D, Fs))):
                    add(p + f"ffn_{name}_shexp.weight", shape, t[f"ffn_{name}_shexp"])
            if arch == "glm4moe":  # the shared experts as one FFN
                Fs = n_shared * N_FF_EXP
                for name, shape in (("gate", (Fs, D)), ("up", (Fs, D)), ("down", (D, Fs))):
                    add(p + f"ffn_{name}_shexp.weight", shape, t[f"ffn_{name}_shexp"])
            if gdn:  # and its gate's row (a sigmoid's input of about unit size)
                w.add_tensor(p + "ffn_gate_inp_shexp.weight", rng.normal(0, 0.1, size=D).astype(np.float32))
        elif arch == "phi3":  # gate and up in one matrix, gate first
            add(p + "ffn_up.weight", (2 * F, D), types["ffn_up"])
        else:
            add(p + "ffn_gate.weight", (F, D), types["ffn_gate"])
            add(p + "ffn_up.weight", (F, D), types["ffn_up"])
        if not layer_moe:
            add(p + "ffn_down.weight", (D, F), types["ffn_down"])
        if i >= n_layer - nextn:  # an MTP block's own tensors
            add(p + "nextn.eh_proj.weight", (D, 2 * D), types["attn_output"])
            for name in ("enorm", "hnorm", "shared_head_norm"):
                add(p + f"nextn.{name}.weight", (D,))
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path


# gemma4: sliding-window layers (True) of head size 64 with 2 KV heads, global ones of head size 128
# with 1 KV head, no attn_v (K's product is V) and RoPE over a quarter of each head (rope_freqs)
GEMMA4_SWA = (True, True, False, True, True, False)
# gemma4-shared (E2B's attention): the last 2 layers keep no K/V; each reads the last earlier layer
# of its kind's (layer 4 layer 2's, layer 5 layer 3's); their FFNs twice as wide (use_double_wide_mlp)
GEMMA4_SHARED_SWA, GEMMA4_SHARED = (True, False, True, False, True, False), 2
# gemma4-ple (E2B's per-layer embeddings): each layer's own token embedding this wide
GEMMA4_PER_LAYER = 64
GEMMA4_TYPES = {"attn_q": GT.Q8_0, "attn_k": GT.Q5_K, "attn_v": GT.Q4_K, "attn_output": GT.Q6_K,
                "ffn_gate": GT.Q4_K, "ffn_up": GT.Q5_0, "ffn_down": GT.Q8_0, "token_embd": GT.Q8_0,
                "ffn_gate_inp": GT.F32, "ffn_gate_up_exps": GT.Q5_K, "ffn_down_exps": GT.Q8_0}
# gemma4-moe (26B-A4B's layers): experts in every layer beside the dense FFN, gate and up in one
# ffn_gate_up_exps as llama.cpp's converter writes them; the router input's scale this large, so
# that its input (RMSNorm(x) / sqrt(n_embd)) gives decisive softmaxes
GEMMA4_ROUTER_SCALE = (5.0, 15.0)


def write_tiny_gemma4(path: Path, seed: int, n_vocab: int = 320, chat_template: str | None = None,
                      n_ctx: int = 256, shared: bool = False, per_layer: int = 0,
                      float_type: GT | None = None, moe: bool = False) -> Path:
    """A tiny random Gemma 4 (dense, as the 31B's layout; shared: with E2B's shared-KV layers;
    per_layer: with E2B's per-layer embeddings that wide; moe: with 26B-A4B's experts) as
    llama.cpp's converter writes one; float_type: every matrix in that float type with a few
    outliers (llama-quantize's input)."""
    rng = np.random.default_rng(seed)
    D, H, F, t = 256, 4, 512, GEMMA4_TYPES
    shape = {True: (2, 64), False: (1, 128)}  # (KV heads, head size) by kind: sliding-window or not
    pattern, n_shared = (GEMMA4_SHARED_SWA, GEMMA4_SHARED) if shared else (GEMMA4_SWA, 0)
    n_layer = len(pattern)
    w = gguf.GGUFWriter(str(path), "gemma4")
    n_ff = [2 * F if i >= n_layer - n_shared else F for i in range(n_layer)]
    add_common_kvs(w, "gemma4", D, 0 if n_shared else F, n_layer, H, [shape[s][0] for s in pattern],
                   shape[False][1], n_ctx)
    if n_shared:  # a width per layer, as llama.cpp's converter writes use_double_wide_mlp
        w.add_feed_forward_length(n_ff)
    w.add_key_length_swa(shape[True][1])
    w.add_value_length_swa(shape[True][1])
    w.add_sliding_window_pattern(list(pattern))
    w.add_sliding_window(6)  # smaller than the test prompt, so the window is exercised
    w.add_rope_dimension_count(shape[False][1])
    w.add_rope_dimension_count_swa(shape[True][1])
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_final_logit_softcapping(2.0)  # small enough to bend these tiny logits
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(per_layer)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    add_spm_vocab(w, n_vocab)
    w.add_unk_token_id(0)

    def add(name: str, shp: tuple[int, ...], qtype: GT | None = None) -> None:
        if len(shp) == 1:  # norms stay F32
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shp)).astype(np.float32))
            return
        if float_type is not None:
            x = rng.normal(0, WEIGHT_STD, size=shp).astype(np.float32)
            x.reshape(-1, shp[-1])[0, :8] *= 40  # a few outliers, so scale searches have something to do
            qtype = float_type
            if float_type == GT.BF16:  # truncated: fine for a test input
                w.add_tensor(name, (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shp[:-1], -1),
                             raw_dtype=GT.BF16)
                return
            data, qt = (x, GT.F32) if float_type == GT.F32 else (x.astype(np.float16), GT.F16)
        else:  # 3-D: the experts' rows
            data, qt = random_tensor(rng, (int(np.prod(shp[:-1])), shp[-1]), qtype)
            data = data.reshape(*shp[:-1], -1)
            if name.endswith("ffn_gate_inp.weight"):  # decisive, as write_tiny_model's routers (F32: exact)
                data = data * np.float32(ROUTER_SCALE.get("gemma4-moe", 20))
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    add("token_embd.weight", (n_vocab, D), t["token_embd"])
    add("output_norm.weight", (D,))
    # proportional RoPE: a quarter of the global head's pairs rotate, the others stand still (1e30)
    half = shape[False][1] // 2
    w.add_tensor("rope_freqs.weight", np.array([1.0] * (half // 4) + [1e30] * (half - half // 4), np.float32))
    if per_layer:
        add("per_layer_token_embd.weight", (n_vocab, n_layer * per_layer), GT.Q8_0)
        # F16, as llama.cpp's quantizer keeps it (llama-quant.cpp: "not too big so keep them as it is")
        add("per_layer_model_proj.weight", (n_layer * per_layer, D), GT.F16)
        add("per_layer_proj_norm.weight", (per_layer,))
    for i, swa in enumerate(pattern):
        p, (hkv, hd) = f"blk.{i}.", shape[swa]
        own_kv = i < n_layer - n_shared  # a shared-KV layer has Q alone
        add(p + "attn_norm.weight", (D,))
        add(p + "attn_q.weight", (H * hd, D), t["attn_q"])
        if own_kv:
            add(p + "attn_k.weight", (hkv * hd, D), t["attn_k"])
        if swa and own_kv:  # the global layers have none: their V is K's product
            add(p + "attn_v.weight", (hkv * hd, D), t["attn_v"])
        add(p + "attn_output.weight", (D, H * hd), t["attn_output"])
        # Q·K is not scaled (Q and K are normed instead): norm weights of 1/4 keep these random
        # scores soft, else f16 roundings of Q flip which key dominates (llama.cpp's flash attention
        # then disagrees with its other path by half the logits)
        for name in ("attn_q_norm", "attn_k_norm") if own_kv else ("attn_q_norm",):
            w.add_tensor(p + name + ".weight", (0.25 * (1.0 + rng.normal(0, 0.1, size=hd))).astype(np.float32))
        add(p + "post_attention_norm.weight", (D,))
        add(p + "ffn_norm.weight", (D,))
        add(p + "ffn_gate.weight", (n_ff[i], D), t["ffn_gate"])
        add(p + "ffn_up.weight", (n_ff[i], D), t["ffn_up"])
        add(p + "ffn_down.weight", (D, n_ff[i]), t["ffn_down"])
        add(p + "post_ffw_norm.weight", (D,))
        if moe:  # the router, its input's scale, the experts (each with its output's scale), the branches' norms
            add(p + "ffn_gate_inp.weight", (N_EXPERT, D), t["ffn_gate_inp"])
            w.add_tensor(p + "ffn_gate_inp.scale", rng.uniform(*GEMMA4_ROUTER_SCALE, size=D).astype(np.float32))
            add(p + "ffn_gate_up_exps.weight", (N_EXPERT, 2 * N_FF_EXP, D), t["ffn_gate_up_exps"])
            add(p + "ffn_down_exps.weight", (N_EXPERT, D, N_FF_EXP), t["ffn_down_exps"])
            w.add_tensor(p + "ffn_down_exps.scale", rng.uniform(0.5, 1.5, size=N_EXPERT).astype(np.float32))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                add(p + name + ".weight", (D,))
        w.add_tensor(p + "layer_output_scale.weight", rng.uniform(0.5, 1.5, size=1).astype(np.float32))
        if per_layer:
            add(p + "inp_gate.weight", (per_layer, D), GT.Q8_0)
            add(p + "proj.weight", (D, per_layer), GT.Q8_0)
            add(p + "post_norm.weight", (D,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
