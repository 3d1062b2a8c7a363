"""Model hyperparameters from GGUF metadata; what is particular to an architecture comes from its module (models/arch)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import Architecture, UnknownArchitecture, architecture
from .config_keys import (
    POOLING_TYPES,
    ModelConfigError,
    check_sizes,
    check_widths,
    pooling_cls,
    read_rope_scale,
    shared_count,
    swa_layers,
    yarn_attn_factor,
)
from .limits import MAX_LAYERS


@dataclass(frozen=True)
class KVGroup:
    """Layers whose KV cache is paged together: same attention window, so same blocks needed."""

    window: int  # 0: full attention; else the sliding window (a non-causal model's symmetric: ModelConfig.causal)
    layers: tuple[int, ...]
    # the window is a chunk instead (llama4): a query sees the keys of its own chunk of `window`
    # positions only. Those keys lie within the last `window` positions, so the blocks out of a
    # sliding window of that size are out of every chunk too and are dropped alike.
    chunked: bool = False


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    architecture: Architecture
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # of Q and K
    head_dim_v: int
    n_ff: int
    norm_eps: float
    n_rot: int  # leading dims of each head that RoPE rotates
    rope_base: float
    rope_scale: float  # position multiplier (1/linear scaling factor)
    rope_attn_factor: float  # multiplies RoPE's cos and sin (LongRoPE's magnitude correction, YaRN's; else 1)
    n_ctx_orig: int  # the context RoPE was trained at before scaling: LongRoPE's long factors beyond it
    rope_base_swa: float  # of the sliding-window layers
    rope_scale_swa: float
    sliding_window: int  # 0: none
    layer_swa: tuple[bool, ...]  # per layer: sliding-window attention
    attn_scale: float  # multiplies Q·K (or Q before it: architecture.prescale_q)
    final_logit_softcap: float  # 0: none
    attn_logit_softcap: float  # 0: none
    name: str = ""
    n_expert: int = 0  # mixture of experts: experts per layer (0: a dense FFN)
    n_expert_used: int = 0  # experts each token runs
    n_ff_exp: int = 0  # each expert's FFN width
    n_layer_dense_lead: int = 0  # the first layers of a mixture of experts keep a dense FFN (LFM2-MoE's first 2)
    n_ff_shexp: int = 0  # the shared expert's FFN width (Architecture.shared_expert); 0: none
    # the chosen experts' weights: renormalized to sum 1, then times moe_weights_scale
    # (Architecture.moe_norm_weights, or the file's where moe_weights_from_file)
    moe_norm_weights: bool = True
    moe_weights_scale: float = 1.0
    embed_scale: float = 1.0  # multiplies the token embeddings (gemma: sqrt(n_embd); granite)
    residual_scale: float = 1.0  # multiplies each block's output before the residual add (granite)
    logit_scale: float = 1.0  # multiplies the logits (granite: 1 / its logit_scale)
    rope_ext_factor: float = 0.0  # YaRN scaling: 1 (its ramp between scaled and unscaled angles); else 0
    yarn_beta_fast: float = 32.0  # YaRN's ramp runs from the pair turning this often over n_ctx_orig...
    yarn_beta_slow: float = 1.0  # ... to the one turning this often (llama.cpp's defaults)
    yarn_log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier (mistral3), in rope_attn_factor; 0: none
    n_token_types: int = 0  # rows of token_types (bert: tokenizer.ggml.token_type_count); 0: none
    # the FFN's gate activation where the file chooses it (modern-bert's hidden_activation); "": the architecture's
    activation: str = ""
    pooling: str = ""  # how an embedding pools the tokens, from <arch>.pooling_type: "mean", "cls", "last", "rank"; "": not said
    # rank pooling's row (<arch>.classifier.pooling_type, llama.cpp's pooling_type_cls): "mean" for
    # a ModernBERT classifier that pools the mean; "": the CLS row (the last row where causal)
    pooling_cls: str = ""
    # False: an encoder (an embedding model): each token attends over every token of its sequence,
    # the later ones too, and a sliding window is symmetric (|q - p| <= window // 2); the whole
    # prompt is computed in one step, no prefix is cached, nothing is generated. From the
    # architecture (Architecture.causal) and, as llama.cpp reads it, <arch>.attention.causal
    causal: bool = True
    # hybrid models (Architecture.recurrent): per layer, whether it is recurrent (a per-sequence
    # state instead of a KV cache: LFM2's short convolution); () where no layer is
    layer_recurrent: tuple[bool, ...] = ()
    shortconv_l_cache: int = 0  # LFM2: the short convolution's width L; its state keeps the last L - 1 inputs
    # Qwen3.5's gated delta net (llama.cpp's ssm.* keys): the causal convolution's width over the
    # Q|K|V projection, the size S of each head (keys and values alike), the key heads (group
    # count) and the value heads (time-step rank); ssm_inner_size = value heads * S
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0
    ssm_group_count: int = 0
    ssm_dt_rank: int = 0
    ssm_inner_size: int = 0
    # granitehybrid's Mamba-2 mixers read the same ssm.* keys otherwise: ssm_dt_rank heads H of
    # ssm_inner_size / H, ssm_group_count groups G of B and C, ssm_state_size N each
    mamba2: bool = False
    rope: bool = True  # False: attention without positions (granitehybrid's NoPE: rope.scaling.finetuned false)
    # per layer: True where the layer's attention has no RoPE (Architecture.layer_plan: smollm3's and
    # llama4's every 4th); () where all have it
    layer_nope: tuple[bool, ...] = ()
    chunked: bool = False  # the sliding-window layers attend within chunks of sliding_window positions (llama4)
    n_moe_layer_step: int = 0  # experts in every n-th layer only (llama4's interleave_moe_layer_step); 0: all
    kq_l2_norm: bool = False  # Q and K of each head RMS-normalized, no weight, after RoPE on the layers with RoPE (llama4)
    # Llama 4's attention temperature (llama.cpp's f_attn_temp_scale, n_attn_temp_floor_scale, a
    # whole number, and f_attn_temp_offset): Q (after RoPE where the layer has it) times
    # attn_temperature(position) on the layers layer_attn_temp says (llama4: those without RoPE;
    # mistral3: all); scale 0: none
    attn_temp_scale: float = 0.0
    attn_temp_floor_scale: float = 0.0
    attn_temp_offset: float = 0.0

    # the router's gating (Architecture.moe_gating, unless the file says: deepseek2's expert_gating_func)
    moe_gating: str = "softmax"
    # multi-head latent attention (deepseek2, models/arch/deepseek2.py): the ranks of the KV and
    # (0: none, a plain attn_q) Q compressions, and the heads' sizes before absorption (Q and K:
    # nope then RoPE part; V). Its cache keeps per token one row of head_dim = n_lora_kv + n_rot
    # (the normalized latent, then the RoPE'd key part) and no V: V is the row's leading
    # head_dim_v = n_lora_kv columns (kv_v_in_k)
    n_lora_kv: int = 0
    n_lora_q: int = 0
    head_dim_k_mla: int = 0
    head_dim_v_mla: int = 0

    def layer_rope(self, il: int) -> bool:
        """Whether layer il's attention rotates Q and K by their positions."""
        return self.rope and not (self.layer_nope and self.layer_nope[il])

    @property
    def kv_v_in_k(self) -> bool:
        """The cache keeps no V of its own: V is the leading head_dim_v columns of each K row (MLA)."""
        return self.n_lora_kv > 0
    # Gemma 4 (Architecture.layer_shapes): the sliding-window layers' own attention shape, KV heads,
    # head size (K and V alike) and rotated dims (0: as the global layers'); the layers from
    # n_layer_kv on have no K/V of their own but read the last earlier layer's of their kind (0: all own)
    n_head_kv_swa: int = 0
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_layer_kv: int = 0
    # Gemma 4 E2B/E4B: the width of each layer's own token embedding (per_layer_token_embd); 0: none
    n_embd_per_layer: int = 0
    # per layer: its FFN's width where a per-layer feed_forward_length gives them (Gemma 4 E2B's
    # double-wide FFNs in the shared-KV layers; n_ff is then the widest); () where one n_ff is all
    n_ff_layers: tuple[int, ...] = ()

    @property
    def ffn_activation(self) -> str:
        """The FFN's gate activation (Architecture.activation's names): the file's, else the architecture's."""
        return self.activation or self.architecture.activation

    def layer_n_ff(self, il: int) -> int:
        """Layer il's dense FFN width."""
        return self.n_ff_layers[il] if self.n_ff_layers else self.n_ff

    def attn_shape(self, il: int) -> tuple[int, int, int, int]:
        """Layer il's (KV heads, K head size, V head size, rotated dims): a sliding-window layer's
        may differ from a global one's (Gemma 4)."""
        if not self.layer_swa[il]:
            return self.n_head_kv, self.head_dim, self.head_dim_v, self.n_rot
        return (self.n_head_kv_swa or self.n_head_kv, self.head_dim_swa or self.head_dim,
                self.head_dim_swa or self.head_dim_v, self.n_rot_swa or self.n_rot)

    def kv_source(self, il: int) -> int:
        """The layer whose K/V layer il attends over: itself, or for a layer from n_layer_kv on the
        last layer before n_layer_kv of its kind (llama.cpp's layer_reuse_cb of Gemma 3n / 4:
        n_layer_kv - 2 for a sliding-window layer, n_layer_kv - 1 for a global one)."""
        if not self.n_layer_kv or il < self.n_layer_kv:
            return il
        return self.n_layer_kv - (2 if self.layer_swa[il] else 1)

    def layer_experts(self, il: int) -> bool:
        """Whether layer il's FFN is the mixture of experts (else the dense FFN)."""
        step = self.n_moe_layer_step
        return self.n_expert > 0 and il >= self.n_layer_dense_lead and (step <= 0 or (il + 1) % step == 0)

    def alibi_slopes(self) -> np.ndarray:
        """(n_head,) float32: ALiBi's slope of each head (Architecture.alibi: jina-bert-v2), as
        ggml_soft_max_ext forms them for llama.cpp's max_bias of 8 (float32 powf); (0,) without ALiBi."""
        if not self.architecture.alibi:
            return np.zeros(0, np.float32)
        f32, max_bias = np.float32, np.float32(8.0)
        n_log2 = 1 << int(np.floor(np.log2(self.n_head)))
        m0 = f32(2.0) ** (-max_bias / f32(n_log2))
        m1 = f32(2.0) ** (-(max_bias / f32(2.0)) / f32(n_log2))
        return np.array([m0 ** f32(h + 1) if h < n_log2 else m1 ** f32(2 * (h - n_log2) + 1)
                         for h in range(self.n_head)], np.float32)

    def layer_attn_temp(self, il: int) -> bool:
        """Whether layer il's Q is multiplied by the attention temperature (attn_temperature)."""
        return self.attn_temp_scale != 0.0 and not (self.architecture.attn_temp_nope_only and self.layer_rope(il))

    def attn_temperature(self, positions: np.ndarray) -> np.ndarray:
        """(T,) float32: what Q is multiplied by at each position on the layers layer_attn_temp says,
        as llama.cpp's llm_graph_input_attn_temp computes it: the floor in float32, the log in
        double, the result float32."""
        pos = np.asarray(positions, np.float32)
        f = np.floor((pos + np.float32(self.attn_temp_offset)) / np.float32(self.attn_temp_floor_scale)) + 1.0
        return (np.log(f.astype(np.float64)) * np.float32(self.attn_temp_scale) + 1.0).astype(np.float32)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """The layers with a recurrent state (and no K/V), ascending."""
        return tuple(il for il, r in enumerate(self.layer_recurrent) if r)

    @property
    def ssm_conv_channels(self) -> int:
        """The convolved channels: Q and K (key heads * S each), then V (the gated delta net); x,
        then B and C (groups * N each) (Mamba-2)."""
        return 2 * self.ssm_group_count * self.ssm_state_size + self.ssm_inner_size

    @property
    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One recurrent layer's state for one sequence, by kind: "conv", a causal convolution's
        last width - 1 inputs, oldest first (LFM2: B * x, n_embd wide; Qwen3.5: Q|K|V; Mamba-2: x|B|C); "delta",
        Qwen3.5's delta-rule matrix per value head, (value heads, S, S) with [h, j, i] the value
        component j of key component i (ggml's transposed layout); "ssm", Mamba-2's scan state per
        head, (heads, head size, N). {} without recurrent layers."""
        if not self.recurrent_layers:
            return {}
        if self.mamba2:
            H = self.ssm_dt_rank
            return {"conv": (self.ssm_conv_kernel - 1, self.ssm_conv_channels),
                    "ssm": (H, self.ssm_inner_size // H, self.ssm_state_size)}
        if self.ssm_state_size:
            S = self.ssm_state_size
            return {"conv": (self.ssm_conv_kernel - 1, self.ssm_conv_channels), "delta": (self.ssm_dt_rank, S, S)}
        return {"conv": (self.shortconv_l_cache - 1, self.n_embd)}

    def state_bytes(self) -> int:
        """Bytes one sequence's recurrent state takes, all its layers (float32)."""
        per_layer = sum(math.prod(shape) for shape in self.state_shapes.values())
        return 4 * len(self.recurrent_layers) * per_layer

    @property
    def kv_groups(self) -> tuple[KVGroup, ...]:
        """The global layers, then the sliding-window layers (if any): each group has its own blocks,
        so the sliding-window layers can drop the blocks that fall out of their window. Recurrent
        layers keep no K/V and are in no group."""
        kv = [i for i in range(self.n_layer) if not (self.layer_recurrent and self.layer_recurrent[i])
              and self.kv_source(i) == i]
        full = tuple(i for i in kv if not self.layer_swa[i])
        local = tuple(i for i in kv if self.layer_swa[i])
        groups = [KVGroup(0, full)] if full else []
        if local:
            groups.append(KVGroup(self.sliding_window, local, self.chunked))
        return tuple(groups)

    @property
    def kv_layer_index(self) -> dict[int, tuple[int, int]]:
        """layer -> (its KV group, its index within the group): where a pool keeps its K/V (a layer
        that reuses another's K/V: where that one's are)."""
        own = {il: (gi, j) for gi, g in enumerate(self.kv_groups) for j, il in enumerate(g.layers)}
        return {**own, **{il: own[self.kv_source(il)] for il in range(self.n_layer) if self.kv_source(il) in own}}

    def kv_group_shape(self, g: int) -> tuple[int, int, int]:
        """The rows KV group g keeps per token: (KV heads, K row size, V row size), those of its
        layers (one kind: Gemma 4's sliding-window layers differ from its global ones). V's is 0
        where the cache keeps no V (kv_v_in_k: MLA reads V from the K rows). The pools' arrays and
        kv_block_bytes are both sized from this."""
        hkv, dk, dv, _ = self.attn_shape(self.kv_groups[g].layers[0])
        return hkv, dk, 0 if self.kv_v_in_k else dv

    def kv_block_bytes(self, block_size: int, k_bytes: float = 2, v_bytes: float | None = None) -> tuple[int, ...]:
        """Bytes one block of each KV group takes: K and V of all its layers, k_bytes per element of K and
        v_bytes (by default k_bytes) per element of V; a quantized cache type takes a fraction of a byte
        more than its bits (q8_0: 34/32, its f16 scale per 32)."""
        v_bytes = k_bytes if v_bytes is None else v_bytes
        out = []
        for gi, g in enumerate(self.kv_groups):
            hkv, dk, dv = self.kv_group_shape(gi)
            out.append(len(g.layers) * block_size * round(hkv * (k_bytes * dk + v_bytes * dv)))
        return tuple(out)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], n_vocab: int | None = None) -> "ModelConfig":
        arch = str(meta.get("general.architecture", ""))
        try:
            spec = architecture(arch)
        except UnknownArchitecture as e:
            raise ModelConfigError(str(e)) from None

        def get(key: str, default: Any = None, required: bool = False) -> Any:
            full = f"{arch}.{key}"
            if full not in meta:
                if required:
                    raise ModelConfigError(f"missing metadata key {full!r}")
                return default
            value = meta[full]
            if hasattr(value, "__len__") and not isinstance(value, str):
                raise ModelConfigError(f"per-layer values for {full!r} are not supported")
            return value

        def raw(key: str, default: Any = None) -> Any:  # "<arch>.<key>" as it is, per-layer arrays included
            return meta.get(f"{arch}.{key}", default)

        n_embd = int(get("embedding_length", required=True))
        n_head = int(get("attention.head_count", required=True))
        n_layer = int(get("block_count", required=True))
        if n_layer <= 0 or n_head <= 0 or n_embd <= 0:
            raise ModelConfigError(f"{arch}: block_count, embedding_length and head_count must be positive")
        if not 1 <= n_layer <= MAX_LAYERS:  # before a per-layer array is read against it
            raise ModelConfigError(f"{arch}: block_count {n_layer} is out of range (1..{MAX_LAYERS})")
        # Multi-token-prediction layers are the last nextn_predict_layers blocks: llama.cpp's model
        # (hparams.n_layer()) is the blocks before them, which is all infer runs; their tensors stay unread.
        n_nextn = int(get("nextn_predict_layers", 0) or 0)
        if not 0 <= n_nextn < n_layer:
            raise ModelConfigError(f"{arch}: nextn_predict_layers {n_nextn} is out of range (0..{n_layer - 1}, "
                                   f"below block_count)")
        n_layer -= n_nextn
        # a hybrid model's recurrent layers (its module reads which they are, per-layer arrays included)
        try:
            hybrid = spec.recurrent(raw, n_layer) if spec.recurrent is not None else {}
            hybrid.update(spec.layer_shapes(raw, n_layer) if spec.layer_shapes is not None else {})
        except ValueError as e:
            raise ModelConfigError(f"{arch}: {e}") from None
        n_head_kv = int(hybrid.pop("n_head_kv", None) or get("attention.head_count_kv", n_head))
        head_dim = int(get("attention.key_length", n_embd // n_head))
        head_dim_v = int(get("attention.value_length", head_dim))
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelConfigError(f"head counts {n_head}/{n_head_kv} are not a valid grouped-query layout")
        n_rot = int(get("rope.dimension_count", head_dim))
        rope_scale = read_rope_scale(get)
        yarn = str(get("rope.scaling.type", "linear")) == "yarn"
        attn_factor = float(get("rope.scaling.attn_factor", 1.0))
        rope_base = float(get("rope.freq_base", 10000.0))
        n_ctx_train = int(get("context_length", 2048))
        check_sizes(arch, n_layer, head_dim, head_dim_v, n_rot, n_ctx_train)
        sliding_window = int(get("attention.sliding_window", spec.default_sliding_window)) if spec.swa_pattern else 0
        layer_swa = (swa_layers(meta.get(f"{arch}.attention.sliding_window_pattern"), spec.swa_pattern, n_layer)
                     if sliding_window > 0 else (False,) * n_layer)

        if n_vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            n_vocab = int(get("vocab_size", len(tokens) if tokens is not None else 0))
        # a model of experts only has no dense FFN to size (Qwen3.5 MoE's files have no feed_forward_length)
        n_ff = int(hybrid.pop("n_ff", 0) or get("feed_forward_length", 0, required=spec.experts != "always"))
        n_expert = int(get("expert_count", 0)) if spec.experts != "never" else 0
        n_expert_used = int(get("expert_used_count", 0)) if n_expert else 0
        if (n_expert or spec.experts == "always") and not 0 < n_expert_used <= n_expert:
            raise ModelConfigError(f"{arch} needs 0 < expert_used_count <= expert_count, got {n_expert_used} of {n_expert}")
        # each expert's width, else llama.cpp's default: n_ff (llama, granitehybrid), n_ff / n_expert_used
        # (qwen3moe); the shared expert's (Architecture.shared_expert): a sigmoid-gated one's, else n_ff;
        # a plain one only where the key is > 0 in a file with experts (granitehybrid's n_ff_shexp)
        n_ff_exp = int(get("expert_feed_forward_length", 0)) or (
            n_ff // max(n_expert_used, 1) if spec.experts == "always" else n_ff) if n_expert else 0
        shexp_key = int(get("expert_shared_feed_forward_length", 0))
        n_ff_shexp = (shexp_key or n_ff if spec.shared_expert == "sigmoid" else
                      shexp_key if spec.shared_expert == "plain" and n_expert else
                      shared_count(arch, get) * n_ff_exp if spec.shared_expert == "counted" else 0)
        check_widths(arch, n_embd, n_ff, n_ff_exp, n_ff_shexp)
        if n_expert and not n_ff_exp or spec.shared_expert == "sigmoid" and not n_ff_shexp:
            raise ModelConfigError(f"{arch}: no expert width (expert_feed_forward_length, "
                                   f"expert_shared_feed_forward_length or feed_forward_length)")
        dense_lead = int(get("leading_dense_block_count", 0)) if n_expert else 0
        if not 0 <= dense_lead <= n_layer:
            raise ModelConfigError(f"{arch}: leading_dense_block_count {dense_lead} is out of range (0..{n_layer})")
        # the layers' own plan (smollm3, llama4: which have RoPE; llama4: chunked attention, interleaved experts),
        # replacing what the generic keys above said
        try:
            plan = spec.layer_plan(raw, n_layer, n_expert, n_ff_exp) if spec.layer_plan is not None else {}
        except ValueError as e:
            raise ModelConfigError(f"{arch}: {e}") from None
        sliding_window = int(plan.pop("sliding_window", sliding_window))
        layer_swa = tuple(plan.pop("layer_swa", layer_swa))
        n_ff_shexp = int(plan.pop("n_ff_shexp", n_ff_shexp))
        if len(plan.get("layer_nope", ())) not in (0, n_layer):
            raise ModelConfigError(f"{arch}: {len(plan['layer_nope'])} no-RoPE flags for {n_layer} layers")
        final_cap, attn_cap = spec.default_softcaps
        try:  # values of an architecture's keys that infer does not run, refused by its module
            if spec.check_metadata is not None:
                spec.check_metadata(lambda key, default=None: meta.get(f"{arch}.{key}", default), n_rot)
        except (ValueError, TypeError) as e:  # TypeError: a value of the wrong kind (an array for a number)
            raise ModelConfigError(f"{arch}: {e}") from None
        try:
            own = spec.scalars(get, n_embd, n_head, head_dim, n_layer)
        except ValueError as e:
            raise ModelConfigError(f"{arch}: {e}") from None
        temp = {**plan, **own}  # the attention temperature, from the plan (llama4) or the file's keys (mistral3)
        if temp.get("attn_temp_scale", 0.0) and not temp.get("attn_temp_floor_scale", 0.0) > 0:
            raise ModelConfigError(f"{arch}: attention temperature scaling needs a positive floor scale "
                                   f"(mistral3: rope.scaling.original_context_length)")
        norm_weights, weights_scale = spec.moe_norm_weights, 1.0
        if spec.moe_weights_from_file:  # llama.cpp's defaults: not renormalized, a scale of 0 is none
            norm_weights = bool(get("expert_weights_norm", False))
            weights_scale = float(get("expert_weights_scale", 0.0) or 1.0)
            if not (math.isfinite(weights_scale) and weights_scale > 0):
                raise ModelConfigError(f"{arch}: expert_weights_scale {weights_scale} must be a positive number")
        # the architecture's own values override the defaults below (attn_scale, n_ff_shexp, ...)
        fields = dict(
            arch=arch,
            architecture=spec,
            n_vocab=int(n_vocab),
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            head_dim_v=head_dim_v,
            n_ff=n_ff,
            # the BERT family's LayerNorms (and modern-bert's) read their own key, with llama.cpp's BERT default
            norm_eps=float(get("attention.layer_norm_epsilon", 1e-12) if spec.bert_norms or spec.layer_norms
                           else get("attention.layer_norm_rms_epsilon", 1e-5)),
            n_rot=n_rot,
            rope_base=rope_base,
            rope_attn_factor=yarn_attn_factor(rope_scale, attn_factor, own.get("yarn_log_mul", 0.0)) if yarn else attn_factor,
            rope_ext_factor=1.0 if yarn else 0.0,
            n_ctx_orig=int(get("rope.scaling.original_context_length", n_ctx_train)),
            rope_scale=rope_scale,
            rope_base_swa=float(get("rope.freq_base_swa", rope_base if spec.swa_rope_base is None else spec.swa_rope_base)),
            rope_scale_swa=rope_scale if spec.swa_rope_scaled else 1.0,
            sliding_window=sliding_window,
            layer_swa=layer_swa,
            attn_scale=1.0 / math.sqrt(head_dim),
            final_logit_softcap=float(get("final_logit_softcapping", final_cap) or 0.0),
            attn_logit_softcap=float(get("attn_logit_softcapping", attn_cap) or 0.0),
            name=str(meta.get("general.name", "")),
            n_expert=n_expert,
            n_expert_used=n_expert_used,
            n_ff_exp=n_ff_exp,
            n_layer_dense_lead=dense_lead,
            n_ff_shexp=n_ff_shexp,
            moe_norm_weights=norm_weights,
            moe_weights_scale=weights_scale,
            pooling=POOLING_TYPES.get(int(get("pooling_type", -1)), ""),
            causal=spec.causal and bool(get("attention.causal", True)),
            pooling_cls=pooling_cls(int(get("classifier.pooling_type", -1)), spec),
            n_token_types=int(meta.get("tokenizer.ggml.token_type_count", 0) or 0),
            # absolute position embeddings (bert) or ALiBi (jina-bert-v2) instead
            **({"rope": False} if spec.pos_embd or spec.alibi else {}),
            moe_gating=spec.moe_gating,
            **hybrid,
            **plan,
        )
        fields.update(own)
        return cls(**fields)
