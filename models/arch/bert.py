"""BERT (all-MiniLM, bge, mxbai-embed, snowflake-arctic-embed; XLM-RoBERTa's bge-m3 and
bge-reranker, with a Unigram vocabulary; llama.cpp's src/models/bert.cpp): an encoder for
embeddings. The token's embedding plus token type 0's row and its absolute position's
embedding, LayerNorm'd with a bias (token_embd_norm); then per layer, post-norm: Q/K/V with biases, attention over the
whole prompt (not causal), attn_output with its bias, the residual add and a LayerNorm
(attn_output_norm), a GELU FFN with biases (ffn_up, ffn_down; not gated), the residual add and a
LayerNorm (layer_output_norm). No output norm, no RoPE. A reranker's classification head (cls,
cls.output) is loaded beside the layers (ModelWeights.cls, cls_b, cls_out, cls_out_b), not run by the layers."""
from __future__ import annotations

from typing import Any

from .spec import Architecture


def encoder_layer(gated: bool):
    """The layer recipe (decoder.py's layer=) of a post-norm encoder layer (llama.cpp's bert.cpp
    graph): Q and K LayerNorm'd where the layer has their norms (jina-bert-v2), its FFN act(gate) *
    up (gated: nomic-bert's SwiGLU, jina-bert-v2's GEGLU) or act(up) (bert's GELU)."""

    def layer(ops: Any, ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
        # x: the layer's input, the previous layer's normalized output; what it returns is both the
        # residual stream and the next layer's input (there is no pre-norm)
        qkv = ops.qk_layer_norm(ops.linear(ly.qkv, x, "qkv", il), ly, il)
        a = ops.attention(qkv, ly, il)
        o = ops.bias(ops.linear(ly.wo, a, "attn_wo", il), ly.bo, "attn_out", il)
        x = ops.add_layer_norm(x, o, ly.attn_out_norm, ly.attn_out_norm_b, "ffn_inp", il)
        if ly.experts:  # nomic-bert-moe's every other layer: GELU experts without a gate
            o = ops.moe(x, ly, il)
        elif gated:  # act(gate) * up, the biases where the layer has them (jina-bert-v2's; nomic-bert has none)
            gu = ops.bias(ops.linear(ly.gate_up, x, "ffn_gate_up", il), ly.up_b, "ffn_gate_up_b", il)
            o = ops.bias(ops.linear(ly.down, ops.glu(gu, il), "ffn_down", il), ly.down_b, "ffn_out", il)
        else:
            u = ops.bias(ops.linear(ly.gate_up, x, "ffn_up", il), ly.up_b, "ffn_up_b", il)
            o = ops.bias(ops.linear(ly.down, ops.act(u, il), "ffn_down", il), ly.down_b, "ffn_out", il)
        x = ops.add_layer_norm(x, o, ly.layer_out_norm, ly.layer_out_norm_b, "l_out", il)
        return x, x

    return layer


BERT_BIASES = ("attn_output.bias", "attn_output_norm.bias", "layer_output_norm.bias", "ffn_up.bias",
               "ffn_down.bias", "attn_q_norm.bias", "attn_k_norm.bias")

ARCHITECTURE = Architecture(
    name="bert",
    rope_neox=False,
    pre_norms=False,
    activation="gelu",
    bert_norms=True,
    causal=False,
    pos_embd=True,
    ffn_gated=False,
    output_norm_tensor="",
    extra_biases=BERT_BIASES,
    optional_biases=BERT_BIASES,
    attention_kind="bidirectional (an encoder)",
    layer=encoder_layer(gated=False),
)
