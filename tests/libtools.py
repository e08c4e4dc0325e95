"""Small helpers for the tests that use the model library (no fixtures
here, so test modules can import them freely)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FAKE_TOKEN = "hf_specchatTESTtokenNOTreal0123456789"


def pickled_repo_files(folder: Path) -> dict[str, bytes]:
    """A repo with pickled weights only (config and tokenizer from a tiny model)."""
    return {"config.json": (folder / "config.json").read_bytes(),
            "tokenizer.json": (folder / "tokenizer.json").read_bytes(),
            "pytorch_model.bin": b"\x80\x02" + b"\0" * 4096}


def edited_copy(src: Path, dest: Path, config: dict | None = None,
                tokenizer_config: dict | None = None) -> Path:
    """A copy of a model folder with some config keys changed (no MLX needed)."""
    shutil.copytree(src, dest)
    if config:
        data = json.loads((dest / "config.json").read_text())
        data.update(config)
        (dest / "config.json").write_text(json.dumps(data))
    if tokenizer_config:
        data = json.loads((dest / "tokenizer_config.json").read_text())
        data.update(tokenizer_config)
        (dest / "tokenizer_config.json").write_text(json.dumps(data))
    return dest


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()) \
        if root.exists() else []


def specchat_env(tmp_path: Path, home: Path, **extra: str) -> dict[str, str]:
    """Environment for running the real ``specchat`` command in a subprocess:
    a private HOME/XDG, the test's library, no HF_/SPECCHAT_ variables but ``extra``."""
    import os

    fake_home = tmp_path / "fake-home"
    fake_home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE", "XDG_", "SPECCHAT_"))}
    env.update({"HOME": str(fake_home), "XDG_CACHE_HOME": str(fake_home / ".cache"),
                "SPECCHAT_HOME": str(home), **extra})
    return env


def blob_files(root: Path, suffix: str) -> list[Path]:
    """Files under ``root`` whose name ends with ``suffix`` (partials, locks)."""
    return sorted(p for p in root.rglob(f"*{suffix}")) if root.exists() else []
