"""The compute backends: a loaded model turned into a Runner that computes logits for a batch of
tokens over a paged KV cache. The engine decides what runs; a backend only computes it.

Modules, by what they are for:

- `base.py`: the interface every backend implements (the Runner protocol, RunnerOptions, the KV
  pool protocol and the KV cache types).
- `batch.py`: what one forward pass computes (tokens of several sequences, where their K/V live),
  built by the engine's scheduler.
- `registry.py`: which backends exist, which can run here, and making a runner on one (`--backend`).
- `cpu/`: infer's own numba kernels, computing what llama.cpp's CPU backend computes (CpuRunner;
  its map and the numerics notes: cpu/__init__.py).
- `mlx/`: GGUF files and MLX folders on MLX (MlxRunner; its map: mlx/__init__.py).
- `llamacpp/`: GGUF files on llama-cpp-python's kernels (LlamaCppRunner; its map:
  llamacpp/__init__.py).
"""
