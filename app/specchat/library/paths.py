"""Where the model library keeps its files.

Everything SpecChat downloads, imports or converts lives under one folder,
``platformdirs.user_data_dir("SpecChat")`` unless ``SPECCHAT_HOME`` points
elsewhere (tests, power users). Nothing is written outside it, so removing
that folder removes every model. The folder is read from the environment on
every call, so a test can point it at a temporary directory at any time.

Layout::

    <home>/index.json   what is installed (written atomically, see index.py)
    <home>/hub/         huggingface_hub cache (models--org--repo/...)
    <home>/models/      imported and converted models, one MLX folder each
    <home>/bundled/     the bundled pair, converted once from its GGUF files
    <home>/tmp/         staging for imports (same disk, so moves are atomic)
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from specchat.home import home


def _sub(name: str, create: bool) -> Path:
    path = home() / name
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # was only "File exists"
            raise FileExistsError(errno.EEXIST, f"{path} is a file, not a folder; SpecChat "
                                                "keeps its files there: move it away") from None
    return path


def hub_cache(create: bool = False) -> Path:
    """huggingface_hub's cache_dir: downloads keep the Hub's blob/snapshot
    layout so a retry reuses every finished file."""
    return _sub("hub", create)


def models_dir(create: bool = False) -> Path:
    """Imported MLX folders and converted GGUF files, one folder per name."""
    return _sub("models", create)


def bundled_dir(create: bool = False) -> Path:
    """The bundled models, converted from their GGUF files on first use."""
    return _sub("bundled", create)


def tmp_dir(create: bool = False) -> Path:
    """Staging area on the same disk as the models, so a finished import is
    moved into place with one rename and a half-copied one is never listed."""
    return _sub("tmp", create)


def index_file() -> Path:
    return home() / "index.json"


def disk_usage(root: Path | None = None) -> int:
    """Bytes used under the library folder (or ``root``).

    Counts regular files once per inode and skips symlinks, so the Hub cache's
    snapshot links are not counted on top of the blobs they point to.
    """
    root = root or home()
    if not root.exists():
        return 0
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
    return total
