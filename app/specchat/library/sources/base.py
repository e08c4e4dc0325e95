"""What one kind of model reference must say: whether a reference is of its
kind, which MLX folder it names, and what is known about it.

``refs.resolve`` and ``compatibility.describe`` ask the sources in
``refs.SOURCES`` in order and let the first that claims a reference
answer, so a new kind of reference is one subclass and one registration
line, and the two never disagree about what a reference means.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from specchat.library.index import InstalledModel
from specchat.library.model_side import ModelSide, folder_side
from specchat.library.progress import DownloadProgress, Progress


class Source:
    """One kind of reference. Subclasses set ``accepted`` (the words the
    "unknown model" message uses for this kind) and implement ``claims`` and
    ``resolve``; ``describe`` defaults to reading the resolved folder, which
    is right whenever resolving is cheap."""

    accepted: str = ""
    # Where the "pass ..." message lists this kind (lower first); sources
    # without one are listed last, in registry order.
    mention: int = 100

    def claims(self, ref: str) -> bool:
        """Whether ``ref`` (stripped, not empty) is of this kind. Cheap: at
        most a stat or an index read, never a download or a conversion."""
        raise NotImplementedError

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        """The MLX folder ``ref`` names, downloading or converting it if
        needed (reporting through ``progress``, stopping when ``cancelled``)."""
        raise NotImplementedError

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        """What is known about ``ref`` without downloading. With
        ``allow_work`` False nothing may be converted either: answer from the
        index or the catalog, or raise LibraryError saying why not."""
        return folder_side(ref, self.resolve(ref))

    def pull(self, ref: str, progress: Callable[[DownloadProgress], None] | None = None,
             cancelled: threading.Event | None = None) -> InstalledModel:
        """Download or convert ``ref`` into the library and list it. Only the
        kinds ``specchat models pull`` takes define it: folders and files are
        imported instead, and the pull skips them (``refs.pull``)."""
        raise NotImplementedError
