"""A catalog id (``qwen2.5-7b``): the catalog's Hub or bundled reference,
pulled or converted when first used. Judged from the catalog until then."""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import index
from specchat.library.catalog import CatalogModel, load_catalog
from specchat.library.errors import LibraryError
from specchat.library.model_side import ModelSide, catalog_side, installed_side
from specchat.library.progress import Progress
from specchat.library.sources.base import Source
from specchat.library.sources.bundled import BundledSource
from specchat.library.sources.hf import HubSource

# What a catalog entry's reference is (catalog.py refuses any other kind):
# resolved and pulled by its own source, not through the whole registry.
_KINDS = (HubSource(), BundledSource())


class CatalogSource(Source):
    accepted = "a catalog name"
    mention = 6

    def claims(self, ref: str) -> bool:
        return load_catalog().model(ref) is not None

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        known = _known(ref)
        return _source(known).resolve(known.ref, progress, cancelled)

    def pull(self, ref: str, progress=None, cancelled=None):
        known = _known(ref)
        return _source(known).pull(known.ref, progress, cancelled)

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        known = _known(ref)
        have = index.find_source(known.ref)
        if have is not None:
            return installed_side(ref, have)
        return catalog_side(ref, known)


def _known(ref: str) -> CatalogModel:
    known = load_catalog().model(ref)
    if known is None:  # only when asked without claims() first
        raise LibraryError(f"{ref!r} is not in the catalog (see `specchat models catalog`).")
    return known


def _source(known: CatalogModel) -> Source:
    return next(s for s in _KINDS if s.claims(known.ref))
