"""The SQLite file behind conversations and settings.

One file under the library's home (``SPECCHAT_HOME`` honoured), opened in WAL
mode: a reply is written while it streams, and WAL keeps those frequent small
commits cheap and never leaves a half-written page if the app is killed.
In the app the connection belongs to the store's own thread (worker.py):
even a few rows can wait on an fsync, which the GUI thread must not.
"""

from __future__ import annotations

import sqlite3
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
    from specchat.library import paths

    return paths.home() / FILENAME


def connect(path: str | Path | None = None) -> sqlite3.Connection:
    """Open (creating and migrating if needed) the store database."""
    path = Path(path) if path is not None else default_path()
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None)  # autocommit; explicit BEGIN
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: durable against an app crash or kill (what we care
    # about), and only a power cut can lose the last commits.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    # Another process holding the file (a backup, a second instance) is waited
    # out on the store thread, not failed at once.
    conn.execute("PRAGMA busy_timeout=5000")
    _migrate(conn)
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for i, script in enumerate(_MIGRATIONS[version:], start=version + 1):
        conn.executescript("BEGIN;" + script + f"PRAGMA user_version={i}; COMMIT;")
