"""The registry: the only list of the architectures infer runs. Everything about one architecture
lives in its module (llama.py, ...); consumers look it up here by its GGUF name or, for Hugging
Face folders, by config.json's model_type.

Adding an architecture, step by step:

1. The module: copy qwen3.py (a dense decoder in a dozen lines) to `<name>.py` and set its
   ARCHITECTURE: `name` is the GGUF general.architecture (llama.cpp's LLM_ARCH name), then the
   fields of spec.py's Architecture that differ from the llama layer (`rope_neox`, `qk_norm`,
   `pre_norms` / `post_norms`, `activation`, `swa_pattern`, `experts`, `extra_biases`, ...). Say in
   the module docstring what the architecture is, in llama.cpp's terms.
2. Register it: import the module here and add it to `_MODULES`. Nothing else lists architectures;
   the tests that run every architecture pick it up from `names()`.
3. Config from GGUF metadata: models/config.py's ModelConfig.from_metadata reads the keys every
   architecture has (`<arch>.embedding_length`, `.attention.head_count`, `.rope.freq_base`, ...).
   Hyperparameters of its own go in a `scalars(get, n_embd, n_head, head_dim, n_layer)` function
   of the module (granite.py's multipliers, gemma3.py's scales), returning ModelConfig fields; a
   new field goes on ModelConfig, with its bound in models/limits.py if it sizes a buffer. Which
   layers differ from the others (no RoPE, chunked attention, experts every n-th layer) is the
   module's `layer_plan(raw get, n_layer, n_expert, n_ff_exp)` (smollm3.py: every 4th layer without
   RoPE; llama4.py), returning ModelConfig fields (layer_nope, chunked, ...) that both backends
   honour (ModelConfig.layer_rope, layer_experts, layer_attn_temp).
4. The HF converter mapping: `hf_model_types` (config.json model_type values) and `hf_class`;
   tensor names go through gguf's TensorNameMap (models/convert_hf.py's TensorNamer), so only
   layouts need saying (`hf_permute_qk`, `hf_norm_shift`, `hf_text_name` for multimodal
   checkpoints); the GGUF keys llama.cpp's convert_hf_to_gguf.py writes come from hf_keys.py's
   `generic_kvs`, or the module's `hf_kvs` where it writes more (phi3.py, granite.py); `hf_config`
   is what an MLX export adds to config.json (models/mlx_export.py).
5. The layer: the shared recipe, decoder.py's `dense_layer` (attention, then a gated FFN or a
   mixture of experts, with the optional norms), covers every architecture so far through the
   spec's fields. A mechanism it does not cover (hybrid recurrent layers, MLA attention) gets its
   own recipe through the spec's `layer=` hook: a function `(ops, layer, il, x, h, nxt) -> (x, h)`
   in the module, written like dense_layer over the backends' primitives (decoder.py's docstring
   lists them; nxt is the norm that follows). A step no primitive expresses becomes a new
   primitive on both backends (backends/cpu/primitives.py, backends/mlx/primitives.py), named for
   llama.cpp's tensor so traces compare. Per-layer state other than the paged KV cache (a
   recurrent layer's) lives in the runner's state pool (Runner.new_state_pool, a slot per
   running sequence that the engine assigns, and slots for the snapshots that serve the prefix
   cache and speculation: engine/state_slots.py; a new kind of state is copied with the rest by
   StatePoolLike.copy); the spec's `recurrent`
   reads which layers are recurrent (lfm2.py: its short convolutions and shortconv primitive).
   models/weights.py collects the layer's tensors (a new kind of tensor goes there; a new mechanism's
   own tensors in models/mixer_weights.py, the BERT family's in models/encoder_weights.py); a bias
   weights.py has no place for is refused unless the spec's `extra_biases` names it.
6. The tests, most of them parametrized over `names()` already, so step 2 enrols the module; add
   a tiny random GGUF of it to the tests' `tiny_models.py` helper (ARCH_TYPES: a mix of storage
   types no other architecture's test covers; `write_tiny_model` writes its tensors and keys):
   - tests/test_models.py (fixture `tiny` over every architecture): logits against llama.cpp's,
     quantized KV caches, KV decode against a full recompute, prefill in chunks against one pass;
   - tests/test_llamacpp_agreement.py (ARCHS): each op against llama.cpp's from its inputs, and
     greedy decoding agreeing as well as llama.cpp's flash attention does;
   - tests/test_backend_mlx.py (ARCHS, fixture `tiny`): mlx logits against the exact reference
     and the cpu backend; its EXACT_BOUND needs an entry for the new name;
   - tests/test_engine.py: batched against alone (`test_batched_equals_alone_*`): add the
     architecture to a parametrization there when its layer treats a batch differently (sliding
     windows, experts, recurrent state);
   - tests/test_convert_hf.py (BPE_ARCHS, with a tiny HF folder from the `hf_models.py` helper's
     `make_hf_model` and its numpy `hf_forward`): the converted GGUF as llama.cpp converts it;
     tests/test_quantize_file.py (ARCH_DTYPE) and tests/test_mlx_format.py (the `tiny` fixture's
     list) for quantizing and the MLX format.
"""
from __future__ import annotations

