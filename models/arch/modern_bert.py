"""ModernBERT (gte-modernbert, Granite Embedding R2; llama.cpp's src/models/modern-bert.cpp): an
encoder for embeddings. The token's embedding LayerNorm'd (token_embd_norm); then per layer,
pre-norm as llama's but with LayerNorms without biases (layer 0's attn_norm the identity where the
file has none): Q/K/V in one attn_qkv, NeoX RoPE, attention over the whole prompt (not causal),
attn_output, the residual add, a GeGLU FFN (ffn_up's rows gate, then up; SwiGLU where the file's
hidden_activation says silu), the residual add; the output norm. Every third layer is global, the
first of each three; the others see the tokens within half their sliding window either side, with
their own RoPE base (rope.freq_base_swa). A reranker's classification head (cls, cls.output) is
the engine's pooling, not run by the layers; it pools the mean where the file does not say
(llama.cpp's default for ModernBERT)."""
from __future__ import annotations

from numbers import Real
from typing import Any

from .spec import Architecture

# llama.cpp's load_swa_pattern(ml, 3, true): absent sliding_window_pattern, every 3rd layer is
# global, the first of each three
SWA_PATTERN = 3
# hidden_activation -> the FFN's gate activation, as llama.cpp's LLM_FFN_OP_TYPES_FROM_STRING (any
# other name: its default, GeGLU; relu / reglu, which no ModernBERT has, are refused)
ACTIVATIONS = {"gelu": "gelu", "geglu": "gelu", "silu": "silu", "swish": "silu", "swiglu": "silu"}


def layer_plan(get, n_layer: int, n_expert: int, n_ff_exp: int) -> dict[str, Any]:
    """As llama.cpp's modern-bert reads its hyperparameters: the sliding-window layers (none
    without a positive sliding_window; else sliding_window_pattern's flags per layer, or its n
    (absent: 3), every n-th layer global, the first of each n: load_swa_pattern's dense_first) and
    the FFN's gate activation (hidden_activation). Its LayerNorms' epsilon is required, as there."""
    if get("attention.layer_norm_epsilon") is None:
        raise ValueError("missing metadata key attention.layer_norm_epsilon")
    act = str(get("hidden_activation", "gelu"))
    if act in ("relu", "reglu"):
        raise ValueError(f"hidden_activation {act!r} (ReGLU) is not supported (gelu, silu)")
    plan: dict[str, Any] = {"activation": ACTIVATIONS.get(act, "gelu")}
    window = get("attention.sliding_window", 0)
    if not isinstance(window, Real) or isinstance(window, bool):
        raise ValueError(f"attention.sliding_window must be a whole number, got {window!r}")
    if int(window) <= 0:
        return {**plan, "sliding_window": 0, "layer_swa": (False,) * n_layer}
    pattern = get("attention.sliding_window_pattern", SWA_PATTERN)
    if hasattr(pattern, "__len__") and not isinstance(pattern, str):
        if len(pattern) != n_layer:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} flags for {n_layer} layers")
        return {**plan, "sliding_window": int(window), "layer_swa": tuple(bool(v) for v in pattern)}
    n = int(pattern)
    if n < 0:
        raise ValueError(f"sliding_window_pattern {n} must not be negative")
    return {**plan, "sliding_window": int(window), "layer_swa": tuple(n == 0 or il % n != 0 for il in range(n_layer))}


ARCHITECTURE = Architecture(
    name="modern-bert",
    rope_neox=True,
    activation="gelu",
    layer_norms=True,
    causal=False,
    classifier_pooling="mean",
    layer_plan=layer_plan,
    layer_plan_kind="GeGLU FFN (SwiGLU where the file's hidden_activation says silu), a symmetric sliding window "
                    "on 2 of 3 layers (the first of each three global) with their own RoPE base",
)
