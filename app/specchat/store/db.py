"""The SQLite file behind conversations and settings.

One file under the library's home (``SPECCHAT_HOME`` honoured), opened in WAL
mode: a reply is written while it streams, and WAL keeps those frequent small
commits cheap and never leaves a half-written page if the app is killed.
In the app the connection belongs to the store's own thread (worker.py):
even a few rows can wait on an fsync, which the GUI thread must not.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.errors import SpecChatError
from specchat.home import home

FILENAME = "conversations.sqlite3"

# How long one SQLite call waits for another program's lock before it gives
# up (the worker then retries a write; opening reports the history locked).
# A module constant so tests can shorten it.
BUSY_TIMEOUT_S = 5.0

log = logging.getLogger("specchat.store")


class HistoryUnavailable(SpecChatError):
    """The history file could not be opened; ``str()`` says why, in words."""

# The conversations and their messages. Ids are text, made where a
# conversation or message is made (a UUID, conversations.new_id), so the
# window names its rows before they are written; a row written by hand
# gets a random one.
_CHATS = """
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY NOT NULL DEFAULT (lower(hex(randomblob(16)))),
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        target TEXT,
        draft TEXT
    );
    CREATE TABLE messages (
        id TEXT PRIMARY KEY NOT NULL DEFAULT (lower(hex(randomblob(16)))),
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
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
"""

# Version 3: a reply's reasoning apart from its answer (its text, and the
# origins of its tokens, as ``runs`` are the answer's), and each
# conversation's thinking switch (a reasoning effort word; "" is the model's
# default). Added columns, so every row is kept as it was.
_REASONING = """
    ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
    ALTER TABLE messages ADD COLUMN reasoning_runs TEXT;
    ALTER TABLE conversations ADD COLUMN reasoning_effort TEXT NOT NULL DEFAULT '';
"""

# PRAGMA user_version is the layout's version. A new file gets the newest
# layout at once (entry 0); an older one is upgraded one version at a time
# (entry v takes version v to v + 1).
_MIGRATIONS: tuple[str, ...] = (
    _CHATS + "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);" + _REASONING,
    # 1 -> 2: SQLite's integer ids become text, each its digits ("12"); every
    # row is kept, in its order (the rowid).
    "ALTER TABLE messages RENAME TO old_messages;"
    "ALTER TABLE conversations RENAME TO old_conversations;"
    "DROP INDEX messages_by_conversation;" + _CHATS + """
    INSERT INTO conversations SELECT CAST(id AS TEXT), title, created_at, updated_at, target,
        draft FROM old_conversations ORDER BY id;
    INSERT INTO messages SELECT CAST(id AS TEXT), CAST(conversation_id AS TEXT), position, role,
        content, runs, summary, error, complete, created_at FROM old_messages ORDER BY id;
    DROP TABLE old_messages;
    DROP TABLE old_conversations;
    """,
    # 2 -> 3
    _REASONING,
)
# The layout this version writes (PRAGMA user_version): public, for what
# checks a file's version (the tests leave one a newer SpecChat wrote).
SCHEMA_VERSION = len(_MIGRATIONS)


def default_path() -> Path:
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
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        # Before anything writes (switching to WAL rewrites the header): a
        # newer version's history must be left exactly as it is. One read
        # transaction, so the version and the tables are of one moment (not
        # the tables another process just made, read with the version it
        # had not yet set).
        conn.execute("BEGIN")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise NewerSchema(version)
            _check_before_writing(conn, version)
        finally:
            conn.execute("COMMIT")
        _use_wal(conn)
        # NORMAL in WAL mode: durable against an app crash or kill (what we
        # care about), and only a power cut can lose the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        # Before foreign keys are on: a migration that rebuilds a table must
        # not cascade the old one's deletion into the messages.
        _migrate(conn)
        conn.execute("PRAGMA foreign_keys=ON")
        _check_layout(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL. The switch needs the file to itself for a
    moment, and SQLite answers "database is locked" at once rather than
    waiting (its busy timeout does not cover it): a second process opening
    the history while the first makes it would fail there. So it is tried
    again until the busy timeout has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class NewerSchema(Exception):
    """The file was written by a newer SpecChat (its user_version is higher
    than this version knows): read it, never write it."""

    def __init__(self, version: int):
        super().__init__(f"schema version {version}")
        self.version = version


def connect_read_only(path: str | Path) -> sqlite3.Connection:
    """Open an existing file for reading only: SQLite itself refuses every
    write (mode=ro), and query_only says so again on this connection."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA query_only=ON")
    return conn


def placeholder() -> sqlite3.Connection:
    """An empty, read-only history in memory: what the stores read while the
    real file cannot be opened, so the window lists nothing instead of
    failing on every read."""
    conn = connect(":memory:")
    conn.execute("PRAGMA query_only=ON")
    return conn


