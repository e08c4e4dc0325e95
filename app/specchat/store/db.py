"""The SQLite file behind conversations and settings.

One file under the library's home (``SPECCHAT_HOME`` honoured), opened in WAL
mode: a reply is written while it streams, and WAL keeps those frequent small
commits cheap and never leaves a half-written page if the app is killed.
In the app the connection belongs to the store's own thread (worker.py):
even a few rows can wait on an fsync, which the GUI thread must not.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

FILENAME = "conversations.sqlite3"

# Each entry upgrades the schema by one version (PRAGMA user_version).
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        target TEXT,
        draft TEXT
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL DEFAULT '',
        runs TEXT,
        summary TEXT,
        error TEXT,
        complete INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
)


def default_path() -> Path:
    from specchat.home import home

    return home() / FILENAME


def connect(path: str | Path | None = None) -> sqlite3.Connection:
    """Open (creating and migrating if needed) the store database."""
    path = Path(path) if path is not None else default_path()
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None)  # autocommit; explicit BEGIN
    try:
        conn.row_factory = sqlite3.Row
        # First, so that even switching to WAL waits out another process
        # holding the file (a backup, a second instance) instead of failing;
        # the waiting happens on the store thread.
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: durable against an app crash or kill (what we
        # care about), and only a power cut can lose the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


# SQLITE_CORRUPT, SQLITE_NOTADB: the file is there but is not a database
# SQLite can read (as opposed to one that is busy or on a full disk).
_UNREADABLE = {11, 26}


def connect_or_set_aside(path: str | Path | None = None) -> tuple[sqlite3.Connection, str | None]:
    """Open the store; if SQLite cannot read the file, move it aside (with
    its WAL) and start an empty one. Why: the app must still open, and a
    damaged history must stay on disk for whoever wants to recover it.
    Returns the connection and, if a file was moved, a message for people."""
    path = Path(path) if path is not None else default_path()
    try:
        return connect(path), None
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) not in _UNREADABLE or str(path) == ":memory:":
            raise
        reason = str(exc)
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.rename(f"{aside}{suffix}")
    return connect(path), (
        f"Your conversation history could not be read ({reason}). The file was kept as "
        f"{aside} and a new, empty history was started.")


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for i, script in enumerate(_MIGRATIONS[version:], start=version + 1):
        conn.executescript("BEGIN;" + script + f"PRAGMA user_version={i}; COMMIT;")
