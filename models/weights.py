"""A model's weights as the backends take them, checked against what its configuration needs:
the one description of a model's tensors for GGUF files and model folders alike."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infer.quant.affine import AffineTensor
from infer.quant.tensor import QTensor, StackedRows
from infer.quant.types import BF16, F16, F32

from .config import ModelConfig
from .encoder_weights import bert_embd, bert_layer
from .matrix import Matrix, ModelLoadError, rows
from .mixer_weights import gated_delta_net, mamba2, mla, q_and_gate, shortconv
from .pooling_head import HEAD_BIASES, PoolingHead, PoolingHeadError, load_head


@dataclass(frozen=True)
class LayerWeights:
    """One layer's tensors by role; a norm the architecture does not have is None, and a recurrent
    layer (ModelConfig.layer_recurrent) has no attention matrices (None) but its own."""

    attn_norm: np.ndarray | None
    wq: Matrix | StackedRows | None  # StackedRows: a gated attention's (attn_gate below)
    wk: Matrix | None
    wv: Matrix | None
    wo: Matrix | None
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    post_attn_norm: np.ndarray | None
    ffn_norm: np.ndarray | None
    w_gate: Matrix | None  # the dense FFN (None in a mixture of experts)
    w_up: Matrix | None
    w_down: Matrix | None
    post_ffn_norm: np.ndarray | None
    # a mixture of experts: the router (n_expert, n_embd) and per expert its gate, up, down matrices
    router: Matrix | None = None
    experts: tuple[tuple[Matrix | None, Matrix, Matrix], ...] = ()  # gate None: act(up) (Architecture.ffn_gated)
    # the shared expert (Architecture.shared_expert): its gate, up (n_ff_shexp, n_embd) and down
    # (n_embd, n_ff_shexp) matrices, and the (1, n_embd) row of its sigmoid gate (None: added ungated)
    shexp: tuple[Matrix, Matrix, Matrix] | None = None
    shexp_gate: Matrix | None = None
    # gpt-oss (architecture.extra_biases, attn_sinks): the attention output's bias (n_embd,), the
    # sink logit per head (n_head,), the router's bias (n_expert,) and the experts' biases
    # (n_expert, n_ff_exp) for gate and up, (n_expert, n_embd) for down; None where absent
    bo: np.ndarray | None = None
    sinks: np.ndarray | None = None
    router_bias: np.ndarray | None = None
    expert_biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # the experts' selection bias (n_expert,), added to the router's probabilities for the choice
    # alone (llama.cpp's exp_probs_b: LFM2-MoE); None where absent
    exp_probs_b: np.ndarray | None = None
    # LFM2's short convolution (a recurrent layer): in_proj (3 n_embd, n_embd) to B | C | x, the
    # depthwise kernel (n_embd, L) float32 (oldest input first), out_proj (n_embd, n_embd)
    shortconv_in: Matrix | None = None
    shortconv: np.ndarray | None = None
    shortconv_out: Matrix | None = None
    # Qwen3.5's gated attention (Architecture.attn_output_gate): the gate's rows of attn_q (n_head *
    # head_dim, n_embd), taken out of the file's per-head interleaving of Q and gate (as wq is)
    attn_gate: StackedRows | None = None
    # Qwen3.5's gated delta net (a recurrent layer; ModelConfig.ssm_*): Q|K|V (conv channels,
    # n_embd), z (inner, n_embd), beta and alpha (value heads, n_embd); the convolution's kernel
    # (conv channels, width) float32, oldest input first; dt bias, A, per value head; the output
    # norm (S,); ssm_out (n_embd, inner)
    ssm_qkv: Matrix | None = None
    ssm_z: Matrix | None = None
    ssm_beta: Matrix | None = None
    ssm_alpha: Matrix | None = None
    ssm_conv: np.ndarray | None = None
    ssm_dt: np.ndarray | None = None
    ssm_a: np.ndarray | None = None
    ssm_norm: np.ndarray | None = None
    ssm_out: Matrix | None = None
    # Mamba-2's mixer (granitehybrid; ModelConfig.mamba2): the in-projection z|xBC|dt (I + C + H,
    # n_embd) and, beside ssm_conv, ssm_dt, ssm_a, ssm_out above, the convolution's bias (C,), D
    # per head (H,); ssm_norm is then the grouped norm's weight (I,)
    ssm_in: Matrix | None = None
    ssm_conv_b: np.ndarray | None = None
    ssm_d: np.ndarray | None = None
    # multi-head latent attention (deepseek2; ModelConfig.n_lora_kv): wq is attn_q, or attn_q_b
    # after attn_q_a (n_lora_q, n_embd) and its norm; attn_kv_a_mqa (n_lora_kv + n_rot, n_embd) and
    # the latent's norm (n_lora_kv,); per head attn_k_b's (n_lora_kv, nope) and attn_v_b's
    # (head_dim_v_mla, n_lora_kv) matrices (views of the 3-D tensors)
    q_a: Matrix | None = None
    q_a_norm: np.ndarray | None = None
    kv_a: Matrix | None = None
    kv_a_norm: np.ndarray | None = None
    k_b: tuple[Matrix, ...] = ()
    v_b: tuple[Matrix, ...] = ()
    # Gemma 4: V's RMSNorm per head without a weight, as a weight of ones (head_dim_v,); the layer's
    # output scale (1,) (layer_output_scale); None where absent
    v_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None
    # Gemma 4's per-layer embeddings (ModelConfig.n_embd_per_layer P): inp_gate (P, n_embd), proj
    # (n_embd, P), post_norm (n_embd,); None where absent
    ple_gate: Matrix | None = None
    ple_proj: Matrix | None = None
    ple_norm: np.ndarray | None = None
    # Gemma 4's layers of experts (Architecture.shared_expert "dense": w_gate, w_up, w_down above are
    # the dense FFN beside the experts): the router input's scale ffn_gate_inp.scale (n_embd,), each
    # expert's output scale ffn_down_exps.scale (n_expert,) (None where absent), the experts' input
    # norm pre_ffw_norm_2 and the norms after the dense FFN (post_ffw_norm_1) and the experts
    # (post_ffw_norm_2), each (n_embd,)
    router_scale: np.ndarray | None = None
    expert_scale: np.ndarray | None = None
    pre_ffn_norm_2: np.ndarray | None = None
    post_ffn_norm_1: np.ndarray | None = None
    post_ffn_norm_2: np.ndarray | None = None
    # the BERT family (Architecture.bert_norms; None where absent): the LayerNorms after the
    # attention's and the FFN's residual adds, weight and bias (D,); the FFN's biases, ffn_up's (F,)
    # and ffn_down's (D,) (a bert FFN is act(up) alone: w_gate None)
    attn_out_norm: np.ndarray | None = None
    attn_out_norm_b: np.ndarray | None = None
    layer_out_norm: np.ndarray | None = None
    layer_out_norm_b: np.ndarray | None = None
    # jina-embeddings-v2-base-code's second LayerNorm after the attention (attn_norm_2), weight and
    # bias: LayerNorm(attn_output_norm's output + the layer's input); None where absent
    attn_norm_2: np.ndarray | None = None
    attn_norm_2_b: np.ndarray | None = None
    up_b: np.ndarray | None = None  # a gated FFN's: (2F,), gate's then up's (zeros where gate has none)
    down_b: np.ndarray | None = None
    # jina-bert-v2's LayerNorms of Q and of K over the whole projection, weight and bias; None where absent
    q_layer_norm: np.ndarray | None = None
    q_layer_norm_b: np.ndarray | None = None
    k_layer_norm: np.ndarray | None = None
    k_layer_norm_b: np.ndarray | None = None
    # with those norms, the Q|K|V biases side by side, added before them (qk_layer_norm: bq, bk, bv
    # are then None, so that the attention adds none); None where the layer has no such norm
    qkv_b: np.ndarray | None = None


@dataclass(frozen=True)
class ModelWeights:
    token_embd: Matrix
    output_norm: np.ndarray
    output: Matrix  # token_embd itself when the embeddings are tied
    rope_freqs: np.ndarray | None  # RoPE frequency divisors (Llama 3.1's; LongRoPE's short factors)
    rope_freqs_long: np.ndarray | None  # LongRoPE's factors for contexts beyond config.n_ctx_orig
    layers: tuple[LayerWeights, ...]
    # Gemma 4's per-layer embeddings: per_layer_token_embd (n_vocab, n_layer * P), per_layer_model_proj
    # (n_layer * P, n_embd), per_layer_proj_norm (P,); None without them
    ple_embd: Matrix | None = None
    ple_model_proj: Matrix | None = None
    ple_proj_norm: np.ndarray | None = None
    # the BERT family (Architecture.bert_norms): the embeddings' LayerNorm, weight and bias (D,);
    # token type 0's row of token_types (D,), None where the file has none; the absolute position
    # embeddings position_embd (n_ctx_train, D) (Architecture.pos_embd), None where none
    token_embd_norm: np.ndarray | None = None
    token_embd_norm_b: np.ndarray | None = None
    token_type: np.ndarray | None = None
    pos_embd: Matrix | None = None
    # the pooling head after an embedding's pooled row (rank pooling's classifier, Dense projections;
    # pooling_head.py): for the engine, not the backends' layers; None without one
    head: PoolingHead | None = None


@dataclass(frozen=True, eq=False)
class Model:
    path: Path
    config: ModelConfig
    metadata: dict[str, Any]
    weights: ModelWeights
    format: str = "gguf"  # "gguf", or "mlx" for an MLX-format folder (affine-quantized safetensors)

    def for_context(self, n_ctx: int) -> "Model":
        """The model as it runs with sequences of up to n_ctx tokens: LongRoPE models (phi3) rotate
        by their long factors beyond the context they were trained at, as llama.cpp chooses (it
        compares its context rounded up to a multiple of 256)."""
        w = self.weights
        if w.rope_freqs_long is None or -(-n_ctx // 256) * 256 <= self.config.n_ctx_orig:
            return self
        return replace(self, weights=replace(w, rope_freqs=w.rope_freqs_long))


_USED_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_qkv.bias")
# the BERT family's biases outside the layers: the embeddings' norm and a reranker's head; modern-bert's
# (Architecture.layer_norms): its reranker head's output bias alone, as llama.cpp loads it
_BERT_BIASES = ("token_embd_norm.bias",)


def collect_weights(tensors: Mapping[str, Matrix | np.ndarray], path: Path | str, cfg: ModelConfig) -> ModelWeights:
    """The weights `cfg` needs, by GGUF name, shapes checked. Matrices are QTensor or AffineTensor;
    vectors QTensor or float32 arrays."""

    def get(name: str, shape: tuple[int, ...] | None, required: bool = True) -> Any:
        t = tensors.get(name)
        if t is None:
            if required:
                raise ModelLoadError(f"{path}: missing tensor {name!r} for architecture {cfg.arch}")
            return None
        if shape is not None and tuple(t.shape) != shape:
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t

    def vec(name: str, n: int | tuple[int, ...], required: bool = True) -> np.ndarray | None:
        """A vector of n floats, or a small float table of shape n (gpt-oss's per-expert biases)."""
        shape = (n,) if isinstance(n, int) else n
        t = get(name, shape, required)
        if t is None or isinstance(t, np.ndarray):
            return t if t is None else np.asarray(t, np.float32)
        if isinstance(t, AffineTensor):
            raise ModelLoadError(f"{path}: tensor {name!r} is a vector and cannot be affine-quantized")
        if t.type_id not in (F32, F16, BF16):  # llama.cpp never quantizes a vector; a file that does is corrupt
            raise ModelLoadError(f"{path}: tensor {name!r} is a vector of type {t.type_name}; expected F32, F16 or BF16")
        # Norm weights and biases are small: keep them as float32 (a copy only if not F32 already).
        return t.raw.view(np.float32).reshape(shape) if t.type_id == F32 else t.dequantize().reshape(shape)

    if cfg.architecture.upgrade_tensors is not None:  # an older layout's tensors as the current one's
        try:
            tensors = cfg.architecture.upgrade_tensors(tensors, cfg)
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from None
    used = _USED_BIASES + cfg.architecture.extra_biases + HEAD_BIASES + (_BERT_BIASES if cfg.architecture.bert_norms else ())
    for name in tensors:  # a bias infer has no place for would be silently dropped: refuse the file
        if name.endswith(".bias") and not name.endswith(used):
            raise ModelLoadError(f"{path}: tensor {name!r} is not supported for architecture {cfg.arch}")
    D, F = cfg.n_embd, cfg.n_ff
    arch = cfg.architecture
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        lw: dict[str, Any] = {}
        # both norms or neither (the backends normalize Q and K alike)
        qk_required = not arch.qk_norm_optional or p + "attn_q_norm.weight" in tensors \
            or p + "attn_k_norm.weight" in tensors
        n_head_kv, head_dim, head_dim_v, _ = cfg.attn_shape(i)  # a layer's own (Gemma 4's differ by kind)
        q_dim, kv_dim, v_dim = cfg.n_head * head_dim, n_head_kv * head_dim, n_head_kv * head_dim_v
        qk_norm = {"": (0, 0), "head": (head_dim, head_dim), "all": (q_dim, kv_dim)}[arch.qk_norm]
        own_kv = cfg.kv_source(i) == i
        F = cfg.layer_n_ff(i)
        recurrent = bool(cfg.layer_recurrent) and cfg.layer_recurrent[i]
        moe = cfg.layer_experts(i)
        if recurrent:
            wq = wk = wv = wo = bq = bk = bv = None
            own = (mamba2(get, vec, p, cfg) if cfg.mamba2 else gated_delta_net(get, vec, p, cfg)
                   if cfg.ssm_state_size else shortconv(get, vec, p, cfg))
        elif cfg.kv_v_in_k:
            wk = wv = bq = bk = bv = None
            own = mla(get, vec, p, cfg)
            wq = own.pop("wq")
            wo = get(p + "attn_output.weight", (D, cfg.n_head * cfg.head_dim_v_mla))
        elif arch.attn_output_gate:
            wq, gate = q_and_gate(get(p + "attn_q.weight", (2 * q_dim, D)), cfg.n_head, path, p)
            wk, wv = get(p + "attn_k.weight", (kv_dim, D)), get(p + "attn_v.weight", (v_dim, D))
            bq = bk = bv = None
            wo = get(p + "attn_output.weight", (D, cfg.n_head * head_dim_v))
            own = {"attn_gate": gate}
        elif not own_kv:  # it reads an earlier layer's K/V (Gemma 4): Q alone, whatever K/V the file has
            wq, wk, wv = get(p + "attn_q.weight", (q_dim, D)), None, None
            bq = bk = bv = None
            wo = get(p + "attn_output.weight", (D, cfg.n_head * head_dim_v))
            own = {}
        else:
            wq, wk, wv = _qkv(tensors, get, p, D, (q_dim, kv_dim, v_dim), path, arch.v_from_k)
            bq, bk, bv = _qkv_biases(tensors, vec, p, (q_dim, kv_dim, v_dim))
            wo = get(p + "attn_output.weight", (D, cfg.n_head * head_dim_v))
            own = {}
        if arch.v_norm and not recurrent:
            own["v_norm"] = np.ones(head_dim_v, np.float32)
        if arch.out_scale:
            own["out_scale"] = vec(p + "layer_output_scale.weight", 1, required=False)
        if moe and arch.shared_expert == "dense":  # Gemma 4: the router's and experts' scales, the branches' norms
            own.update(router_scale=vec(p + "ffn_gate_inp.scale", D),
                       expert_scale=vec(p + "ffn_down_exps.scale", cfg.n_expert, required=False),
                       pre_ffn_norm_2=vec(p + "pre_ffw_norm_2.weight", D),
                       post_ffn_norm_1=vec(p + "post_ffw_norm_1.weight", D),
                       post_ffn_norm_2=vec(p + "post_ffw_norm_2.weight", D))
        if cfg.n_embd_per_layer:
            P = cfg.n_embd_per_layer
            own.update(ple_gate=get(p + "inp_gate.weight", (P, D)), ple_proj=get(p + "proj.weight", (D, P)),
                       ple_norm=vec(p + "post_norm.weight", D))
        if arch.bert_norms:
            lw = bert_layer(tensors, vec, p, cfg, F, moe)
            if lw["q_layer_norm"] is not None or lw["k_layer_norm"] is not None:  # biases before the norms
                lw["qkv_b"] = np.concatenate([np.zeros(n, np.float32) if b is None else b
                                              for b, n in zip((bq, bk, bv), (q_dim, kv_dim, v_dim))])
                bq = bk = bv = None
        layers.append(LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", D, required=not (arch.layer_norms and i == 0)) if arch.pre_norms
            else None,
            wq=wq, wk=wk, wv=wv, wo=wo,
            bq=bq, bk=bk, bv=bv,
            q_norm=vec(p + "attn_q_norm.weight", qk_norm[0], qk_required) if qk_norm[0] and not recurrent else None,
            k_norm=vec(p + "attn_k_norm.weight", qk_norm[1], qk_required)
            if qk_norm[1] and not recurrent and own_kv else None,
            post_attn_norm=vec(p + "post_attention_norm.weight", D) if arch.post_norms else None,
            ffn_norm=vec(p + arch.ffn_norm_tensor + ".weight", D) if arch.pre_norms else None,
            **(_experts(tensors, get, p, cfg) if moe else {}),
            **({**(_gate_up(tensors, get, p, D, F) if arch.ffn_gated
                   else {"w_gate": None, "w_up": get(p + "ffn_up.weight", (F, D))}),
                "w_down": get(p + "ffn_down.weight", (D, F))}
               if not moe or arch.shared_expert == "dense" else {"w_gate": None, "w_up": None, "w_down": None}),
            post_ffn_norm=vec(p + "post_ffw_norm.weight", D) if arch.post_norms else None,
            **_extras(vec, p, cfg, moe), **lw, **own,
        ))
    token_embd = get("token_embd.weight", (cfg.n_vocab, D))
    output = get("output.weight", (cfg.n_vocab, D), required=False)
    if output is None:
        output = token_embd
    try:
        head = load_head(tensors, path, cfg)
    except PoolingHeadError as e:
        raise ModelLoadError(str(e)) from None
    return ModelWeights(
        token_embd=token_embd,
        # none (bert): a weight of ones, which the backends take for no norm where they see one
        output_norm=vec(arch.output_norm_tensor + ".weight", D) if arch.output_norm_tensor else np.zeros(0, np.float32),
        output=output,
        rope_freqs=_rope_freqs(tensors, vec, cfg.n_rot // 2),
        rope_freqs_long=vec("rope_factors_long.weight", cfg.n_rot // 2, required=False),
        layers=tuple(layers),
        **(_per_layer_embd(get, vec, cfg) if cfg.n_embd_per_layer else {}),
        **(bert_embd(get, vec, cfg) if arch.bert_norms else {}),
        **({"token_embd_norm": vec("token_embd_norm.weight", D)} if arch.layer_norms else {}),
        head=head,
    )


def _per_layer_embd(get, vec, cfg: ModelConfig) -> dict[str, Any]:
    """Gemma 4's per-layer token embeddings and their projection from the embedding (llama.cpp's
    LLM_TENSOR_PER_LAYER_*)."""
    n = cfg.n_layer * cfg.n_embd_per_layer
    embd = get("per_layer_token_embd.weight", (cfg.n_vocab, n))
    if not isinstance(embd, QTensor):
        raise ModelLoadError(f"per_layer_token_embd in {type(embd).__name__} form is not supported")
    return {"ple_embd": embd, "ple_model_proj": get("per_layer_model_proj.weight", (n, cfg.n_embd)),
            "ple_proj_norm": vec("per_layer_proj_norm.weight", cfg.n_embd_per_layer)}


def _qkv(tensors, get, p: str, D: int, dims: tuple[int, int, int], path,
         v_from_k: bool = False) -> tuple[Matrix, Matrix, Matrix]:
    """Q, K, V: three matrices, or row ranges of one fused attn_qkv (which llama.cpp accepts for every
    architecture; phi3 files have it). v_from_k: a layer without attn_v takes K's product as V
    (Gemma 4's attention_k_eq_v layers)."""
    fused = tensors.get(p + "attn_qkv.weight")
    if fused is None and v_from_k and p + "attn_v.weight" not in tensors:
        wk = get(p + "attn_k.weight", (dims[1], D))
        return get(p + "attn_q.weight", (dims[0], D)), wk, wk
    if fused is None:
        return (get(p + "attn_q.weight", (dims[0], D)), get(p + "attn_k.weight", (dims[1], D)),
                get(p + "attn_v.weight", (dims[2], D)))
    fused = get(p + "attn_qkv.weight", (sum(dims), D))
    return rows(fused, 0, dims[0]), rows(fused, dims[0], dims[0] + dims[1]), rows(fused, dims[0] + dims[1], sum(dims))


def _qkv_biases(tensors, vec, p: str, dims: tuple[int, int, int]) -> tuple:
    """The Q, K, V biases (None where absent), from three vectors or one fused attn_qkv.bias."""
    if p + "attn_qkv.bias" in tensors:
        b = vec(p + "attn_qkv.bias", sum(dims))
        return b[:dims[0]], b[dims[0]:dims[0] + dims[1]], b[dims[0] + dims[1]:]
    return (vec(p + "attn_q.bias", dims[0], required=False), vec(p + "attn_k.bias", dims[1], required=False),
            vec(p + "attn_v.bias", dims[2], required=False))


def _gate_up(tensors, get, p: str, D: int, F: int) -> dict[str, Matrix]:
    """The FFN's gate and up matrices: two, or the halves of one fused ffn_up of 2 * n_ff rows, gate
    first (phi3; llama.cpp's swiglu takes the first half as the gate)."""
    if p + "ffn_gate.weight" in tensors or p + "ffn_up.weight" not in tensors:
        return {"w_gate": get(p + "ffn_gate.weight", (F, D)), "w_up": get(p + "ffn_up.weight", (F, D))}
    fused = get(p + "ffn_up.weight", (2 * F, D))
    return {"w_gate": rows(fused, 0, F), "w_up": rows(fused, F, 2 * F)}


def _rope_freqs(tensors, vec, n: int) -> np.ndarray | None:
    """rope_freqs, or LongRoPE's short factors (the long ones replace them in Model.for_context)."""
    if "rope_freqs.weight" in tensors:
        return vec("rope_freqs.weight", n)
    return vec("rope_factors_short.weight", n, required=False)


def _experts(tensors, get, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """A mixture of experts' router and experts: each expert's matrices are row ranges of the 3-D
    ffn_{gate,up,down}_exps tensors, or of one ffn_gate_up_exps whose expert rows are its gate's,
    then its up's (Gemma 4's converter writes it; llama.cpp's views of its product) (views of the
    file; llama.cpp's layout)."""
    D, E, F = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    if not cfg.architecture.ffn_gated:  # act(up) alone (nomic-bert-moe's GELU experts)
        up, down = get(p + "ffn_up_exps.weight", (E, F, D)), get(p + "ffn_down_exps.weight", (E, D, F))
        for t in (up, down):
            if not isinstance(t, QTensor):
                raise ModelLoadError(f"expert tensors in {type(t).__name__} form are not supported")
        return {"router": get(p + "ffn_gate_inp.weight", (E, D)),
                "experts": tuple((None, rows(up, e * F, (e + 1) * F), rows(down, e * D, (e + 1) * D)) for e in range(E))}
    if p + "ffn_gate_up_exps.weight" in tensors:
        gate = up = get(p + "ffn_gate_up_exps.weight", (E, 2 * F, D))
        gate_at, up_at, step = 0, F, 2 * F
    else:
        gate, up = get(p + "ffn_gate_exps.weight", (E, F, D)), get(p + "ffn_up_exps.weight", (E, F, D))
        gate_at, up_at, step = 0, 0, F
    down = get(p + "ffn_down_exps.weight", (E, D, F))
    for t in (gate, up, down):
        if not isinstance(t, QTensor):
            raise ModelLoadError(f"expert tensors in {type(t).__name__} form are not supported")
    experts = tuple((rows(gate, e * step + gate_at, e * step + gate_at + F),
                     rows(up, e * step + up_at, e * step + up_at + F), rows(down, e * D, (e + 1) * D))
                    for e in range(E))
    out = {"router": get(p + "ffn_gate_inp.weight", (E, D)), "experts": experts}
    if cfg.n_ff_shexp:  # a shared expert (Architecture.shared_expert), with its gate's row where sigmoid-gated
        Fs = cfg.n_ff_shexp
        out["shexp"] = (get(p + "ffn_gate_shexp.weight", (Fs, D)), get(p + "ffn_up_shexp.weight", (Fs, D)),
                        get(p + "ffn_down_shexp.weight", (D, Fs)))
        if cfg.architecture.shared_expert == "sigmoid":
            out["shexp_gate"] = _row(get(p + "ffn_gate_inp_shexp.weight", None), D, p + "ffn_gate_inp_shexp.weight")
    return out


def _row(t: Matrix, D: int, name: str) -> QTensor:
    """A vector of D weights (a GGUF's (D,) or (1, D): llama.cpp takes either) as a (1, D) matrix."""
    if not isinstance(t, QTensor) or t.shape not in ((D,), (1, D)):
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(t.shape)}, expected ({D},) in GGML blocks")
    return QTensor(t.type_id, (1, D), t.raw.reshape(1, -1))


def _extras(vec, p: str, cfg: ModelConfig, moe: bool) -> dict[str, Any]:
    """The attention sinks and the biases beyond Q/K/V's of the architectures that have them
    (Architecture.attn_sinks, extra_biases: gpt-oss; the experts' selection bias: LFM2-MoE), as
    float32; absent, nothing. moe: the layer has experts (the router's and experts' biases)."""
    arch, D, E, F = cfg.architecture, cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    has = set(arch.extra_biases)
    out: dict[str, Any] = {}
    if arch.attn_sinks:
        out["sinks"] = vec(p + "attn_sinks.weight", cfg.n_head)
    if "attn_output.bias" in has:
        out["bo"] = vec(p + "attn_output.bias", D, required="attn_output.bias" not in arch.optional_biases)
    if "ffn_gate_inp.bias" in has and moe:
        out["router_bias"] = vec(p + "ffn_gate_inp.bias", E)
    if "exp_probs_b.bias" in has and moe:
        out["exp_probs_b"] = vec(p + "exp_probs_b.bias", E, required="exp_probs_b.bias" not in arch.optional_biases)
    if "ffn_gate_exps.bias" in has and moe:
        out["expert_biases"] = (vec(p + "ffn_gate_exps.bias", (E, F)), vec(p + "ffn_up_exps.bias", (E, F)),
                                vec(p + "ffn_down_exps.bias", (E, D)))
    return out
