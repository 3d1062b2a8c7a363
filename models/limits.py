"""Bounds on a model's hyperparameters that no real model comes near: a file or config.json past
them is corrupt or hostile, refused before any buffer is sized from it (models/config.py and
config_keys.py for GGUF metadata, models/arch/hf_keys.py for Hugging Face and MLX folders)."""

MAX_LAYERS = 4096  # far past any model's block_count; a header claiming more is corrupt
MAX_HEAD_DIM = 8192
MAX_WIDTH = 1 << 20  # n_embd and the FFN widths: a million, ten times past any model's
MAX_CONV_WIDTH = 64  # a short convolution's width (LFM2: 3); its state keeps width - 1 inputs per layer
