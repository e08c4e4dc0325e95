"""SpecChat: local LLM chat with speculative decoding on MLX."""

__version__ = "0.1.0"
