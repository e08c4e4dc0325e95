"""Model references -> MLX model folders.

One function, ``resolve``, turns whatever the user typed (GUI, ``generate``,
``bench``) into a folder the engine can load:

* an installed name (``specchat models list``), e.g. ``qwen2.5-0.5b``
* ``bundled:NAME``, one of the models that ship with SpecChat
* a local MLX folder (used where it is, nothing copied)
* a ``.gguf`` file (converted to MLX once, then reused)
* ``hf:org/repo[@revision]`` (downloaded with progress if not cached)
* a catalog id (``qwen2.5-7b``), pulled from the Hub if not installed

Resolution may download or convert, so it runs on the engine thread with a
progress callback ``(message, fraction or None)`` and a cancel event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from specchat.library.errors import LibraryError

Progress = Callable[[str, float | None], None]

ACCEPTED = ("an installed model name (see `specchat models list`), bundled:NAME, a model "
            "folder, a .gguf file, hf:org/repo[@revision], or a catalog name")


def resolve(ref: str, progress: Progress | None = None,
            cancelled: threading.Event | None = None) -> Path:
    """The MLX folder for ``ref``; LibraryError says what is accepted when
    the reference means nothing."""
    ref = (ref or "").strip()
    if not ref:
        raise LibraryError(f"No model given: pass {ACCEPTED}.")
    if ref.startswith("hf:"):
        return _resolve_hf(ref, progress, cancelled)
    if ref.startswith("bundled:"):
        return _resolve_bundled(ref[len("bundled:"):], progress, cancelled)
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_file():
        from specchat.library.importing import is_gguf

        if is_gguf(path):
            return _resolve_gguf(path, progress, cancelled)
        raise LibraryError(f"{path} is a file but not a GGUF model; pass {ACCEPTED}.")
    from specchat.library import index

    model = index.get(ref)
    if model is not None:
        return Path(model.path)
    from specchat.library.catalog import load_catalog

    known = load_catalog().model(ref)
    if known is not None:
        return resolve(known.ref, progress, cancelled)
    raise LibraryError(_unknown(ref, path))


def _unknown(ref: str, path: Path) -> str:
    from specchat.library import index

    names = [m.name for m in index.list_installed()]
    have = f" Installed: {', '.join(names)}." if names else " Nothing is installed yet."
    if ref.lower().endswith(".gguf") or ref.startswith(("/", "~", ".")):
        return f"Model file or folder not found: {path}."
    if ref.count("/") == 1 and not ref.startswith(("/", ".")):
        return (f"Unknown model {ref!r}: no such folder here. If it is a Hugging Face repo, "
                f"write hf:{ref}.{have}")
    return f"Unknown model {ref!r}: pass {ACCEPTED}.{have}"


def _resolve_hf(ref: str, progress: Progress | None, cancelled) -> Path:
    from specchat.library import hub

    return hub.resolve(ref, _download_reporter(progress), cancelled)


def _download_reporter(progress: Progress | None):
    """DownloadProgress -> (message, fraction), with the numbers in words."""
    if progress is None:
        return None

    def report(p) -> None:
        progress(p.describe(), p.fraction)

    return report


def _resolve_bundled(name: str, progress: Progress | None, cancelled) -> Path:
    from specchat.library import bundled

    return Path(bundled.ensure(name, progress, cancelled))


def _resolve_gguf(path: Path, progress: Progress | None, cancelled) -> Path:
    """A GGUF file: its MLX conversion if it was imported before, else
    imported now (converted once, listed under the file's model name)."""
    from specchat.library import importing, index

    existing = index.find_source(f"gguf:{path.resolve()}")
    if existing is not None:
        return Path(existing.path)
    return Path(importing.import_path(path, progress=progress, cancelled=cancelled).path)
