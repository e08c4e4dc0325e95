"""A catalog id (``qwen2.5-7b``): the catalog's Hub or bundled reference,
pulled or converted when first used. Judged from the catalog until then."""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import index
from specchat.library.catalog import CatalogModel, load_catalog
from specchat.library.model_side import ModelSide, catalog_side, installed_side
from specchat.library.sources.base import Progress, Source


class CatalogSource(Source):
    accepted = "a catalog name"
    mention = 6
    pullable = True

    def claims(self, ref: str) -> bool:
        return load_catalog().model(ref) is not None

    def resolve(self, ref: str, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> Path:
        from specchat.library import refs

        return refs.resolve(_known(ref).ref, progress, cancelled)

    def pull(self, ref: str, progress=None, cancelled=None):
        from specchat.library import sources

        return sources.pull(_known(ref).ref, progress, cancelled)

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        known = _known(ref)
        have = index.find_source(known.ref)
        if have is not None:
            return installed_side(ref, have)
        return catalog_side(ref, known)


def _known(ref: str) -> CatalogModel:
    known = load_catalog().model(ref)
    if known is None:  # only when asked without claims() first
        from specchat.library.refs import unknown_model

        raise unknown_model(ref)
    return known
