"""The kinds of model reference, in the order they are tried.

Order is precedence: the ``hf:`` and ``bundled:`` prefixes before paths (a
path never starts with them), an existing folder or file before an installed
name (what is on disk where the user points wins), and installed names
before catalog ids (what the user named wins over what we recommend).
A new kind is one module with a ``Source`` subclass and one line below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from specchat.library.sources.base import Progress, Source
from specchat.library.sources.bundled import BundledSource
from specchat.library.sources.catalog import CatalogSource
from specchat.library.sources.cluster import ClusterSource
from specchat.library.sources.folder import FolderSource
from specchat.library.sources.gguf_file import GgufFileSource
from specchat.library.sources.hf import HubSource
from specchat.library.sources.installed import InstalledSource

if TYPE_CHECKING:
    from specchat.library.hub import DownloadProgress
    from specchat.library.index import InstalledModel

__all__ = ["SOURCES", "Progress", "Source", "accepted", "find", "pull"]

SOURCES: list[Source] = [
    HubSource(),
    BundledSource(),
    ClusterSource(),
    FolderSource(),
    GgufFileSource(),
    InstalledSource(),
    CatalogSource(),
]


def find(ref: str) -> Source | None:
    """The first source that claims ``ref`` (stripped, not empty), or None."""
    return next((s for s in SOURCES if s.claims(ref)), None)


def pull(ref: str, progress: Callable[[DownloadProgress], None] | None = None,
         cancelled: threading.Event | None = None) -> InstalledModel | None:
    """The InstalledModel for ``ref`` after pulling it through the first
    pullable source that claims it, or None when none does (folders and files
    are not pulled: they are imported)."""
    source = next((s for s in SOURCES if s.pullable and s.claims(ref)), None)
    return source.pull(ref, progress, cancelled) if source is not None else None


def accepted() -> str:
    """What a reference may be, in words, for "pass ..." messages: every
    registered kind, most familiar first."""
    words = [s.accepted for s in sorted(SOURCES, key=lambda s: s.mention)]
    return ", ".join(words[:-1]) + f", or {words[-1]}" if len(words) > 1 else words[0]
