"""The decoder, described once for every backend, over the primitives a backend implements.

A backend runs a model by giving `forward` an `ops` object with the primitives below and its
layers prepared as it likes (packed weights on the cpu backend, MLX arrays on mlx): the recipe
reads a layer's fields by role (qkv, wo, gate_up, down, experts and the norm weights, None-like
when the architecture has no such norm) and hands them back to the primitives untouched. Every
primitive names its result and the layer, with llama.cpp's tensor name where llama.cpp has one
("attn_norm", "kqv_out", ...; "qkv" and "ffn_gate_up" are infer's stacked products), so a backend
can trace each intermediate where llama.cpp's eval callback would see it
(scripts/compare_llamacpp.py) without a line here.

The primitives (x: the residual stream, h: a normalized input, both (T, n_embd)):
- embed(name) -> x: the batch's token embeddings times config.embed_scale;
- norm(x, w, name, il) -> h: RMSNorm(x) * w, or x itself where w is absent;
- linear(w, h, name, il) -> y: h times a prepared weight (several side by side: Q|K|V, gate|up);
- bias(y, b, name, il) -> y: y plus a bias where the layer has one (gpt-oss's attention output),
  named either way (the attention's product is "attn_wo", its output with the bias "attn_out");
- attention(qkv, layer, il) -> a: from the Q|K|V products to the attention output: biases, Q/K
  norms, RoPE, the cache write and the attention over the cache, with the layer's sinks where it
  has them ("kqv_out");
- add_norm(x, o, post, w, il, name, next_name, next_il) -> (x, h): x += residual_scale *
  RMSNorm(o) * post (o alone where post is absent), then h = norm(x, w) under next_name;
- glu(gu, il) -> y: act(gate) * up of the two halves of gu ("ffn_act");
- moe(h, layer, il) -> o: the mixture of experts (router, the chosen experts' gated FFNs, their
  weighted sum, with the layer's router and expert biases where it has them: llama.cpp's
  build_moe_ffn) ("ffn_moe_out");
- logits(h) -> the output product of the wanted rows (softcaps and logit_scale applied).
A backend may fuse what follows a product into one call (the cpu backend does): the primitives
are the unit of the recipe, not of the kernels.
"""
from __future__ import annotations

from typing import Any


def dense_layer(ops: Any, ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """One pre-norm decoder layer (attention, then a gated FFN, or a mixture of experts where the
    layer has experts), with the optional post-norms. nxt: (norm weight, tensor name, layer) of the
    norm that follows: the next layer's attn_norm, or the output norm ("result_norm", -1)."""
    qkv = ops.linear(ly.qkv, h, "qkv", il)
    a = ops.attention(qkv, ly, il)
    o = ops.bias(ops.linear(ly.wo, a, "attn_wo", il), ly.bo, "attn_out", il)
    x, h = ops.add_norm(x, o, ly.post_attn_norm, ly.ffn_norm, il, "ffn_inp", "ffn_norm", il)
    if ly.experts:
        o = ops.moe(h, ly, il)
    else:
        gu = ops.linear(ly.gate_up, h, "ffn_gate_up", il)
        o = ops.linear(ly.down, ops.glu(gu, il), "ffn_out", il)
    return ops.add_norm(x, o, ly.post_ffn_norm, nxt[0], il, "l_out", nxt[1], nxt[2])


def forward(ops: Any, architecture: Any, layers: list[Any], output_norm: Any) -> Any:
    """The whole model over one batch: embeddings, the layers (the architecture's recipe), logits."""
    x = ops.embed("inp_scaled")
    h = ops.norm(x, layers[0].attn_norm, "attn_norm", 0)
    layer = architecture.layer
    last = len(layers) - 1
    for il, ly in enumerate(layers):
        nxt = (layers[il + 1].attn_norm, "attn_norm", il + 1) if il < last else (output_norm, "result_norm", -1)
        x, h = layer(ops, ly, il, x, h, nxt)
    return ops.logits(h)
