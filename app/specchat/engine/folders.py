"""What makes a folder an MLX model folder SpecChat will load.

Pure file checks (no MLX), shared by the engine before loading and by the
model library before importing or listing, so both refuse the same folders
with the same words.
"""

from __future__ import annotations

import json
from pathlib import Path

from specchat.engine.errors import EngineError


def weight_files(folder: Path) -> list[Path]:
    """The files mlx-lm loads weights from (same glob as mlx_lm.utils)."""
    return sorted(folder.glob("model*.safetensors"))


def read_config(folder: Path, error: type[EngineError] = EngineError) -> dict:
    path = folder / "config.json"
    if not path.exists():
        raise error(f"{folder} is not an MLX model folder (config.json is missing)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(f"{path} is not valid JSON ({exc}); the model folder is damaged") from exc
    if not isinstance(config, dict):
        raise error(f"{path} is not a model config (expected a JSON object)")
    return config


def validate_folder(folder: Path, error: type[EngineError] = EngineError) -> dict:
    """Config, weights and tokenizer are all there; returns config.json."""
    if not folder.exists():
        raise error(f"Model folder not found: {folder}")
    if not folder.is_dir():
        raise error(f"Not a model folder: {folder}")
    config = read_config(folder, error)
    if not weight_files(folder):
        pickled = [p.name for pat in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in folder.glob(pat)]
        if pickled:
            raise error(
                f"{folder} has only pickled PyTorch weights ({pickled[0]}); SpecChat loads "
                "safetensors only, because pickled files can run code when opened")
        raise error(f"{folder} has no weights (no model*.safetensors files)")
    if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer.model").exists():
        raise error(f"{folder} has no tokenizer (tokenizer.json is missing)")
    return config
