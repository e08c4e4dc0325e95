"""A local MLX folder, used where it is (nothing copied or listed)."""

from __future__ import annotations

from pathlib import Path

from specchat.library.sources.base import Source


class FolderSource(Source):
    accepted = "a model folder"
    mention = 3

    def claims(self, ref: str) -> bool:
        return Path(ref).expanduser().is_dir()

    def resolve(self, ref: str, progress=None, cancelled=None) -> Path:
        return Path(ref).expanduser().resolve()
