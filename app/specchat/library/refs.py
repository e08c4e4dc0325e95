"""Model references -> MLX model folders.

One function, ``resolve``, turns whatever the user typed (GUI, ``generate``,
``bench``) into a folder the engine can load. What a reference may be is the
registry ``SOURCES`` below (one module per kind in ``sources/``), tried in
order:

* ``hf:org/repo[@revision]`` (downloaded with progress if not cached)
* ``bundled:NAME``, one of the models that ship with SpecChat
* ``cluster:NAME``, a target spread over machines (``specchat cluster``)
* a local MLX folder (used where it is, nothing copied)
* a ``.gguf`` file (converted to MLX once, then reused)
* an installed name (``specchat models list``), e.g. ``qwen2.5-0.5b``
* a catalog id (``qwen2.5-7b``), pulled from the Hub if not installed

Order is precedence: the prefixes before paths (a path never starts with
them), an existing folder or GGUF file before an installed name (what is on
disk where the user points wins), and installed names before catalog ids
(what the user named wins over what we recommend). A new kind is one module
with a ``Source`` subclass and one line in ``SOURCES``. The registry lives
here rather than in ``sources/__init__.py`` so that no source imports the
package that lists it.

Resolution may download or convert, so it runs on the engine thread with a
progress callback ``(message, fraction or None)`` and a cancel event.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from specchat import records
from specchat.library import index
from specchat.library.errors import LibraryError
from specchat.library.index import InstalledModel
from specchat.library.progress import DownloadProgress, Progress
from specchat.library.sources.base import Source
from specchat.library.sources.bundled import BundledSource
from specchat.library.sources.catalog import CatalogSource
from specchat.library.sources.cluster import ClusterSource
from specchat.library.sources.folder import FolderSource
from specchat.library.sources.gguf_file import GgufFileSource
from specchat.library.sources.hf import HubSource
from specchat.library.sources.installed import InstalledSource

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
    source that defines ``pull`` and claims it, or None when none does
    (folders and files are not pulled: they are imported)."""
    source = next((s for s in SOURCES if type(s).pull is not Source.pull and s.claims(ref)),
                  None)
    return source.pull(ref, progress, cancelled) if source is not None else None


def accepted() -> str:
    """What a reference may be, in words, for "pass ..." messages: every
    registered kind, most familiar first."""
    words = [s.accepted for s in sorted(SOURCES, key=lambda s: s.mention)]
    return ", ".join(words[:-1]) + f", or {words[-1]}" if len(words) > 1 else words[0]


def source_for(ref: str) -> tuple[str, Source]:
    """(stripped ref, the source that claims it); LibraryError says what is
    accepted when nothing does."""
    ref = (ref or "").strip()
    if not ref:
        raise LibraryError(f"No model given: pass {accepted()}.")
    if ref.startswith("~"):  # every source expands it; an unknown user is a RuntimeError there
        try:
            Path(ref).expanduser()
        except RuntimeError:
            raise LibraryError(f"Model file or folder not found: {ref} (there is no such "
                               "user's home folder).") from None
    source = find(ref)
    if source is None:
        raise LibraryError(_unknown(ref, Path(ref).expanduser()))
    return ref, source


def resolve(ref: str, progress: Progress | None = None,
            cancelled: threading.Event | None = None) -> Path:
    """The MLX folder for ``ref``; LibraryError says what is accepted when
    the reference means nothing."""
    ref, source = source_for(ref)
    return source.resolve(ref, progress, cancelled)


def _unknown(ref: str, path: Path) -> str:
    """Why no source claims ``ref``, with a hint for the near misses (a
    file that is not GGUF, a missing path, ``org/repo`` without ``hf:``)."""
    if path.is_file():  # a file the .gguf source did not claim
        return f"{path} is a file but not a GGUF model; pass {accepted()}."
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    if mode is not None:  # there, but neither a file nor a folder (a device, a FIFO)
        return (f"{path} is {records.file_kind(mode)}, not a model file or folder: SpecChat "
                "reads only regular files.")
    if path.is_symlink():
        return f"{path} is a link to {os.readlink(path)}, which is not there."
    names = [m.name for m in index.list_installed()]
    have = f" Installed: {', '.join(names)}." if names else " Nothing is installed yet."
    if ref.lower().endswith(".gguf") or ref.startswith(("/", "~", ".")):
        return f"Model file or folder not found: {path}."
    if ref.count("/") == 1 and not ref.startswith(("/", ".")):
        return (f"Unknown model {ref!r}: no such folder here. If it is a Hugging Face repo, "
                f"write hf:{ref}.{have}")
    return f"Unknown model {ref!r}: pass {accepted()}.{have}"
