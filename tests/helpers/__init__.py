"""What the tests share, imported as `helpers.X` (tests/conftest.py puts tests/ on sys.path);
no test module imports another.

- server: the real `infer serve` in a subprocess (Server), raw HTTP (raw), /metrics (metrics,
  wait_idle), the embedded Gemma's served name (MODEL) and a short chat (HELLO).
- cli: `infer` in a subprocess (infer) and the one-line error every user-facing failure must be.
- engine_runs: requests through an engine all at once, each alone, one cancelled midway.
- tiny_models: tiny random-weight GGUF models of every architecture that generates
  (write_tiny_model; DECODERS).
- tiny_encoders: tiny random-weight BERT-family encoders with llama.cpp's real vocabularies.
- embeddings: embeddings through the engine and through llama.cpp, their cosine distance.
- hf_models: tiny Hugging Face checkpoints (safetensors, config.json, tokenizer) and their
  float reference forward passes.
- vocab_gguf: GGUF files that carry only a vocabulary, and llama.cpp's tokenizer as the reference.
- llama_vocab: llama.cpp's ggml-vocab-*.gguf files and their test vectors.
- logits: a tiny model's logits from llama.cpp, the cpu and the MLX backends, and the bound ours
  must stay within llama.cpp's.
- exact_forward: the float64 forward pass that arbitrates between backends' roundings.
- llama_quantize: llama.cpp's own quantizer, the reference of `infer quantize`.
- ggml_ops: one ggml op from llama.cpp's own libggml (the kernels that match ggml bit for bit).
- quant_blocks: random quantized blocks with valid scales.
- prompts: many-script prompts the embedded Gemma is run on against llama.cpp.
- fake_hub: a local Hugging Face Hub over HTTP (FakeHub, FakeRepo) for pull tests.
- api_fuzz, gguf_fuzz, mlx_fuzz: the fuzzers of the server's API, of GGUF files and of MLX / HF
  folders and imatrix files; the bounded runs are tests, the long ones scripts/fuzz_*.py.
"""
