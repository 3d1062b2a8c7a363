"""The llama.cpp backend: GGUF files on llama-cpp-python's kernels (CPU, CUDA, Metal, Vulkan), under infer's engine.

One llama.cpp context whose sequences follow the engine's (runner.py): continuous batching and
prefix reuse still hold, cached prefixes shared with llama.cpp's sequence copy (slots.py maps
engine sequences to llama.cpp's sequence slots). It keeps `--parallel` slots plus as many (at
least 8) for finished sequences whose cells a later prompt can share; llama.cpp reserves a
vocabulary-sized logits row per slot. `--gpu-layers/-ngl` passes through (-1: all); devices.py
reads which devices the ggml build can compute on. It does not compute embeddings.
"""
