"""The decoder, described once for every backend, over the primitives a backend implements.

A backend runs a model by giving `forward` an `ops` object with the primitives below and its
layers prepared as it likes (packed weights on the cpu backend, MLX arrays on mlx): the recipe
reads a layer's fields by role (qkv, wo, gate_up, down, experts and the norm weights, None-like
when the architecture has no such norm) and hands them back to the primitives untouched. Every
primitive names its result and the layer, with llama.cpp's tensor name where llama.cpp has one
("attn_norm", "kqv_out", ...; "qkv" and "ffn_gate_up" are infer's stacked products), so a backend
can trace each intermediate where llama.cpp's eval callback would see it
(scripts/compare_llamacpp.py) without a line here.

The primitives are the methods of Primitives below (x: the residual stream, h: a normalized
input, both (T, n_embd)); the backends implement them without importing this module (backends
import no model code), and mypy checks that each backend's class is one (tests/typing_seams.py).
A backend may fuse what follows a product into one call (the cpu backend does): the primitives
are the unit of the recipe, not of the kernels.
"""
from __future__ import annotations

from typing import Any, Protocol, TypeVar

A = TypeVar("A")  # a backend's array type (numpy's ndarray on cpu, mx.array on mlx)


class Primitives(Protocol[A]):
    """What the recipe asks of a backend. Weights (w, post, b, ws) and layers (ly) are the
    backend's own, prepared as it likes and handed back untouched; absent norms and biases are
    whatever the backend makes of an absent tensor (None, an empty array)."""

    def embed(self, name: str) -> A:
        """x: the batch's token embeddings times config.embed_scale; in the BERT family
        (Architecture.bert_norms) plus token type 0's row and the position embeddings where the
        model has them ("inp_embd"), then LayerNorm'd by token_embd_norm ("inp_norm")."""

    def norm(self, x: A, w: Any, name: str, il: int) -> A:
        """h: RMSNorm(x) * w, or x itself where w is absent."""

    def linear(self, ws: Any, h: A, name: str, il: int) -> A:
        """y: h times a prepared weight (several side by side: Q|K|V, gate|up)."""

    def bias(self, y: A, b: Any, name: str, il: int) -> A:
        """y plus a bias where the layer has one (gpt-oss's attention output), named either way
        (the attention's product is "attn_wo", its output with the bias "attn_out")."""

    def attention(self, qkv: A, ly: Any, il: int) -> A:
        """From the Q|K|V products to the attention output: biases, Q/K norms, RoPE, the cache
        write and the attention over the cache, with the layer's sinks where it has them ("kqv_out")."""

    def add_norm(self, x: A, o: A, post: Any, w: Any, il: int, name: str, next_name: str,
                 next_il: int) -> tuple[A, A]:
        """(x, h): x += residual_scale * RMSNorm(o) * post (o alone where post is absent), then
        h = norm(x, w) under next_name."""

    def per_layer_inputs(self, x: A) -> None:
        """Gemma 4 E2B/E4B: every layer's per-layer input from the scaled token embeddings x, kept
        for per_layer_gate ("inp_per_layer")."""

    def per_layer_gate(self, x: A, ly: Any, il: int) -> A:
        """GELU(inp_gate · x) times layer il's per-layer input, (T, P)."""

    def add_scale_norm(self, x: A, o: A, post: Any, s: Any, w: Any, il: int, next_name: str,
                       next_il: int) -> tuple[A, A]:
        """add_norm's (x, h) ending a layer ("l_out"), x times s (the layer's output scale, (1,):
        Gemma 4's layer_output_scale) before the norm that follows where the layer has one."""

    def add_layer_norm(self, x: A, o: A, w: Any, b: Any, name: str, il: int) -> A:
        """x: LayerNorm(x + o) * w + b (ggml_norm, then the weight and the bias: the BERT family's
        attn_output_norm and layer_output_norm after a residual add), under name."""

    def qk_layer_norm(self, qkv: A, ly: Any, il: int) -> A:
        """The Q|K|V products with Q and K each LayerNorm'd over its whole projection, times the
        weight plus the bias, where the layer has those norms (jina-bert-v2's attn_q_norm and
        attn_k_norm with their biases); else qkv as it is."""

    def act(self, y: A, il: int) -> A:
        """The FFN's activation of a product without a gate (bert's GELU(ffn_up + bias)) ("ffn_act")."""

    def glu(self, gu: A, il: int) -> A:
        """act(gate) * up of the two halves of gu ("ffn_act")."""

    def moe(self, h: A, ly: Any, il: int, r: A | None = None) -> A:
        """The mixture of experts (router, the chosen experts' gated FFNs, their weighted sum, with
        the layer's router and expert biases where it has them: llama.cpp's build_moe_ffn)
        ("ffn_moe_out"). r: the router's input where it is not h (Gemma 4: RMSNorm(r) without a
        weight, times 1 / sqrt(n_embd), times the layer's router_scale); each expert's output times
        the layer's expert_scale where it has one (Gemma 4's ffn_down_exps.scale)."""

    def shared_expert(self, h: A, o: A, ly: Any, il: int) -> A:
        """The experts' output o plus the layer's shared expert: the gated FFN of h
        (ffn_{gate,up,down}_shexp), times sigmoid(ffn_gate_inp_shexp · h) where the layer has that
        gate (qwen35moe, qwen3next; granitehybrid's is added as it is) ("ffn_out")."""

    def shortconv(self, bcx: A, ly: Any, il: int) -> A:
        """LFM2's gated short convolution from in_proj's B | C | x (T, 3 n_embd): C * conv(B * x),
        the depthwise causal convolution of width L over each sequence's inputs B * x, its previous
        L - 1 of them taken from (and the last L - 1 left in) the sequence's recurrent state
        (llama.cpp's ggml_ssm_conv between its "in_proj" and "out_proj") ("shortconv_y")."""

    def delta_net(self, proj: A, ly: Any, il: int) -> A:
        """Qwen3.5's gated delta net from its input products Q|K|V, z, beta, alpha side by side:
        the causal convolution over Q|K|V with SiLU, its last inputs kept in (and earlier ones
        taken from) the sequence's "conv" state; Q, K L2-normalized; the gated delta rule over the
        sequence's "delta" state; each head's RMSNorm times SiLU(z) ("final_output")."""

    def mamba2(self, proj: A, ly: Any, il: int) -> A:
        """Mamba-2's mixer from its in-projection z|xBC|dt: the causal convolution over xBC with
        its bias and SiLU, its last inputs kept in (and earlier ones taken from) the sequence's
        "conv" state; the selective scan over the sequence's "ssm" state, plus x D; times SiLU(z);
        the RMSNorm of each group times the norm weight (granitehybrid) ("mamba2_y_norm")."""

    def attn_gate(self, a: A, qkv: A, il: int) -> A:
        """The attention's output times sigmoid of the gate, the last n_head * head_dim columns of
        the Q|K|V|gate products (Qwen3.5) ("attn_gated")."""

    def rms_norm(self, y: A, w: Any, name: str, il: int) -> A:
        """RMSNorm(y) * w of a product y (deepseek2's attn_q_a_norm), in y's place where the backend
        likes."""

    def mla_attention(self, q: A, kv: A, ly: Any, il: int) -> A:
        """Multi-head latent attention (deepseek2) from the Q product (T, n_head * key_length_mla:
        per head nope, then RoPE part) and attn_kv_a_mqa's (T, kv_lora_rank + n_rot): the latent's
        norm, RoPE of both RoPE parts, the cache row latent | key part written, each head's nope Q
        absorbed through attn_k_b, attention over the latent cache (V: each row's latent), each
        head's output through attn_v_b ("kqv_out", (T, n_head * value_length_mla))."""

    def logits(self, h: A) -> A | None:
        """The output product of the wanted rows (softcaps and logit_scale applied); None where
        a backend computes none (no row wanted)."""


