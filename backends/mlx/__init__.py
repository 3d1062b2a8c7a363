"""The mlx backend: GGUF files and MLX-format folders on MLX (Metal on Apple Silicon, MLX's CPU or CUDA builds elsewhere).

Weights become MLX arrays (weights.py): GGUF blocks map exactly onto MLX's affine format for Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K, and MXFP4 is MLX's own `mxfp4` mode (the same e2m1 codes and
E8M0 scale bytes, nibbles reordered; 4.25 bits per weight); Q2_K, Q3_K and Q6_K have 16-weight
sub-blocks, which MLX cannot express, and are re-quantized (errors stated in weights.py). Products
are `mx.quantized_matmul`; attention runs over a paged KV pool in MLX (attention.py, kv_pool.py);
the decoder's primitives are primitives.py, MlxRunner in runner.py. A mixture of experts takes
the cpu backend's router choice on the evaluated router output and runs each used expert once on
its tokens. A hybrid model's short convolutions (lfm2, shortconv.py) and gated delta nets (qwen35,
delta_net.py) read and update a per-sequence state in state_pool.py, with the cpu backend's
semantics. MLX-format folders run only here.
"""
