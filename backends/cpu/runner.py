"""A model on the CPU: its weights prepared for the kernels, its buffers, and the Runner protocol.

The forward pass is the architecture's layer recipe (models/arch/decoder.py, reached through the
config: backends do not import models) over this backend's primitives (primitives.py); this module
knows nothing of files, tokenizers or architectures. All per-step buffers live in a Workspace
(workspace.py) sized once, so a decode step allocates nothing but small views.

The Q/K/V products are one matrix when the three weights can be stacked (repack.py), the gate/up
products likewise.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numba
import numpy as np

from infer.backends.base import BackendError
from infer.backends.batch import Batch
from infer.quant import types as qt
from infer.quant.tensor import QTensor, StackedRows

from .hugepages import HugeArena, huge_empty
from .kv_pool import KVPool, SequenceKV, check_head_size, kind_layers, rotation
from .matmul import WidenedF16
from .memlock import mlock_arrays
from .primitives import CpuPrimitives
from .repack import PackedExperts, PackedWeight, pack_stacked, packed_shapes, stackable
from .rows import RowReader
from .state_pool import StatePool
from .target import ISA
from .workspace import Workspace

DEFAULT_CHUNK = 512  # most tokens one forward call takes; longer prompts are fed in chunks
_NONE = np.zeros(0, np.float32)  # an absent bias or norm weight
_NONE2 = np.zeros((0, 0), np.float32)  # absent per-expert biases


def _packed(ws, alloc=huge_empty):
    """pack_stacked(ws), the sources' pages of the mapped file released as they are packed (one
    copy of the weights in memory), or None."""
    return pack_stacked(ws, release=True, alloc=alloc)


def _in_memory(w: QTensor) -> QTensor:
    """A QTensor read on every step, copied out of the file mapping (--no-mmap)."""
    copy = QTensor(w.type_id, w.shape, np.array(w.raw))
    w.release()
    return copy


def _parts(w) -> tuple:
    """The QTensors whose rows make up a weight: a StackedRows' parts, else the weight itself."""
    return w.parts if isinstance(w, StackedRows) else (w,)


def _pack(w, mmap: bool, alloc=huge_empty):
    """The repacked form of a QTensor (or StackedRows), or for types kept as they are the QTensor
    itself (a copy in memory unless mmap; a StackedRows' rows copied whole, its file pages released)."""
    packed = _packed(_parts(w), alloc)
    if packed is not None:
        return packed
    if isinstance(w, StackedRows):
        whole = w.whole()
        w.release()
        return whole
    return w if mmap else _in_memory(w)


def _ple_model_proj(w, mmap: bool):
    """Gemma 4's per_layer_model_proj: llama.cpp's quantizer keeps it F16, and every step reads it
    whole, so an F16 one is widened to f32 (matmul.WidenedF16); any other type as _pack has it."""
    if isinstance(w, QTensor) and w.type_id == qt.F16:
        wide = WidenedF16.of(w.raw, w.shape)
        w.release()
        return wide
    return _pack(w, mmap)


def _products(ws, mmap: bool, alloc=huge_empty) -> list[tuple[object, int]]:
    """(weight, first output column) pairs computing the weights' products side by side: one
    stacked packed matrix if possible, else each weight (packed, or kept as it is) on its own."""
    stacked = _packed([p for w in ws for p in _parts(w)], alloc)
    if stacked is not None:
        return [(stacked, 0)]
    out, col = [], 0
    for w in ws:
        out.append((_pack(w, mmap, alloc), col))
        col += sum(p.raw.shape[0] for p in _parts(w))
    return out


def _packed_span(ws) -> int:
    """Bytes _products(ws) packs into a HugeArena."""
    if stackable(ws):
        return sum(HugeArena.span(*sd) for sd in packed_shapes(ws))
    return sum(_packed_span((w,)) for w in ws if len(ws) > 1)


