"""A ``.gguf`` file: converted to an MLX folder once, listed, then reused.

It claims the files that are GGUF by name or by their magic bytes; any
other file is claimed by no source, and ``refs`` says it is not a GGUF model.
"""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import importing, index
from specchat.library.errors import LibraryError
from specchat.library.index import InstalledModel
from specchat.library.model_side import ModelSide, folder_side, installed_side
from specchat.library.progress import Progress
from specchat.library.sources.base import Source


class GgufFileSource(Source):
    accepted = "a .gguf file"
    mention = 4

    def claims(self, ref: str) -> bool:
        return importing.is_gguf(Path(ref).expanduser())

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        path = Path(ref).expanduser()
        model = _imported(path) or importing.import_path(path, progress=progress,
                                                         cancelled=cancelled)
        return Path(model.path)

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        path = Path(ref).expanduser()
        have = _imported(path)
        if have is not None:
            return installed_side(ref, have)
        if not allow_work:
            raise LibraryError(f"{path.name} has not been imported yet, so it cannot be "
                               "checked without converting it first.")
        return folder_side(ref, self.resolve(ref))


def _imported(path: Path) -> InstalledModel | None:
    """The index entry of an earlier import of this file, if any."""
    return index.find_source(f"gguf:{path.resolve()}")
