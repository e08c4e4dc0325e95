"""Model references -> MLX model folders.

A reference is a local MLX folder for now; the library extends this with
``bundled:...``, ``.gguf`` files, installed names and ``hf:org/repo``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specchat.engine.errors import EngineError

Progress = Callable[[str, float | None], None]


def resolve(ref: str, progress: Progress | None = None, cancelled=None) -> Path:
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    raise EngineError(f"Unknown model {ref!r}: not a model folder")