def _heads(heads, mmap: bool) -> tuple[list, PackedExperts | None]:
    """MLA's per-head matrices (attn_k_b's, attn_v_b's): packed alike into one arena where their
    type repacks (each head's weight a view of it), else each kept as _pack keeps it."""
    groups = [_parts(w) for w in heads]
    shapes = PackedExperts.shapes(groups) if groups else None
    if shapes is not None:
        arena = HugeArena(sum(HugeArena.span(*sd) for sd in shapes))
        packed = PackedExperts.pack(groups, arena.take, release=True)
        if packed is not None:
            return list(packed.weights), packed
    return [_pack(w, mmap) for w in heads], None


def _experts(experts, mmap: bool) -> tuple[list, tuple | None]:
    """Per expert (gate_up products, down products), and where every expert packs alike the two
    products as PackedExperts (run by one compiled loop, moe.experts_ffn), else None.  All of a
    layer's packed experts share one arena: an expert's matrices alone are too small for huge
    pages, and a decode step reads ~8 of them per token per layer at scattered places."""
    ups = [tuple(w for w in (g, u) if w is not None) for g, u, _ in experts]  # up alone: act(up) (bert's)
    downs = [(d,) for _, _, d in experts]
    shapes = [PackedExperts.shapes(ups), PackedExperts.shapes(downs)]
    if None not in shapes:
        arena = HugeArena(sum(HugeArena.span(*sd) for sh in shapes for sd in sh))
        gu = PackedExperts.pack(ups, arena.take, release=True)
        dn = PackedExperts.pack(downs, arena.take, release=True) if gu is not None else None
        if dn is not None:
            return [([(g, 0)], [(d, 0)]) for g, d in zip(gu.weights, dn.weights)], (gu, dn)
        # an expert the layout cannot hold (MXFP4 scales beyond f16's range, which pack_stacked
        # warned about): the experts one by one, each packed where it can be, in allocations of
        # their own (how much an arena would need is known only once the packing has been tried)
        return [(_products(u, mmap), _products(d, mmap)) for u, d in zip(ups, downs)], None
    arena = HugeArena(sum(_packed_span(ws) for ws in ups + downs))
    return [(_products(u, mmap, arena.take), _products(d, mmap, arena.take)) for u, d in zip(ups, downs)], None


def _arrays(w) -> list[np.ndarray]:
    """The arrays a prepared weight (packed or a QTensor) keeps."""
    return [w.lo, w.hi, w.s, w.m, w.sc] if isinstance(w, PackedWeight) else [w.raw]


def _vec(a) -> np.ndarray:
    """A norm weight or bias as float32, copied out of the file mapping (a few KB)."""
    return _NONE if a is None else np.array(a, np.float32)


