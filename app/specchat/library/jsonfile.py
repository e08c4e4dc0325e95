"""The library's small JSON files (the index, the records of checked files):
written whole or not at all, read back as a dict or as nothing.

Why one place: a file replaced in one ``os.replace`` is never seen half
written, by another process or after a kill, and a record that is missing
or garbage is simply absent (it is only a cache of checks done before). A
record file is read as ``specchat.records`` reads every file: only a regular
file (a FIFO in its place would block forever) of at most
``MAX_RECORD_BYTES``; JSON too deep to parse is garbage like any other.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from specchat import records

# The records of checked files and measurements are a few KB; a file far past
# that is not one SpecChat wrote.
MAX_RECORD_BYTES = 16 * 2**20


def write(path: Path, data: object, indent: int | None = 2) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(data, indent=indent, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: Path) -> dict:
    """A record file's dict; {} when it is missing, unreadable or not a dict."""
    try:
        data = records.read_json(path, MAX_RECORD_BYTES)
    except (OSError, records.BadRecord):
        return {}
    return data if isinstance(data, dict) else {}
