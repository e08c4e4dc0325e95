"""Model references -> MLX model folders.

One function, ``resolve``, turns whatever the user typed (GUI, ``generate``,
``bench``) into a folder the engine can load. What a reference may be is the
registry in ``sources/`` (one module per kind), tried in order:

* ``hf:org/repo[@revision]`` (downloaded with progress if not cached)
* ``bundled:NAME``, one of the models that ship with SpecChat
* a local MLX folder (used where it is, nothing copied)
* a ``.gguf`` file (converted to MLX once, then reused)
* an installed name (``specchat models list``), e.g. ``qwen2.5-0.5b``
* a catalog id (``qwen2.5-7b``), pulled from the Hub if not installed

Resolution may download or convert, so it runs on the engine thread with a
progress callback ``(message, fraction or None)`` and a cancel event.
"""

from __future__ import annotations

import threading
from pathlib import Path

from specchat.library import sources
from specchat.library.errors import LibraryError
from specchat.library.sources import Progress

__all__ = ["Progress", "accepted", "resolve", "source_for", "unknown_model"]


def accepted() -> str:
    """What a reference may be, in words (every registered source)."""
    return sources.accepted()


def source_for(ref: str) -> tuple[str, sources.Source]:
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
    source = sources.find(ref)
    if source is None:
        raise unknown_model(ref)
    return ref, source


def resolve(ref: str, progress: Progress | None = None,
            cancelled: threading.Event | None = None) -> Path:
    """The MLX folder for ``ref``; LibraryError says what is accepted when
    the reference means nothing."""
    ref, source = source_for(ref)
    return source.resolve(ref, progress, cancelled)


def unknown_model(ref: str) -> LibraryError:
    """The error for a reference no source claims, with a hint for the
    near misses (a missing path, ``org/repo`` without ``hf:``)."""
    return LibraryError(_unknown(ref, Path(ref).expanduser()))


def _unknown(ref: str, path: Path) -> str:
    from specchat.library import index

    names = [m.name for m in index.list_installed()]
    have = f" Installed: {', '.join(names)}." if names else " Nothing is installed yet."
    if ref.lower().endswith(".gguf") or ref.startswith(("/", "~", ".")):
        return f"Model file or folder not found: {path}."
    if ref.count("/") == 1 and not ref.startswith(("/", ".")):
        return (f"Unknown model {ref!r}: no such folder here. If it is a Hugging Face repo, "
                f"write hf:{ref}.{have}")
    return f"Unknown model {ref!r}: pass {accepted()}.{have}"
