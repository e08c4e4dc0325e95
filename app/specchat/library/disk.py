"""Free disk space, checked before work that writes a lot (a download, an
import, a GGUF conversion, joining the bundled parts), so it is refused with
the numbers before the first byte instead of failing midway; and a file's
stamp, which says whether a file checked before has changed since.

One check and one message for all of them, so the user reads the same line
whichever way a model arrives. The margin leaves room for what the sizes do
not count (file system overhead, the index, the logs, other programs writing
meanwhile): a disk filled to the last byte breaks more than SpecChat.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specchat.library.errors import LibraryError
from specchat.library.units import size_text

MARGIN = 0.05  # of the bytes needed, kept free on top of them


class NotEnoughSpace(LibraryError):
    """The work would not fit on the disk; nothing was started."""


def stamp(path: Path) -> tuple[int, int, int] | None:
    """(size, mtime in ns, inode) of a file, None if it cannot be asked: the
    key under which the library remembers a check of the file (a file
    replaced or rewritten gets another stamp)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def check_free_space(folder: Path, needed: int, doing: str, shown: Path | None = None) -> None:
    """Refuse ``doing`` (e.g. "importing /their/folder", "hf:org/repo") if
    ``needed`` bytes and the margin do not fit on the disk holding ``folder``;
    the message names ``shown`` instead when ``folder`` is a work folder the
    user never sees (it must be on the same disk). A disk that cannot be
    asked is not refused: the write itself then says what went wrong."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free >= needed * (1 + MARGIN):
        return
    raise NotEnoughSpace(
        f"Not enough disk space for {doing}: it needs {size_text(needed)} "
        f"(plus {MARGIN:.0%} to spare) and the disk holding {shown or folder} has "
        f"{size_text(free)} free. Free some space (`specchat models rm NAME` removes a "
        "model) and try again.")
