"""GGML tensor types and their arithmetic: dequantizing, quantizing byte for byte as llama.cpp does,
and the root of infer's user-facing errors. This part imports no other
part of infer; the others build on it.

Modules, by what they are for:

- `types.py`: GGML type ids, block sizes and bytes per block.
- `tensor.py`: a tensor kept in its storage type, dequantized on demand.
- `dequant.py`, `kquants.py`: numba dequantization of every block type (F32, F16, BF16,
  Q4_0..Q8_0, Q2_K..Q6_K, MXFP4), bit-identical to `gguf.quants.dequantize`; kquants.py holds the
  K-quant super-blocks and their scale unpacking.
- `halves.py`: the float32 <-> f16 / bf16 conversions (numba, round to nearest even) every part uses.
- `lanes.py`: numba helpers that keep dequantization loops in narrow vector lanes (narrow shifts,
  int -> float32 through int32, unaligned uint32 loads, opaque trip counts).
- `quantizers.py`, `kquantize.py`: numba quantizers byte-identical to llama.cpp's
  `ggml_quantize_chunk` (all block types but Q2_K and Q3_K), with and without an importance matrix.
- `recipe.py`: which type each tensor of a file gets for a file type such as Q4_K_M (llama.cpp's
  `llama_tensor_get_type` rules).
- `affine.py`: MLX's affine format (codes, scales and biases of `mx.quantize`, bit for bit, in numpy).
- `numba_cache.py`: numba's kernel cache made safe for processes compiling at once (a file lock
  around each save; installed as this package loads).
- `errors.py`: InferError, the root of every error infer reports to its user as one line (here,
  in the lowest layer, so that every layer can derive its errors from it).

Notes.

`infer quantize` writes the file llama.cpp's `llama-quantize` writes, byte for byte: the same type
for every tensor (llama.cpp's Q4_K_M / Q5_K_M mixing: `output.weight` and some `attn_v` /
`ffn_down` layers in Q6_K, rows that don't fit 256-element blocks falling back to Q5_0 / Q5_1 /
Q8_0, or F16; MXFP4_MOE, for mixtures of experts: the experts' 3-D tensors in MXFP4, every other
tensor, output and embeddings included, in Q8_0), the same block bytes (numba quantizers
reproducing llama.cpp's float32 arithmetic, with and without an importance matrix), the same
metadata (`general.file_type` and `general.quantization_version` last, and `quantize.imatrix.*`
with an importance matrix) and the same tensor order. tests/test_quantize_file.py checks this
against `llama_cpp.llama_model_quantize` for llama, qwen2, qwen3, gemma3, phi3 (fused Q/K/V and
gate/up), olmo2 and qwen3moe models. Mixtures of experts go through the same rules as every
model, which (as llama.cpp's) look at the expert count in places: with 8 experts `attn_v` and
`attn_k` take Q8_0 and `attn_output` Q5_K under Q4_K_S/M; an expert `ffn_down` takes its layer
from its name; MXFP4_MOE is the one file type that treats the 3-D expert tensors apart.
Tensors are read, converted and written a chunk at a time, so memory stays bounded.

MLX export (`--format mlx`): every linear and embedding matrix whose rows split into groups is
quantized with MLX's affine algorithm (affine.py); scales, biases, norms and other vectors are
bfloat16 for Gemma or bfloat16 inputs, else float16 (mlx-lm keeps the model's dtype; Gemma
overflows float16). The defaults (4 bits, group size 64) are mlx-lm's, so the folders match
mlx-community's `-4bit` / `-8bit` repos; group size 32 costs half a bit more per weight (scale and
bias are 32 bits per group) for somewhat lower error. Re-quantizing an already-quantized model
compounds errors: prefer 8 bits, or an F16/BF16 source, for 4-bit output (scripts/BENCHMARKS.md,
"MLX export").

MXFP4 (gpt-oss's experts, llama.cpp's MXFP4_MOE files): 4-bit e2m1 codes and an E8M0 scale byte
per 32 weights; the exponent is checked at every power of two and the floats just below it
(tests/test_quantize.py).
"""

from .numba_cache import lock_cache_writes

lock_cache_writes()  # before any kernel here or above compiles (numba_cache.py says why)