from types import MappingProxyType

from infer.quant.errors import InferError

from ..hf_files import ConvertError
from . import (
    bert,
    deepseek2,
    gemma2,
    gemma3,
    gemma4,
    gemma_embedding,
    glm4moe,
    gpt_oss,
    granite,
    granitehybrid,
    jina_bert_v2,
    lfm2,
    lfm2moe,
    llama,
    llama4,
    mistral3,
    modern_bert,
    nomic_bert,
    nomic_bert_moe,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    qwen3next,
    qwen35,
    qwen35moe,
    smollm3,
)
from .spec import Architecture

__all__ = ["Architecture", "UnknownArchitecture", "architecture", "names", "causal_names", "for_hf_model_type",
           "hf_model_types"]

_MODULES = (llama, qwen2, qwen3, gemma3, gemma2, olmo2, granite, phi3, qwen3moe, gpt_oss, lfm2, qwen35, lfm2moe,
            granitehybrid, qwen35moe, qwen3next, smollm3, mistral3, glm4moe, deepseek2, llama4, gemma4,
            gemma_embedding, bert, nomic_bert, nomic_bert_moe, jina_bert_v2, modern_bert)
_BY_NAME = MappingProxyType({m.ARCHITECTURE.name: m.ARCHITECTURE for m in _MODULES})


class UnknownArchitecture(InferError, ValueError):
    """An architecture (GGUF general.architecture) infer does not run."""


def names() -> tuple[str, ...]:
    """The supported architectures' GGUF names."""
    return tuple(_BY_NAME)


def causal_names() -> tuple[str, ...]:
    """Those of them that generate (Architecture.causal): the others are encoders, which embed only."""
    return tuple(n for n, a in _BY_NAME.items() if a.causal)


def architecture(name: str) -> Architecture:
    """The architecture of that GGUF name; UnknownArchitecture (one line naming the supported ones) if none."""
    arch = _BY_NAME.get(name)
    if arch is None:
        raise UnknownArchitecture(f"unsupported architecture {name!r} (supported: {', '.join(names())})")
    return arch


def hf_model_types() -> tuple[str, ...]:
    """The config.json model_type values the HF converter takes."""
    return tuple(t for a in _BY_NAME.values() for t in a.hf_model_types)


def for_hf_model_type(model_type: object, where: object) -> Architecture:
    """The architecture a Hugging Face config.json's model_type converts to; ConvertError if none."""
    for a in _BY_NAME.values():
        if model_type in a.hf_model_types:
            return a
    classes = ", ".join(a.hf_class for a in _BY_NAME.values() if a.hf_model_types and a.hf_class)
    raise ConvertError(f"{where}: unsupported model_type {model_type!r} "
                       f"(supported: {', '.join(hf_model_types())}; architectures {classes})")
