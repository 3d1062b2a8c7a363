"""Models: files in (GGUF, Hugging Face and MLX folders), configs and weights out, for the backends
to run; plus what the model commands do with files (quantize, export, pull, store).

Modules, by what they are for:

- GGUF files: `gguf_file.py` (the reader: metadata, tensors as views of the memory map, split
  files), `gguf_write.py` (the streaming writer: one tensor at a time, renamed when complete).
- A model to run: `loader.py` (GGUF metadata to config, tensors checked against the architecture),
  `config.py` (ModelConfig: the hyperparameters; the keys read through more than a lookup
  and their bounds in `config_keys.py`), `weights.py` (the weights as the backends take
  them; the BERT family's own tensors in `encoder_weights.py`, MLA's, gated attention's and the
  recurrent layers' in `mixer_weights.py`, what they share in `matrix.py`), `limits.py` (bounds
  that refuse corrupt or hostile files), `mlx_folder.py` (an MLX-format folder loaded as a
  model), `arch/` (one module per architecture and the shared decoder; its checklist for adding
  one: arch/__init__.py).
- Hugging Face folders: `convert_hf.py` (a checkpoint read as llama.cpp's converter would write
  it), `hf_files.py` (the folder's files: JSON, safetensors), `hf_vocab.py` (its tokenizer as GGUF
  vocabulary keys).
- Quantizing and exporting (`infer quantize`): `source.py` (the input model, GGUF or HF folder,
  tensors loaded lazily), `quantize_file.py` (a quantized GGUF out, as llama-quantize writes it),
  `mlx_export.py` (an MLX model folder out), `imatrix.py` (llama-imatrix files, `--imatrix`).
- Finding models: `resolve.py` (what the user typed to a model path), `store.py` (the local store
  of pulled models), `hub.py` (`infer pull` from the Hugging Face Hub), `default.py` (the models
  used when none is named), `describe.py` (what `infer show` says), `zero_model.py` (a zero-weight
  GGUF to compile kernels on, `infer kernels --warm`).
"""
