"""What one architecture is, as data: everything infer needs to know about it, in one object.

An architecture module (llama.py, gemma3.py, ...) builds one Architecture; the registry
(__init__.py) is the only list of them. Consumers ask it instead of comparing names:
- ModelConfig.from_metadata: `scalars` reads the architecture's own hyperparameters;
- models/weights.py: which optional tensors the layer has (`qk_norm`, `pre_norms`, `post_norms`);
- the backends: the layer recipe (`layer`, decoder.py) and its options (`rope_neox`, `activation`,
  `prescale_q`, ...);
- the HF converter, the MLX-folder loader and the MLX exporter: the HF <-> GGUF layout
  (`hf_model_types`, `hf_class`, `hf_permute_qk`, `hf_norm_shift`, `hf_kvs`);
- engine/chat_template.py: `chat_template`, the built-in template of a file that has none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .decoder import dense_layer, forward

# get(key, default) -> the value of "<arch>.<key>" in the GGUF metadata, or default
MetaGet = Callable[[str, Any], Any]


def no_scalars(get: MetaGet, n_embd: int, n_head: int, head_dim: int, n_layer: int) -> dict[str, float]:
    """An architecture without hyperparameters of its own."""
    return {}


@dataclass(frozen=True)
class Architecture:
    name: str  # general.architecture of its GGUF files
    rope_neox: bool  # rotate (x[i], x[i+d/2]) pairs instead of adjacent (x[2i], x[2i+1])
    hf_model_types: tuple[str, ...] = ()  # config.json model_type values the HF converter takes
    hf_class: str = ""  # the transformers class an exported config.json names
    hf_export_type: str = ""  # the model_type an exported config.json gives (default: the first of hf_model_types)
    # Q/K RMSNorm before RoPE: "" none, "head" over each head (qwen3, gemma3), "all" over the whole
    # projection before it is split into heads (olmo2)
    qk_norm: str = ""
    qk_norm_optional: bool = False  # the Q/K norms only where a file has them (glm4moe: GLM-4.5, not -Air)
    pre_norms: bool = True  # RMSNorm before attention and before the FFN (all but olmo2)
    post_norms: bool = False  # RMSNorm of the attention and FFN outputs before the residual add (gemma, olmo2)
    activation: str = "silu"  # gate activation of the FFN: silu, gelu, or swiglu_oai (gpt-oss's clamped one)
    swa_pattern: int = 0  # every swa_pattern-th layer is global, the others sliding-window
    default_sliding_window: int = 0  # the window when the metadata gives none (gemma2: 4096)
    # RoPE of the sliding-window layers: base when the metadata has no rope.freq_base_swa (None: the
    # global base), and whether they take the global scaling (else none)
    swa_rope_base: float | None = 10000.0
    swa_rope_scaled: bool = False
    prescale_q: bool = False  # Q multiplied by the attention scale before Q·K (gemma), not the product after
    default_softcaps: tuple[float, float] = (0.0, 0.0)  # (final logit, attention) when the metadata gives none
    # a mixture of experts in place of the dense FFN ("never", "optional": where the metadata has an
    # expert_count (llama: Mixtral), "always"): the router's softmax over all experts, the top
    # expert_used_count of them, their weights renormalized to sum 1 (moe_norm_weights)
    experts: str = "never"
    moe_norm_weights: bool = True
    # glm4moe, deepseek2: whether the chosen experts' weights are renormalized, and a factor they are then
    # multiplied by, are the file's (expert_weights_norm, absent: not; expert_weights_scale, absent
    # or 0: 1), as llama.cpp reads them for it; else moe_norm_weights and no factor
    moe_weights_from_file: bool = False
    # "softmax": the router's softmax over all experts, then the top ones; "softmax_weight" (gpt-oss):
    # the top logits, then a softmax over those alone; "sigmoid" (lfm2moe): each logit's sigmoid,
    # the top ones (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*); "sigmoid_logits" (llama4): the top
    # logits, each weighted by its sigmoid. A layer's exp_probs_b (a selection bias, extra_biases) is
    # added to the probabilities for the choice alone.
    moe_gating: str = "softmax"
    # llama4: each chosen expert's input is the token times the expert's weight, and the experts'
    # outputs are added unweighted (llama.cpp's build_moe_ffn's weight_before_ffn)
    moe_weight_before: bool = False
    # a shared expert beside the routed ones: a gated FFN of every token (ffn_{gate,up,down}_shexp)
    # whose output is added to the experts' weighted sum (llama.cpp's build_layer_ffn of these
    # architectures). "": none; "sigmoid" (qwen35moe, qwen3next): in every layer of experts, of
    # width expert_shared_feed_forward_length (else feed_forward_length), its output times
    # sigmoid(ffn_gate_inp_shexp · h); "plain" (granitehybrid): added as it is, in the layers of
    # experts of a file whose expert_shared_feed_forward_length is > 0; "counted" (glm4moe, deepseek2): added as
    # it is, in every layer of experts, expert_shared_count experts of expert_feed_forward_length
    # as one FFN of their summed width (llama.cpp's n_ff_exp * n_expert_shared); "dense" (gemma4): the
    # layer's own dense FFN (ffn_gate, ffn_up, ffn_down of feed_forward_length) beside the experts in
    # every layer of experts, each on its own norms (the architecture's layer recipe adds them)
    shared_expert: str = ""
    # a gated delta net's value heads grouped by key head (value head h reads key head h // (Hv / Hk):
    # qwen3next) rather than tiled (h % Hk: qwen35, whose converter reorders the V heads for it)
    ssm_v_heads_grouped: bool = False
    # gpt-oss: a learned logit per head that joins each softmax of the attention (llama.cpp's attn_sinks)
    attn_sinks: bool = False
    # Qwen3.5: attn_q gives each head's Q and an output gate interleaved (2 head_dim per head); the
    # attention's output is multiplied by sigmoid(gate) before attn_output
    attn_output_gate: bool = False
    # Gemma 4: V RMS-normed per head (no weight) before the cache; a layer without attn_v takes K's
    # product as V; the global layers alone take rope_freqs (proportional RoPE), the sliding-window
    # ones none; each layer's output times its layer_output_scale where the file has one
    v_norm: bool = False
    v_from_k: bool = False
    rope_freqs_global_only: bool = False
    out_scale: bool = False
    # biases this architecture has beyond Q/K/V's, by tensor name suffix (any other bias is refused)
    extra_biases: tuple[str, ...] = ()
    optional_biases: tuple[str, ...] = ()  # those of extra_biases a file may lack (deepseek2's exp_probs_b)
    ffn_norm_tensor: str = "ffn_norm"  # the pre-FFN norm's tensor (gpt-oss: post_attention_norm)
    output_norm_tensor: str = "output_norm"  # the final norm's tensor (lfm2: token_embd_norm); "": none (bert)
    # the BERT family (bert.py): LayerNorms with biases (ggml_norm) after each residual add
    # (attn_output_norm, layer_output_norm) and of the embeddings (token_embd_norm), token type 0's
    # row (token_types) added to every token, Q/K/V, attn_output and the FFN's products with biases
    # where the file has them, and no output norm
    bert_norms: bool = False
    pos_embd: bool = False  # absolute position embeddings added to the token's (bert: position_embd)
    ffn_gated: bool = True  # act(gate) * up; False: act(up) alone (bert's GELU FFN)
    # ALiBi instead of positions (jina-bert-v2): each head's scores plus -slope_h * |p_q - p_k|, the
    # slopes llama.cpp's for a maximum bias of 8 (ggml_soft_max_ext's max_bias); no RoPE
    alibi: bool = False
    # hybrid models: (raw get, n_layer) -> the ModelConfig fields of the layers that are recurrent
    # (layer_recurrent, shortconv_l_cache, n_head_kv); None: every layer is attention. raw get reads
    # "<arch>.<key>" as it is, per-layer arrays included.
    recurrent: Callable[..., dict[str, Any]] | None = None
    recurrent_kind: str = ""  # what its recurrent layers are, in words (the README's table)
    attention_kind: str = ""  # what its attention is where its layer= recipe is not GQA, in words (likewise)
    # (raw get) -> None, a ValueError for metadata llama.cpp runs and infer does not (glm4moe: another
    # gating, grouped expert choice); raw get reads "<arch>.<key>" as it is, arrays included
    check_metadata: Callable[..., None] | None = None
    # the layers' own plan: (raw get, n_layer, n_expert, n_ff_exp) -> ModelConfig fields that replace
    # what the generic keys give (layer_nope: smollm3's and llama4's every 4th layer without RoPE;
    # llama4: chunked sliding_window / layer_swa, n_moe_layer_step, n_ff_shexp, kq_l2_norm, the
    # attention temperature); None: none
    layer_plan: Callable[..., dict[str, Any]] | None = None
    layer_plan_kind: str = ""  # what its layer plan does, in words (the README's table)
    # the attention temperature (ModelConfig.attn_temp_scale) on the layers without RoPE alone
    # (llama4.cpp); else on every layer (mistral3.cpp)
    attn_temp_nope_only: bool = False
    # (raw get, n_layer) -> ModelConfig fields of attention shapes that differ by layer (Gemma 4:
    # n_head_kv and n_head_kv_swa from a per-layer head_count_kv, head_dim_swa, n_rot_swa,
    # n_layer_kv); None: one shape for every layer
    layer_shapes: Callable[..., dict[str, Any]] | None = None
    # (tensors by GGUF name, ModelConfig) -> the tensors in the layout models/weights.py reads, where
    # files in an older layout store some otherwise (deepseek2's unsplit attn_kv_b); a ValueError for
    # such a tensor it cannot rewrite. None: as the file has them
    upgrade_tensors: Callable[..., Any] | None = None
    # hyperparameters of its own: get, n_embd, n_head, head_dim, n_layer -> ModelConfig fields
    # (embed_scale, residual_scale, logit_scale, attn_scale)
    scalars: Callable[..., dict[str, float]] = no_scalars
    hf_permute_qk: bool = False  # HF stores Q/K rows for rotate-half RoPE; GGUF (llama.cpp) interleaves them
    hf_norm_shift: bool = False  # HF stores RMSNorm weights as w - 1 (gemma); GGUF as w
    hf_norm_shift_except: tuple[str, ...] = ()  # norms (name suffixes) stored as w all the same (qwen35's gated norm)
    # (text-model tensor name, hyperparameters) -> steps applied to that tensor after the usual ones
    # (llama.cpp's converter's reorders and transforms: qwen35's V heads, A = -exp(A_log)); None: none
    hf_tensor_steps: Callable[..., list[Any]] | None = None
    # (text-model tensor name, its shape, hyperparameters) -> its GGUF shape where a step reshapes it
    # (granitehybrid's Mamba-2 A and D as (heads, 1), its norm as (groups, width)); None: as stored
    hf_tensor_shape: Callable[..., tuple[int, ...]] | None = None
    # (text-model tensor name, hyperparameters) -> [(the HF name each part converts as, its rows in
    # order (of each expert's matrix in a 3-D tensor of experts))] where llama.cpp's converter splits
    # one tensor by rows or renames it by the config (granitehybrid's input_linear: gate, then up;
    # qwen3next's in_proj_qkvz, whose rows it also regroups); None or []: whole
    hf_tensor_parts: Callable[..., list[tuple[str, Any]] | None] | None = None
    # fused experts stored transposed: gate_up_proj (experts, embd, 2 ff), down_proj (experts, ff, embd) (llama4)
    hf_experts_transposed: bool = False
    hf_tied_default: bool = False  # tie_word_embeddings when config.json does not say
    # (kind, added token's text) of special tokens llama.cpp's converter names by their text where
    # the tokenizer's settings give none (glm4moe: bos [gMASK], eot <|user|>, ...)
    hf_special_tokens: tuple[tuple[str, str], ...] = ()
    hf_spm: bool = False  # llama.cpp's converter prefers tokenizer.model (SentencePiece) when present
    # tokenizer.json -> the GGUF's tokenizer keys (folder, Kvs) -> token count; None: spm_vocab / bpe_vocab
    hf_vocab: Callable[[Any, Any], int] | None = None
    hf_space_prefix: bool = True  # a SentencePiece vocabulary's add_space_prefix as its model says (gemma: off)
    # HF names (suffixes) of depthwise convolution kernels stored (n_embd, 1, L): llama.cpp's converter
    # squeezes them to (n_embd, L) and writes them float32 (its ggml_ssm_conv takes F32) (lfm2)
    hf_conv_kernels: tuple[str, ...] = ()
    hf_trim_embeddings: bool = False  # drop embedding rows past the tokenizer's vocabulary (gemma3's padding)
    # config.json -> the text model's hyperparameters (multimodal checkpoints nest them); None: config itself
    hf_text_hparams: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # a checkpoint tensor name -> the text model's, or None for tensors not converted; None: as it is
    hf_text_name: Callable[[str], str | None] | None = None
    # the GGUF keys llama.cpp's converter writes: (Kvs, config.json hyperparameters, path) -> the
    # float32 tensors it makes from the config, by GGUF name; None: models/arch/hf_keys.py's generic_kvs
    hf_kvs: Callable[..., Any] | None = None
    # extra config.json keys of an MLX export: (ModelConfig, has Q/K/V biases) -> dict
    hf_config: Callable[[Any, bool], dict[str, Any]] | None = None
    hf_bfloat16: bool = False  # trained in bfloat16, overflows float16: exported in bfloat16
    chat_template: str = ""  # built-in template family for files without one ("chatml", "gemma", "llama")
    # False: an encoder, whose tokens attend over their whole sequence (llama.cpp's hparams.causal_attn
    # false: gemma-embedding, BERT); its sliding windows are symmetric (LLAMA_SWA_TYPE_SYMMETRIC), and
    # it embeds and does not generate (ModelConfig.causal)
    causal: bool = True
    # the layer recipe (decoder.py): (ops, layer, il, x, h, nxt) -> (x, h)
    layer: Callable[..., Any] = field(default=dense_layer, compare=False)

    @property
    def export_type(self) -> str:
        return self.hf_export_type or (self.hf_model_types[0] if self.hf_model_types else self.name)

    def forward(self, ops: Any, layers: list[Any], output_norm: Any) -> Any:
        """The model over one batch on a backend's primitives (decoder.py): its logits."""
        return forward(ops, self, layers, output_norm)
