"""A one-layer llama GGUF whose weights are all zeros of one quant type: something to run every
kernel a type needs through, so that numba compiles them ahead (`infer kernels --warm`).

All-zero blocks are valid in every GGML type (a zero scale), so no quantizer is needed; the
shapes are multiples of 256 so that every K-quant block fits.  Its vocabulary is the 256 byte
pieces and three control tokens, enough for the tokenizer to load.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from infer.quant.types import F16, F32, qtype

D, F, H, HKV, HEAD_DIM = 256, 256, 4, 2, 64
_CONTROLS = ("<unk>", "<s>", "</s>")


def write_zero_model(path: Path, type_id: int) -> Path:
    """Write the model at path (every matrix of GGML type type_id, norms F32) and return path."""
    t = qtype(type_id)  # raises UnsupportedQuantType for an id infer does not know
    tokens = list(_CONTROLS) + [f"<0x{b:02X}>" for b in range(256)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"zeros-{t.name.lower()}")
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_block_count(1)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def matrix(name: str, rows: int, cols: int) -> None:
        if type_id in (F32, F16):
            w.add_tensor(name, np.zeros((rows, cols), np.float32 if type_id == F32 else np.float16))
        else:
            raw = np.zeros((rows, cols // t.block_size * t.type_size), np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(type_id))

    V = len(tokens)
    matrix("token_embd.weight", V, D)
    matrix("output.weight", V, D)
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    for name, rows, cols in (("attn_q", H * HEAD_DIM, D), ("attn_k", HKV * HEAD_DIM, D), ("attn_v", HKV * HEAD_DIM, D),
                             ("attn_output", D, H * HEAD_DIM), ("ffn_gate", F, D), ("ffn_up", F, D),
                             ("ffn_down", D, F)):
        matrix(f"blk.0.{name}.weight", rows, cols)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(D, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
