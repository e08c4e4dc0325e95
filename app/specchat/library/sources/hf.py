"""``hf:org/repo[@revision]``: a Hugging Face Hub repo, downloaded with
progress when it is not in the library yet."""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import hub
from specchat.library.catalog import load_catalog
from specchat.library.errors import LibraryError
from specchat.library.model_side import ModelSide, catalog_side, installed_side
from specchat.library.progress import Progress
from specchat.library.sources.base import Source


class HubSource(Source):
    accepted = "hf:org/repo[@revision]"
    mention = 5

    def claims(self, ref: str) -> bool:
        return ref.startswith("hf:")

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        # DownloadProgress -> (message, fraction), with the numbers in words.
        report = None if progress is None else (lambda p: progress(p.describe(), p.fraction))
        return hub.resolve(ref, report, cancelled)

    def pull(self, ref: str, progress=None, cancelled=None):
        return hub.pull(ref, progress, cancelled)

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        have = hub.installed(ref)
        if have is not None:
            return installed_side(ref, have)
        known = load_catalog().model(ref)
        if known is not None:
            return catalog_side(ref, known)
        raise LibraryError(
            f"{ref} is not downloaded and not in the catalog, so its tokenizer cannot be "
            f"checked yet: run `specchat models pull {ref}` first.")