@dataclass
class _Layer:
    """One layer's weights as the forward pass uses them, prepared once."""

    # products: (weight, first output column) pairs side by side (_products)
    qkv: list  # into its kind's Workspace.kinds[...]["qkv"]
    wo: list
    gate_up: list  # into Workspace.gu
    down: list
    attn_norm: np.ndarray  # (0,) when absent
    ffn_norm: np.ndarray
    post_attn_norm: np.ndarray
    post_ffn_norm: np.ndarray
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    v_norm: np.ndarray  # (hdv,) ones where V is RMS-normed per head (Gemma 4), else (0,)
    out_scale: np.ndarray  # (1,): the layer's output times it (Gemma 4's layer_output_scale), else (0,)
    # Gemma 4's per-layer embedding: inp_gate's and proj's products ([] when absent), post_norm (D,)
    ple_gate: list
    ple_proj: list
    ple_norm: np.ndarray
    router: list  # a mixture of experts: the router's product, and per expert (gate_up, down)
    # Gemma 4's layers of experts (models/weights.py; (0,) when absent): the router input's scale
    # (D,), each expert's output scale (E,), the experts' input norm and the two branches' post norms (D,)
    router_scale: np.ndarray
    expert_scale: np.ndarray
    pre_ffn_norm_2: np.ndarray
    post_ffn_norm_1: np.ndarray
    post_ffn_norm_2: np.ndarray
    experts: list
    grouped: tuple | None  # (gate_up, down) PackedExperts when every expert packs alike, else None
    # the shared expert (models/weights.py; [] when absent): its gate|up products, its down
    # product, its gate's (1, D) row
    shexp: list
    shexp_down: list
    shexp_gate: list
    # gpt-oss (models/weights.py): (0,) / (0, 0) when absent
    bo: np.ndarray  # (D,) the attention output's bias
    sinks: np.ndarray  # (n_head,) attention sink logits
    router_bias: np.ndarray  # (E,)
    exp_probs_b: np.ndarray  # (E,) the experts' selection bias (LFM2-MoE), (0,) when absent
    gu_bias: np.ndarray  # (E, 2F): each expert's gate and up biases side by side, as its gate_up product
    down_bias: np.ndarray  # (E, D)
    # a short-convolution layer (LFM2; models/weights.py): in_proj and out_proj products ([] when
    # absent), the depthwise kernel transposed to (L, D) (oldest input first), (0, 0) when absent
    shortconv_in: list
    shortconv_out: list
    shortconv: np.ndarray
    # a gated delta net layer (Qwen3.5; delta_net.py): its input products Q|K|V, z, beta, alpha side
    # by side, ssm_out ([] when absent); the convolution's kernel transposed to (L, C), oldest input
    # first ((0, 0) when absent); dt bias, A (Hv,), the output norm (S,) ((0,) when absent)
    ssm_in: list
    ssm_out: list
    ssm_conv: np.ndarray
    ssm_dt: np.ndarray
    ssm_a: np.ndarray
    ssm_norm: np.ndarray
    # a Mamba-2 mixer (granitehybrid; mamba.py): ssm_in above is its one in-projection z|xBC|dt,
    # ssm_norm the grouped norm's weight (I,); the convolution's bias (C,), D per head (H,)
    ssm_conv_b: np.ndarray
    ssm_d: np.ndarray
    # multi-head latent attention (deepseek2; mla.py): the products attn_q_a ([] without Q
    # compression), attn_q (or attn_q_b), attn_kv_a_mqa; per head attn_k_b's and attn_v_b's; the
    # norms of the compressed Q (n_lora_q,) and of the latent (n_lora_kv,), (0,) when absent
    q_a: list
    q: list
    kv_a: list
    k_b: list
    v_b: list
    # the same heads packed alike (PackedExperts: one parallel loop runs them all, mla.heads_matmul),
    # or None where their type is kept as it is (then the heads are run one by one)
    k_b_heads: PackedExperts | None
    v_b_heads: PackedExperts | None
    q_a_norm: np.ndarray
    kv_a_norm: np.ndarray
    # the BERT family (models/weights.py; (0,) when absent): the LayerNorms after the residual adds,
    # weight and bias (D,); the FFN's biases, up's (F,) (its product is act(up): gate_up holds up
    # alone) and down's (D,)
    attn_out_norm: np.ndarray
    attn_out_norm_b: np.ndarray
    layer_out_norm: np.ndarray
    layer_out_norm_b: np.ndarray
    up_b: np.ndarray
    down_b: np.ndarray
    attn_norm_2: np.ndarray  # jina-embeddings-v2-base-code's second norm after the attention, and its bias
    attn_norm_2_b: np.ndarray
    # jina-bert-v2's LayerNorms of Q and K, weight and bias, and the Q|K|V biases added before them
    q_layer_norm: np.ndarray
    q_layer_norm_b: np.ndarray
    k_layer_norm: np.ndarray
    k_layer_norm_b: np.ndarray
    qkv_b: np.ndarray

    @classmethod
    def prepare(cls, lw, mmap: bool) -> "_Layer":
        dense = lw.w_up is not None
        experts, grouped = _experts(lw.experts, mmap) if lw.experts else ([], None)
        mla = lw.kv_a is not None
        k_b, k_b_heads = _heads(lw.k_b, mmap)
        v_b, v_b_heads = _heads(lw.v_b, mmap)
        return cls(
            # a gated attention's gate after V (qkv_post reads Q|K|V off the front)
            # a layer that reads an earlier layer's K/V has Q alone (Gemma 4's shared-KV layers); MLA's
            # layers have their own products (q_a, q, kv_a)
            qkv=_products(tuple(w for w in (lw.wq, lw.wk, lw.wv) if w is not None)
                          + ((lw.attn_gate,) if lw.attn_gate is not None else ()), mmap)
            if lw.wq is not None and not mla else [],
            wo=[(_pack(lw.wo, mmap), 0)] if lw.wo is not None else [],
            gate_up=_products(tuple(w for w in (lw.w_gate, lw.w_up) if w is not None), mmap) if dense else [],
            down=[(_pack(lw.w_down, mmap), 0)] if dense else [],
            router=[(_pack(lw.router, mmap), 0)] if lw.router is not None else [],
            router_scale=_vec(lw.router_scale), expert_scale=_vec(lw.expert_scale),
            pre_ffn_norm_2=_vec(lw.pre_ffn_norm_2), post_ffn_norm_1=_vec(lw.post_ffn_norm_1),
            post_ffn_norm_2=_vec(lw.post_ffn_norm_2),
            experts=experts, grouped=grouped,
            shexp=_products(lw.shexp[:2], mmap) if lw.shexp else [],
            shexp_down=[(_pack(lw.shexp[2], mmap), 0)] if lw.shexp else [],
            shexp_gate=[(_pack(lw.shexp_gate, mmap), 0)] if lw.shexp_gate is not None else [],
            attn_norm=_vec(lw.attn_norm), ffn_norm=_vec(lw.ffn_norm),
            post_attn_norm=_vec(lw.post_attn_norm), post_ffn_norm=_vec(lw.post_ffn_norm),
            bq=_vec(lw.bq), bk=_vec(lw.bk), bv=_vec(lw.bv), q_norm=_vec(lw.q_norm), k_norm=_vec(lw.k_norm),
            v_norm=_vec(lw.v_norm), out_scale=_vec(lw.out_scale),
            ple_gate=[(_pack(lw.ple_gate, mmap), 0)] if lw.ple_gate is not None else [],
            ple_proj=[(_pack(lw.ple_proj, mmap), 0)] if lw.ple_proj is not None else [],
            ple_norm=_vec(lw.ple_norm),
            bo=_vec(lw.bo), sinks=_vec(lw.sinks), router_bias=_vec(lw.router_bias), exp_probs_b=_vec(lw.exp_probs_b),
            gu_bias=np.ascontiguousarray(np.concatenate(lw.expert_biases[:2], axis=1)) if lw.expert_biases else _NONE2,
            down_bias=np.ascontiguousarray(lw.expert_biases[2]) if lw.expert_biases else _NONE2,
            shortconv_in=[(_pack(lw.shortconv_in, mmap), 0)] if lw.shortconv_in is not None else [],
            shortconv_out=[(_pack(lw.shortconv_out, mmap), 0)] if lw.shortconv_out is not None else [],
            shortconv=np.ascontiguousarray(lw.shortconv.T, np.float32) if lw.shortconv is not None else _NONE2,
            ssm_in=_products((lw.ssm_qkv, lw.ssm_z, lw.ssm_beta, lw.ssm_alpha), mmap) if lw.ssm_qkv is not None
            else [(_pack(lw.ssm_in, mmap), 0)] if lw.ssm_in is not None else [],
            ssm_out=[(_pack(lw.ssm_out, mmap), 0)] if lw.ssm_out is not None else [],
            ssm_conv=np.ascontiguousarray(lw.ssm_conv.T, np.float32) if lw.ssm_conv is not None else _NONE2,
            ssm_dt=_vec(lw.ssm_dt), ssm_a=_vec(lw.ssm_a), ssm_norm=_vec(lw.ssm_norm),
            ssm_conv_b=_vec(lw.ssm_conv_b), ssm_d=_vec(lw.ssm_d),
            q_a=[(_pack(lw.q_a, mmap), 0)] if lw.q_a is not None else [],
            q=[(_pack(lw.wq, mmap), 0)] if mla else [],
            kv_a=[(_pack(lw.kv_a, mmap), 0)] if mla else [],
            k_b=k_b, v_b=v_b, k_b_heads=k_b_heads, v_b_heads=v_b_heads,
            q_a_norm=_vec(lw.q_a_norm), kv_a_norm=_vec(lw.kv_a_norm),
            attn_out_norm=_vec(lw.attn_out_norm), attn_out_norm_b=_vec(lw.attn_out_norm_b),
            layer_out_norm=_vec(lw.layer_out_norm), layer_out_norm_b=_vec(lw.layer_out_norm_b),
            up_b=_vec(lw.up_b), down_b=_vec(lw.down_b),
            attn_norm_2=_vec(lw.attn_norm_2), attn_norm_2_b=_vec(lw.attn_norm_2_b),
            q_layer_norm=_vec(lw.q_layer_norm), q_layer_norm_b=_vec(lw.q_layer_norm_b),
            k_layer_norm=_vec(lw.k_layer_norm), k_layer_norm_b=_vec(lw.k_layer_norm_b), qkv_b=_vec(lw.qkv_b),
        )


