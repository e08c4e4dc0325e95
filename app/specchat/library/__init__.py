"""The model library: catalog, Hub downloads, GGUF import, bundled models,
cache layout, and resolving model references to MLX folders."""