def dense_layer(ops: Primitives[Any], ly: Any, il: int, x: Any, h: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """One pre-norm decoder layer (attention, then a gated FFN, or a mixture of experts where the
    layer has experts), with the optional post-norms. nxt: (norm weight, tensor name, layer) of the
    norm that follows: the next layer's attn_norm, or the output norm ("result_norm", -1)."""
    qkv = ops.linear(ly.qkv, h, "qkv", il)
    a = ops.attention(qkv, ly, il)
    o = ops.bias(ops.linear(ly.wo, a, "attn_wo", il), ly.bo, "attn_out", il)
    return ffn_block(ops, ly, il, x, o, nxt)


def ffn_block(ops: Primitives[Any], ly: Any, il: int, x: Any, o: Any, nxt: tuple[Any, str, int]) -> tuple[Any, Any]:
    """The second half of a layer: o (the first block's output) added to x, then the gated FFN or
    the mixture of experts (and its shared expert where it has one) and its residual add, ending
    on the norm that follows (nxt)."""
    x, h = ops.add_norm(x, o, ly.post_attn_norm, ly.ffn_norm, il, "ffn_inp", "ffn_norm", il)
    if ly.experts:
        o = ops.moe(h, ly, il)
        if ly.shexp:
            o = ops.shared_expert(h, o, ly, il)
    else:
        gu = ops.linear(ly.gate_up, h, "ffn_gate_up", il)
        o = ops.linear(ly.down, ops.glu(gu, il), "ffn_out", il)
    return ops.add_norm(x, o, ly.post_ffn_norm, nxt[0], il, "l_out", nxt[1], nxt[2])


def forward(ops: Primitives[Any], architecture: Any, layers: list[Any], output_norm: Any) -> Any:
    """The whole model over one batch: embeddings, the layers (the architecture's recipe), logits."""
    x = ops.embed("inp_scaled")
    h = ops.norm(x, layers[0].attn_norm, "attn_norm", 0)
    layer = architecture.layer
    last = len(layers) - 1
    for il, ly in enumerate(layers):
        nxt = (layers[il + 1].attn_norm, "attn_norm", il + 1) if il < last else (output_norm, "result_norm", -1)
        x, h = layer(ops, ly, il, x, h, nxt)
    return ops.logits(h)
