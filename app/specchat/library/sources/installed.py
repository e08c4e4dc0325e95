"""An installed model's name (``specchat models list``): its folder, and its
facts straight from the index."""

from __future__ import annotations

from pathlib import Path

from specchat.library import hub, index
from specchat.library.errors import LibraryError
from specchat.library.model_side import ModelSide, installed_side
from specchat.library.sources.base import Source


class InstalledSource(Source):
    accepted = "an installed model name (see `specchat models list`)"
    mention = 1

    def claims(self, ref: str) -> bool:
        return index.get(ref) is not None

    def resolve(self, ref: str, progress=None, cancelled=None) -> Path:
        return Path(_entry(ref).path)

    def pull(self, ref: str, progress=None, cancelled=None) -> index.InstalledModel:
        """A Hub download is updated; anything else is already complete."""
        have = _entry(ref)
        if have.kind == "hub":
            return hub.pull(have.source, progress, cancelled)
        return have

    def describe(self, ref: str, allow_work: bool = True) -> ModelSide:
        return installed_side(ref, _entry(ref))


def _entry(ref: str) -> index.InstalledModel:
    model = index.get(ref)
    if model is None:  # removed since claims() looked
        raise LibraryError(f"No model named {ref!r} is installed (any more): see "
                           "`specchat models list`.")
    return model
