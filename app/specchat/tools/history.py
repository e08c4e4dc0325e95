"""The person's history, read by the terminal tools (the draft
recommendation's prompts, a head's training text) without writing to it."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from contextlib import closing
from typing import TypeVar

from specchat.store import db
from specchat.store.conversations import ConversationStore

T = TypeVar("T")


def read_history(use: Callable[[ConversationStore], T], instead: str) -> T | None:
    """``use`` on the history opened read-only; None when there is none yet,
    or it cannot be read (a note on stderr then says so, and what is used
    ``instead``)."""
    path = db.default_path()
    if not path.is_file():
        return None
    try:
        with closing(db.connect_read_only(path)) as conn:
            return use(ConversationStore(conn))
    except sqlite3.Error as exc:
        print(f"note: your history could not be read ({exc}); {instead}", file=sys.stderr)
        return None
