"""Conversations that could not be written before SpecChat quit, kept in a
file until the history takes them.

Why: at quit another program may still hold the history's lock (quitting
waits only ``worker.CLOSE_WAIT_S`` for it), the history may never have
opened, or a write may have failed (a full disk). Whatever was on screen and
may not be in the history is then written as JSON to
``<history folder>/unsaved/<time>-<pid>-<random>.json`` (two windows may
quit in the same second): atomically (``records.write_json``: a temporary
file renamed into place), so a crash leaves a whole file or none. The next start
that opens the history for writing imports each file in one transaction and
deletes it only once that committed: a crash in between imports it again
instead of losing it. Two starts at once (two windows) never both import one
file: each takes the file's lock first (``claimed``), without waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specchat import records
from specchat.store.conversations import ChatContent, MessageContent, new_id
from specchat.store.summary import ReplySummary

FOLDER = "unsaved"
VERSION = 1
# What was on screen when the app quit: far below this; more is not ours.
MAX_BYTES = 256 * 2**20

log = logging.getLogger("specchat.store")


# A message and a conversation as they were on screen: the same records the
# window saves. The import replaces the messages of a conversation the
# history has with these (the screen was the newest state) and adds the
# others under their ids.
UnsavedMessage = MessageContent
UnsavedConversation = ChatContent


class Unreadable(ValueError):
    """A recovery file that is not one this version wrote."""


def folder_for(history: Path) -> Path:
    return history.parent / FOLDER


def write(folder: Path, conversations: list[UnsavedConversation]) -> Path:
    """Write one recovery file; its path. OSError if it cannot be written."""
    data = {"version": VERSION, "saved_at": time.time(),
            "conversations": [_to_json(c) for c in conversations]}
    path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}.json"
    records.write_json(path, data, ensure_ascii=False)
    return path


def pending(folder: Path) -> list[Path]:
    """The recovery files waiting to be imported, oldest first."""
    return sorted(folder.glob("*.json"))  # none if there is no folder


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Whether this process is the one to import ``path`` now, holding the
    file's ``flock`` (taken without waiting) for the block: False when
    another process starting at the same time is importing it, or has
    imported and deleted it already. Without this both imported it, the
    second over what the first's window had written since, and the second
    then said it could not delete it."""
    try:  # non-blocking: a FIFO in its place must not stall the start
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False  # another start imported it
        return
    except OSError:
        yield True  # not ours to lock: reading it says what is wrong, as before
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = os.fstat(fd).st_nlink > 0  # not deleted while we opened it
        except BlockingIOError:
            mine = False  # another start is importing it
        except OSError:
            mine = True  # no flock here: import it as before
        yield mine
    finally:
        os.close(fd)


def read(path: Path) -> list[UnsavedConversation]:
    """The conversations of one recovery file, or ``Unreadable``: for anything
    but a regular file of at most ``MAX_BYTES`` (a FIFO in the folder would
    block the start forever) or a file this version did not write."""
    try:
        data = records.read_json(path, MAX_BYTES)
        if data.get("version") != VERSION:
            raise Unreadable(f"version {data.get('version')!r}")
        return [_from_json(c) for c in data["conversations"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # BadRecord: a ValueError
        raise Unreadable(str(exc)) from exc


def _to_json(c: UnsavedConversation) -> dict[str, Any]:
    data = asdict(c)
    data["messages"] = [{**asdict(m), "summary": m.summary.to_json() if m.summary else None}
                        for m in c.messages]
    return data


def _from_json(data: dict[str, Any]) -> UnsavedConversation:
    messages = [UnsavedMessage(str(m["role"]), str(m["content"]),
                               [(str(o), str(t)) for o, t in m.get("runs") or []],
                               ReplySummary.from_json(m["summary"]) if m.get("summary") else None,
                               m.get("error"), bool(m.get("complete", True)),
                               _id(m.get("id")) or new_id(), str(m.get("reasoning") or ""),
                               [(str(o), str(t)) for o, t in m.get("reasoning_runs") or []])
                for m in data["messages"]]
    # An older version's chat that had no row yet had no id either.
    return UnsavedConversation(_id(data.get("id")) or new_id(), str(data["title"]), messages,
                               data.get("target"), data.get("draft"),
                               str(data.get("reasoning_effort") or ""))


def _id(value: object) -> str | None:
    """An id as this version keeps it: text (older files have integers)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return str(value)
