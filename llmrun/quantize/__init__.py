"""Changing a model's form: GGUF → MLX conversion (and, later, quantization and its quality report)."""
