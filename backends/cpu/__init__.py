"""The cpu backend: infer's numba kernels, computing what llama.cpp's CPU backend computes.

Modules, by what they are for:

- The runner: `runner.py` (CpuRunner: weights prepared for the kernels, the Runner protocol of
  backends/base.py), `workspace.py` (the buffers a forward pass writes, sized once),
  `primitives.py` (the decoder's primitives, the layer recipe being models/arch/decoder.py; a
  mixture of experts' in `expert_primitives.py`), `kv_pool.py` (the paged KV cache's arrays),
  `hugepages.py` (transparent huge pages for the packed weights), `memlock.py` (`--mlock`),
  `rows.py` (token embeddings read with pread).
- Products: `repack.py` (weights repacked at load into row tiles), `qdot.py` (products with the
  packed weights, integer block dots), `activations.py` (activations rounded as llama.cpp rounds
  them before each product), `matmul.py` (products with every weight type, the float types
  included), `target.py` (what the CPU offers: VNNI, AVX2, or the portable kernel), `moe.py`
  (mixtures of experts).
- The rest of a layer: `elementwise.py` (f16 rounding, RMS norms, RoPE angles, embedding rows,
  residual adds, softcap, the Hadamard transform), `kv_write.py` (biases, Q/K
  norms, RoPE and the cache write), `attention.py` (grouped-query attention over the paged cache),
  `glu.py` (the FFN's gated activations), `vexp.py` (ggml's vector exp).
- Compiling: `compiling.py` (numba's compiles watched for the status line, and a first load's
  kernels found by a dry run and compiled ahead in worker processes).

Numerics. To agree with llama.cpp, infer computes what llama.cpp's CPU backend computes, rounding
where it rounds: activations are quantized to Q8_0/Q8_1/Q8_K (or f16/bf16) before each product with
a quantized weight (Q4_1/Q5_1 take Q8_1's f16 block sums for their mins), K and V are kept at f16
precision, Q and the softmax weights are rounded to f16 for the attention products, whose scores are
summed in llama.cpp's own order (its f16 `vec_dot` for a generated token, tinyBLAS for a prompt's),
GELU goes through ggml's f16 table, SiLU and the softmax take ggml's vector exp (`ggml_v_expf`, as
its AVX-512 build computes it; vexp.py), RMSNorm uses ggml's arithmetic (a double sum of float32
squares), and where llama.cpp's compiler fuses a multiply-add (RoPE, the GELU table) so does infer.
No kernel is compiled with fastmath where that could change a result (tests/test_numba_flags.py).
Fed llama.cpp's own inputs, every op but the products is bit-identical to llama.cpp's, and the
products differ in their last bits only (the order of their float sums inside the quantized
matmuls, about as large as the difference between llama.cpp's own flash-attention and default
paths).

A q8_0 KV cache (`--cache-type-k/-v q8_0`) is computed as llama.cpp computes it: heads whose size is
a multiple of 64 are rotated by an orthonormal Walsh-Hadamard matrix before they are quantized (Q
and K by the widest power of two dividing the head size, V in chunks of 64, the attention output
rotated back), so an outlier no longer sets a whole block's scale; K and V are quantized with
llama.cpp's q8_0 quantizer; for a q8_0 K, Q is quantized to q8_0 and each block's dot is an exact
integer sum times both scales; a q8_0 V is summed with float32 softmax weights, as llama.cpp's
flash-attention path (the only one it runs a quantized V through) does. On the tiny test models the
logits agree with llama.cpp run with the same cache types within the bound the f16 cache meets
(q8_0 K and V on the tiny qwen2 and gemma3: to ~1e-6, bit-for-bit but for summation order).

Where the two part: `python scripts/compare_llamacpp.py [--prompt TEXT] [-n 8] [--flash-attn]`
compares them tensor by tensor under llama.cpp's names (its eval callback on one side,
`CpuRunner.trace` on the other). Because every product re-rounds its input to 8 bits, its
last-bit differences move some quants by a step and grow layer by layer: on the embedded Gemma the
logits end ~1 apart on a scale of ~22, and a continuation parts from llama.cpp's at its first
near-tie. `--force` measures each op from llama.cpp's inputs instead (every intermediate replaced by
llama.cpp's once compared); `--greedy PROMPTS.json` measures what a user sees: greedy continuations
against llama.cpp's default path, beside its flash-attention path as the yardstick (run it on two
checkouts to bisect a change). On 40 prompts x 32 tokens of the embedded Gemma: first tokens 39,
identical continuations 16, mean common prefix 19.2 tokens, where llama.cpp's flash-attention path
gets 38, 8 and 12.5.

Kernels. At load, block-quantized weights are repacked into 64-row tiles at the file's own bits per
weight (repack.py): 4-bit nibbles (Q4_0/Q4_1/Q4_K), nibbles plus a 1- or 2-bit plane
(Q5_0/Q5_1/Q5_K, Q6_K), bytes (Q8_0), the file's f16 scales and small integer sub-block scales
(Q4_K/Q5_K: llama.cpp's 12 packed bytes), so a Q4_K_M model takes its file size in memory. MXFP4
(gpt-oss's experts, llama.cpp's MXFP4_MOE files) keeps its 4-bit codes, which the kernels map in
registers to their values, the integers 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12 (a few byte operations), and
its scale 2^(e-128), a power of two that f16 holds exactly for e-128 in [-24, 15], as an f16: 4.5
bits per weight against the file's 4.25, and llama.cpp's MXFP4 dot exactly (Q8_0 activations, both
scales times the integer dot). A block of zeros beyond that range scales by 0; a tensor with a block
of nonzero weights beyond it (from llama.cpp's quantizer, 32 weights all below ~2^-21) runs on the
slower dequantize-and-dot path, with a warning. The kernels (qdot.py) take the planes apart in
registers, quantize the activations the way llama.cpp does and take exact integer dot products per
block; for the K-quants, as in llama.cpp's `ggml_vec_dot_q*_K_q8_K`, each super-block's sub-block
dots times their integer scales (and the mins times the activation sums) are summed in int32 and
scaled once per super-block. So results equal dequantize-then-multiply up to float rounding, and
every batch size gives the same floats. The integer kernel is picked from the CPU (target.py):
`vpdpbusd` with AVX-512 VNNI, `vpmaddubsw`/`vpmaddwd` with AVX2 or AVX-512BW (as llama.cpp's AVX2
code); elsewhere a portable float kernel with bit-identical results (`INFER_PORTABLE_KERNEL=1`
selects it anywhere). Long batches expand each tile to bytes once and run all their tokens over it,
from a length measured per type (`Layout.expand_from`: 48 tokens for MXFP4, 64 Q3_K, 128 Q2_K, 192
Q6_K, 384 Q5_*, 1024 Q4_*; Q4_0/Q4_1 and Q5_0/Q5_1, measured up to 256 tokens only, take Q4_K's and
Q5_K's): the expansion is a pass over the whole weight, which pays only once enough 4-token passes
save their unpacking. Q/K/V and gate/up are stacked into one matrix each, and a layer is ~9 numba
calls.

Memory. Repacking streams through the file a chunk at a time, maps each chunk's pages in one call
(`MADV_POPULATE_READ`) and hands them back to the OS as it goes (`MADV_DONTNEED`), so the weights
are resident once. Token embeddings are read from the file with `pread` (rows.py) rather than
through the mapping, whose fault-around would make ~64 KiB resident per distinct token (96 varied
tokens on the embedded Gemma: 37 MiB of its embedding resident before, under 0.4 MiB now; on the
1.5B shape, two 512-token random prompts: +110 MiB RSS before, +7 MiB now). `--no-mmap` copies what
is still read from the file (embedding table, unquantized tensors) into memory, `--mlock` pins the
weights. On Linux the packed planes of several MiB ask for transparent huge pages (`MADV_HUGEPAGE`,
honoured when THP is in `madvise` or `always` mode): fewer TLB misses while decode streams them
(Q6_K +13% from memory on the AVX2 machine, Q4_K unchanged), and no padding, so memory use is the
same.

Mixtures of experts (moe.py) run as llama.cpp's `build_moe_ffn` computes them: the router's
softmax, the top `expert_used_count` experts, their weights renormalized, each expert's SwiGLU, the
weighted outputs added in order (gpt-oss: the top router logits, then a softmax over those
alone, with biases; models/arch/gpt_oss.py; lfm2moe: each logit's sigmoid, the top ones chosen
with a selection bias added). The batch's tokens are grouped by expert, so a prefill or a batch
of streams runs each expert it uses once, on all of its tokens; every row comes out as it would
alone. Each expert's matrices are row ranges of the file's 3-D tensors, packed per expert at load.
The mlx backend makes the same choice (this backend's router kernel on the evaluated router output)
and runs each used expert once on its tokens.

Speed against llama.cpp, and why each kernel is shaped as it is: scripts/BENCHMARKS.md.
"""
