"""Model hyperparameters from GGUF metadata, with the per-architecture flags of one generic decoder."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


class ModelConfigError(ValueError):
    """Metadata that does not describe a model infer can run."""


@dataclass(frozen=True)
class ArchFlags:
    """What distinguishes one architecture from the generic decoder."""

    rope_neox: bool  # rotate (x[i], x[i+d/2]) pairs instead of adjacent (x[2i], x[2i+1])
    qk_norm: bool = False  # RMSNorm over each head of Q and K before RoPE (qwen3, gemma3)
    post_norms: bool = False  # RMSNorm after attention and after the FFN, before the residual add (gemma)
    scale_embeddings: bool = False  # embeddings multiplied by sqrt(n_embd) (gemma)
    activation: str = "silu"  # gate activation of the FFN
    swa_pattern: int = 0  # every swa_pattern-th layer is global, the others sliding-window (gemma3: 6)
    prescale_q: bool = False  # Q is multiplied by the attention scale before Q·K (gemma), not the product after


ARCH_FLAGS: dict[str, ArchFlags] = {
    "llama": ArchFlags(rope_neox=False),
    "qwen2": ArchFlags(rope_neox=True),
    "qwen3": ArchFlags(rope_neox=True, qk_norm=True),
    "gemma3": ArchFlags(rope_neox=True, qk_norm=True, post_norms=True, scale_embeddings=True,
                        activation="gelu", swa_pattern=6, prescale_q=True),
}


@dataclass(frozen=True)
class KVGroup:
    """Layers whose KV cache is paged together: same attention window, so same blocks needed."""

    window: int  # 0: full causal attention; else the sliding window
    layers: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    flags: ArchFlags
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
    rope_base_swa: float
    sliding_window: int  # 0: none
    layer_swa: tuple[bool, ...]  # per layer: sliding-window attention
    attn_scale: float
    final_logit_softcap: float  # 0: none
    attn_logit_softcap: float  # 0: none
    name: str = ""

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.n_embd) if self.flags.scale_embeddings else 1.0

    @property
    def kv_groups(self) -> tuple[KVGroup, ...]:
        """The global layers, then the sliding-window layers (if any): each group has its own blocks,
        so the sliding-window layers can drop the blocks that fall out of their window."""
        full = tuple(i for i, swa in enumerate(self.layer_swa) if not swa)
        local = tuple(i for i, swa in enumerate(self.layer_swa) if swa)
        groups = [KVGroup(0, full)] if full else []
        if local:
            groups.append(KVGroup(self.sliding_window, local))
        return tuple(groups)

    @property
    def kv_layer_index(self) -> dict[int, tuple[int, int]]:
        """layer -> (its KV group, its index within the group): where a pool keeps its K/V."""
        return {il: (gi, j) for gi, g in enumerate(self.kv_groups) for j, il in enumerate(g.layers)}

    def kv_block_bytes(self, block_size: int, k_bytes: float = 2, v_bytes: float | None = None) -> tuple[int, ...]:
        """Bytes one block of each KV group takes: K and V of all its layers, k_bytes per element of K and
        v_bytes (by default k_bytes) per element of V; a quantized cache type takes a fraction of a byte
        more than its bits (q8_0: 34/32, its f16 scale per 32)."""
        v_bytes = k_bytes if v_bytes is None else v_bytes
        per_token = round(self.n_head_kv * (k_bytes * self.head_dim + v_bytes * self.head_dim_v))
        return tuple(len(g.layers) * block_size * per_token for g in self.kv_groups)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], n_vocab: int | None = None) -> "ModelConfig":
        arch = str(meta.get("general.architecture", ""))
        if arch not in ARCH_FLAGS:
            raise ModelConfigError(
                f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        flags = ARCH_FLAGS[arch]

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

        n_embd = int(get("embedding_length", required=True))
        n_head = int(get("attention.head_count", required=True))
        n_head_kv = int(get("attention.head_count_kv", n_head))
        n_layer = int(get("block_count", required=True))
        head_dim = int(get("attention.key_length", n_embd // n_head))
        head_dim_v = int(get("attention.value_length", head_dim))
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelConfigError(f"head counts {n_head}/{n_head_kv} are not a valid grouped-query layout")
        n_rot = int(get("rope.dimension_count", head_dim))
        scaling = str(get("rope.scaling.type", "none"))
        factor = float(get("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise ModelConfigError(f"RoPE scaling {scaling!r} is not supported")
        rope_scale = 1.0 / factor if factor > 0 else 1.0

        sliding_window = 0
        layer_swa = (False,) * n_layer
        if flags.swa_pattern:
            sliding_window = int(get("attention.sliding_window", 0))
            if sliding_window > 0:
                # llama.cpp's pattern: the last layer of each group of swa_pattern is global.
                layer_swa = tuple((il + 1) % flags.swa_pattern != 0 for il in range(n_layer))

        if n_vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            n_vocab = int(get("vocab_size", len(tokens) if tokens is not None else 0))
        return cls(
            arch=arch,
            flags=flags,
            n_vocab=int(n_vocab),
            n_ctx_train=int(get("context_length", 2048)),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            head_dim_v=head_dim_v,
            n_ff=int(get("feed_forward_length", required=True)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            n_rot=n_rot,
            rope_base=float(get("rope.freq_base", 10000.0)),
            rope_scale=rope_scale,
            rope_base_swa=float(get("rope.freq_base_swa", 10000.0)),
            sliding_window=sliding_window,
            layer_swa=layer_swa,
            attn_scale=1.0 / math.sqrt(head_dim),
            final_logit_softcap=float(get("final_logit_softcapping", 0.0) or 0.0),
            attn_logit_softcap=float(get("attn_logit_softcapping", 0.0) or 0.0),
            name=str(meta.get("general.name", "")),
        )