# The file is there but is not a database SQLite can read (as opposed to one
# that is busy or on a full disk).
_UNREADABLE = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def is_busy(exc: BaseException) -> bool:
    """Another connection holds the lock this call needed (past the busy
    timeout): the call did nothing and may be tried again."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or (
        isinstance(exc, sqlite3.OperationalError) and "database is locked" in str(exc))


@dataclass
class Opened:
    """A history that opened: its connection, whether it may be written,
    and a message for people if something happened on the way."""

    conn: sqlite3.Connection
    writable: bool = True
    notice: str | None = None


def open_history(path: str | Path | None = None) -> Opened:
    """Open the history for the app, whatever state the file is in.

    A file SQLite cannot read is moved aside (with its WAL) and an empty one
    started: the app must still open, and a damaged history must stay on
    disk for whoever wants to recover it. A newer version's file is opened
    read-only. Anything else (locked, disk full, a folder in its place, a
    layout this version does not know) raises ``HistoryUnavailable`` in
    words; the file is left as it is so that trying again can succeed.
    Every such event is also logged, for people who look for it later."""
    path = Path(path) if path is not None else default_path()
    try:
        return Opened(connect(path))
    except NewerSchema as exc:
        return _read_only(path, exc.version)
    except (sqlite3.Error, OSError) as exc:
        if getattr(exc, "sqlite_errorcode", None) not in _UNREADABLE or str(path) == ":memory:":
            raise _unavailable(path, exc) from exc
        reason = str(exc)
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{path}{suffix}")
            if part.exists():
                part.rename(f"{aside}{suffix}")
        conn = connect(path)
    except (sqlite3.Error, OSError) as exc:
        raise _unavailable(path, exc) from exc
    notice = (f"Your conversation history could not be read ({reason}). The file was kept as "
              f"{aside} and a new, empty history was started.")
    log.warning("%s", notice)
    return Opened(conn, notice=notice)


def _read_only(path: Path, version: int) -> Opened:
    try:
        conn = connect_read_only(path)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except (sqlite3.Error, OSError) as exc:
        raise _unavailable(path, exc) from exc
    notice = (f"Your conversation history ({path}) was written by a newer version of SpecChat "
              f"(schema {version}; this version knows {SCHEMA_VERSION}). It is shown "
              "read-only: new chats and changes are not saved.")
    log.warning("%s", notice)
    return Opened(conn, writable=False, notice=notice)


def _unavailable(path: Path, exc: BaseException) -> HistoryUnavailable:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, WrongLayout):
        why = f"it is not laid out as SpecChat's history ({exc})"
    elif is_busy(exc):
        why = "another program has it locked"
    elif code == sqlite3.SQLITE_FULL or getattr(exc, "errno", None) == errno.ENOSPC:
        why = "the disk is full"
    elif (mode := _mode(path)) is not None and not stat.S_ISREG(mode):
        why = f"{records.file_kind(mode)} is in its place"  # a FIFO was "disk I/O error"
    elif code == sqlite3.SQLITE_CANTOPEN:
        why = "the file cannot be created or opened there"
    else:
        why = str(exc)
    error = HistoryUnavailable(
        f"Your conversation history ({path}) could not be opened: {why}.")
    log.error("%s", error)
    return error


def _mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


class WrongLayout(sqlite3.DatabaseError):
    """The file is a database, but not one with the tables and columns this
    version reads and writes."""


# What the code reads and writes: every later migration keeps these.
_LAYOUT = {
    "conversations": {"id", "title", "created_at", "updated_at", "target", "draft"},
    "messages": {"id", "conversation_id", "position", "role", "content", "runs", "summary",
                 "error", "complete", "created_at"},
    "settings": {"key", "value"},
}
# The columns a version added (its migration's), by the version that has them.
_ADDED = {3: {"conversations": {"reasoning_effort"}, "messages": {"reasoning", "reasoning_runs"}}}


def _check_before_writing(conn: sqlite3.Connection, version: int) -> None:
    """A file that is not SpecChat's history is refused before anything is
    written to it (even the switch to WAL): it may be someone's data."""
    if version > 0:
        _check_layout(conn, version)
        return
    for table in _LAYOUT:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone():
            raise WrongLayout(f"it already has a {table} table that SpecChat did not make")


def _check_layout(conn: sqlite3.Connection, version: int = SCHEMA_VERSION) -> None:
    """The tables and columns a file of ``version`` has (the newest, after migrating)."""
    for table, columns in _LAYOUT.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if not have:
            raise WrongLayout(f"no {table} table")
        wanted = columns.union(*(added.get(table, set()) for v, added in _ADDED.items()
                                 if v <= version))
        missing = sorted(wanted - have)
        if missing:
            raise WrongLayout(f"the {table} table lacks {', '.join(missing)}")


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring the file to the newest layout, once. Two processes opening a
    fresh or older history at once (the app and a terminal, two windows)
    must not both build it: the layout is made in a write transaction
    taken before the version is read again (BEGIN IMMEDIATE, which waits
    out another process's up to the busy timeout), so the second finds the
    first's layout and does nothing, instead of failing on "table
    conversations already exists" or a lock it did not wait for."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return  # the usual case: nothing to write, no write lock taken
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:  # a newer version got here first
            raise NewerSchema(version)
        _check_before_writing(conn, version)
        steps = [(_MIGRATIONS[0], SCHEMA_VERSION)] if version == 0 else [
            (_MIGRATIONS[v], v + 1) for v in range(version, SCHEMA_VERSION)]
        for script, to in steps:
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={to}")
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        _roll_back(conn)
        # A plain SQL error here ("table conversations already exists")
        # means the file holds tables this version did not make.
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_ERROR:
            raise WrongLayout(str(exc)) from exc
        raise
    except BaseException:
        _roll_back(conn)
        raise


def _roll_back(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _statements(script: str) -> list[str]:
    """The statements of a migration script, each whole (a ';' inside a
    string or a trigger does not end one), to run one by one inside the
    caller's transaction: sqlite3's executescript would commit it first."""
    out, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\n;"):
                out.append(pending.strip())
            pending = ""
    if pending.strip(" \t\n;"):
        out.append(pending.strip().removesuffix(";"))
    return out
