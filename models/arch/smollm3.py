"""Hugging Face SmolLM3: the llama layer, except that every 4th layer's attention has no RoPE (Q and
K as projected). llama.cpp's smollm3.cpp fixes that step at 4 (n_no_rope_layer_step) and reads no
key for it; its converter (SmolLM3Model, a LlamaModel) writes none, so the HF converter refuses a
config.json whose no_rope_layers say otherwise rather than write a file that would run another model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..hf_files import ConvertError, Kvs
from .hf_keys import generic_kvs
from .spec import Architecture

NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3


def nope_layers(n_layer: int) -> tuple[bool, ...]:
    """Every NO_ROPE_STEP-th layer (the last of each group) attends without positions."""
    return tuple((il + 1) % NO_ROPE_STEP == 0 for il in range(n_layer))


def layer_plan(get, n_layer: int, n_expert: int, n_ff_exp: int) -> dict[str, Any]:
    """The layers without RoPE (llama.cpp reads no key for them)."""
    return {"layer_nope": nope_layers(n_layer)}


def hf_kvs(kv: Kvs, hp: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    """llama's keys; the RoPE layers are llama.cpp's fixed pattern, so a config.json with others is refused
    (its no_rope_layers: 1 where a layer has RoPE, 0 where not)."""
    extra = generic_kvs(kv, hp, path, llama=True)
    flags = hp.get("no_rope_layers")
    if flags is not None:
        n_layer = int(hp["num_hidden_layers"])
        expect = [int(not nope) for nope in nope_layers(n_layer)]
        if flags != expect:
            raise ConvertError(f"{path}: no_rope_layers must be llama.cpp's pattern (every {NO_ROPE_STEP}th layer "
                               f"without RoPE) for {n_layer} layers")
    return extra


ARCHITECTURE = Architecture(
    name="smollm3",
    rope_neox=False,
    hf_model_types=("smollm3",),
    hf_class="SmolLM3ForCausalLM",
    layer_plan=layer_plan,
    layer_plan_kind=f"no RoPE on every {NO_ROPE_STEP}th layer",
    hf_permute_qk=True,
    hf_spm=True,
    hf_kvs=hf_kvs,
    hf_config=lambda cfg, has_qkv_bias: {"attention_bias": has_qkv_bias, "mlp_bias": False,
                                         "no_rope_layer_interval": NO_ROPE_STEP,
                                         "no_rope_layers": [int(not n) for n in cfg.layer_nope]},
    chat_template="chatml",
)