def _layer_products(ly: "_Layer") -> list:
    """Every (weight, column) product of a layer."""
    out = ly.qkv + ly.wo + ly.gate_up + ly.down + ly.router + ly.shortconv_in + ly.shortconv_out + ly.ssm_in + ly.ssm_out
    out += ly.shexp + ly.shexp_down + ly.shexp_gate + ly.q_a + ly.q + ly.kv_a + ly.ple_gate + ly.ple_proj
    out += [(w, 0) for w in ly.k_b + ly.v_b]
    for gate_up, down in ly.experts:
        out += gate_up + down
    return out


class CpuRunner:
    """Runs a model's weights; `forward` appends tokens to a KV cache and returns logits."""

    backend = "cpu"
    embeddings = True

    def __init__(self, config, weights, n_threads: int | None = None, max_tokens: int = DEFAULT_CHUNK,
                 mmap: bool = True, mlock: bool = False, cache_type_k: str = "f16", cache_type_v: str = "f16"):
        shapes = [config.attn_shape(il) for il in kind_layers(config)]
        self.cache_types = (cache_type_k, cache_type_v)
        if config.kv_v_in_k:
            # MLA: V is K's (its rows' latent), so of K's type, as llama.cpp requires it to be said;
            # its attention over such a cache (build_attn of a K-only input) rotates neither
            if cache_type_k != cache_type_v:
                raise BackendError(f"{config.arch} keeps V inside its K cache (multi-head latent attention): "
                                   f"--cache-type-k {cache_type_k} and --cache-type-v {cache_type_v} must be the same")
            check_head_size(cache_type_k, "--cache-type-k", config.head_dim)
            self.rot_k = self.rot_v = [0]
        else:
            for _, dk, dv, _ in shapes:
                check_head_size(cache_type_k, "--cache-type-k", dk)
                check_head_size(cache_type_v, "--cache-type-v", dv)
            # per kind of attention layer (layer_kind): the rotations of K and V in a quantized cache
            self.rot_k = [rotation(cache_type_k, dk, widest=True) for _, dk, _, _ in shapes]
            self.rot_v = [rotation(cache_type_v, dv, widest=False) for _, _, dv, _ in shapes]
        self.cfg = config
        self.w = weights
        self.n_threads = n_threads or numba.config.NUMBA_NUM_THREADS
        numba.set_num_threads(self.n_threads)
        self.max_tokens = max_tokens
        half = config.n_rot // 2
        self.freq_factors = (
            np.ascontiguousarray(weights.rope_freqs, np.float32) if weights.rope_freqs is not None
            else np.ones(half, np.float32)
        )
        # Weights repacked once for the matrix kernels; this runner owns the copies.  Unless mmap,
        # what it would read from the file mapping on every step is copied into memory as well.
        self.layers = [_Layer.prepare(lw, mmap) for lw in weights.layers]
        # an encoder (non-causal: it embeds, never generates) has no logits: its output matrix (the
        # tied embedding, 250k rows in XLM-R's bge-m3) is not packed, and it returns none
        self.output = _pack(weights.output, mmap) if config.causal else None
        self.token_embd = weights.token_embd if mmap else _in_memory(weights.token_embd)
        self.embd_rows = RowReader(self.token_embd)
        kept = [w for lay in self.layers for w, _ in _layer_products(lay)]
        if self.output is not None:
            kept.append(self.output)
        # The packed tensors' file pages released once more, whole: packing a tensor can map a
        # little of its neighbours in the file (the kernel maps pages around a fault), which were
        # released already if packed before it.
        for p in kept:
            for w in (p.src if isinstance(p, PackedWeight) else ()):
                w.release()
        if mlock:  # as llama.cpp: a refusal is a warning, the model runs unpinned
            try:
                mlock_arrays([a for w in (*kept, self.token_embd) for a in _arrays(w)])
            except OSError as e:
                warnings.warn(str(e.strerror or e), RuntimeWarning, stacklevel=2)
        self.output_norm = _vec(weights.output_norm)
        # Gemma 4's per-layer embeddings (read by rows, as token_embd), their projection, its norm
        self.ple_embd = None if weights.ple_embd is None else weights.ple_embd if mmap else _in_memory(weights.ple_embd)
        self.ple_rows = RowReader(self.ple_embd) if self.ple_embd is not None else None
        self.ple_model_proj = [(_ple_model_proj(weights.ple_model_proj, mmap), 0)] if weights.ple_model_proj is not None else []
        self.ple_proj_norm = _vec(weights.ple_proj_norm)
        # the BERT family's embeddings (models/weights.py): the position embeddings as float32 (a few
        # MB: position_embd is n_ctx_train rows), token type 0's row, their LayerNorm; empty where none
        D = config.n_embd
        self.pos_embd = (weights.pos_embd.dequantize().reshape(-1, D) if weights.pos_embd is not None
                         else np.zeros((0, D), np.float32))
        self.token_type = _vec(weights.token_type)
        self.embd_norm, self.embd_norm_b = _vec(weights.token_embd_norm), _vec(weights.token_embd_norm_b)
        # ALiBi's slope per head (jina-bert-v2; the attention kernel's alibi), (0,) where none
        self.alibi = config.alibi_slopes()
        self._ws: Workspace | None = None
        self.logits = np.zeros((max_tokens, config.n_vocab if config.causal else 0), np.float32)
        # Debugging: trace(name, array) sees each intermediate (T, n) f32 under llama.cpp's tensor
        # names ("attn_norm-0", "kqv_out-0", ..., "result_norm"), so scripts/compare_llamacpp.py can
        # line them up with its eval callback.  The array is a live buffer: copy it to keep it.
        self.trace = None
        self.ops = CpuPrimitives(self)

    def devices(self) -> list[str]:
        return [f"cpu: {self.n_threads} threads, {ISA}"]

    def bytes_per_block(self, block_size: int) -> tuple[int, ...]:
        return KVPool.bytes_per_block(self.cfg, block_size, *self.cache_types)

    def new_kv_pool(self, n_blocks: list[int], block_size: int) -> KVPool:
        return KVPool(self.cfg, n_blocks, block_size, *self.cache_types)

    def state_bytes_per_seq(self) -> int:
        return StatePool.bytes_per_slot(self.cfg)

    def new_state_pool(self, n_slots: int) -> StatePool | None:
        return StatePool(self.cfg, n_slots) if self.cfg.recurrent_layers else None

    def new_kv_cache(self, n_ctx: int) -> SequenceKV:
        """A cache for one sequence of up to n_ctx tokens (for forward), with its recurrent state
        (cache.states, one slot) where the model has recurrent layers."""
        cache = SequenceKV(self.cfg, n_ctx, 16, *self.cache_types)
        cache.states = self.new_state_pool(1)
        return cache

    def warmup(self) -> None:
        """A two-token prompt and one decoded token through every kernel, so that compiling (or
        loading compiled code) happens now: a prompt's rows take some kernels a lone token does not."""
        cache = self.new_kv_cache(8)
        self.forward(np.zeros(2, np.int32), 0, cache)
        self.forward(np.zeros(1, np.int32), 2, cache)

    def _workspace(self, n_ctx: int) -> Workspace:
        if self._ws is None:
            self._ws = Workspace(self.cfg, self.max_tokens, max(n_ctx, 256), self.n_threads,
                                 self.embd_rows.row_bytes, self.ple_rows.row_bytes if self.ple_rows else 0)
        elif self._ws.n_ctx < n_ctx:
            self._ws.grow(self.cfg, max(n_ctx, 2 * self._ws.n_ctx))
        return self._ws

    def forward(self, tokens: np.ndarray, pos0: int, cache: SequenceKV, all_logits: bool = False) -> np.ndarray:
        """Run tokens of one sequence at positions pos0.. through the model, writing their K/V into cache.

        Returns logits (T, V) for every token if all_logits, else (1, V) for the last one;
        the array is a view of an internal buffer, valid until the next call.
        """
        T = len(tokens)
        if T == 0:
            raise ValueError("forward needs at least one token")
        if pos0 + T > cache.n_ctx:
            raise ValueError(f"{pos0 + T} tokens exceed the context of {cache.n_ctx}")
        if (all_logits or not self.cfg.causal) and T > self.max_tokens:  # an encoder's tokens see each other: one pass
            raise ValueError("all_logits and a non-causal model need at most max_tokens tokens per call")
        out = None
        prompt_end = pos0 if T == 1 else pos0 + T  # several tokens are a prompt, fed in chunks or not
        for s in range(0, T, self.max_tokens):
            part = tokens[s:s + self.max_tokens]
            batch = Batch.single(part, pos0 + s, cache.tables, cache.pool.block_size, all_logits, prompt_end)
            out = self.forward_batch(batch, cache.pool, cache.states)
        return out

    def forward_batch(self, batch: Batch, pool: KVPool, states: StatePool | None = None) -> np.ndarray:
        """One forward pass over tokens of any number of sequences (at most max_tokens tokens).

        Writes each token's K/V to its slot in pool and returns the logits of batch.logit_rows,
        (R, V): a view of an internal buffer, valid until the next call.  Every row is computed
        exactly as it would be alone, so batching never changes a sequence's results.
        """
        T = len(batch.tokens)
        if not 0 < T <= self.max_tokens:
            raise ValueError(f"a forward pass takes 1 to {self.max_tokens} tokens, got {T}")
        if self.cfg.recurrent_layers and (states is None or batch.state_slots is None):
            raise ValueError("a model with recurrent layers needs a state pool and the batch's state slots")
        ws = self._workspace(int(batch.positions.max()) + 1)
        self.ops.begin(batch, pool, ws, states)
        return self.cfg.architecture.forward(self.ops, self.layers, self.output_norm)
