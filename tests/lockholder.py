"""Another process holding the history file's lock, as a backup tool, a
sync client or a second SpecChat would: a real subprocess with its own
SQLite connection, so the lock is the operating system's, not this
process's. Shared by the store and UI tests."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

HOLDER = r"""
import sqlite3, sys
path, how, journal = sys.argv[1:4]
conn = sqlite3.connect(path, isolation_level=None)
if journal:
    conn.execute(f"PRAGMA journal_mode={journal}")
conn.execute(f"BEGIN {how}")
if how == "EXCLUSIVE":
    # A write inside the transaction: in rollback-journal mode this keeps the
    # exclusive lock, so nobody can even read the file.
    conn.execute("PRAGMA user_version=0")
    conn.execute("CREATE TABLE IF NOT EXISTS holder_scratch(x)")
print("locked", flush=True)
sys.stdin.read()  # until the test lets go (closes stdin) or kills this process
conn.execute("ROLLBACK")
"""


class LockHolder:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def release(self) -> None:
        """Let go of the lock and wait for the process to end."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@contextmanager
def hold_lock(path: Path, how: str = "IMMEDIATE", journal: str = ""):
    """Hold ``path``'s write lock (``IMMEDIATE``) or its exclusive lock
    (``EXCLUSIVE``, with ``journal="DELETE"`` for a file nobody can read)
    in a subprocess until the block ends or ``release()`` is called."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), how, journal],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "locked", f"the lock holder did not start: {line!r}"
        holder = LockHolder(proc)
        yield holder
        holder.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()


def newer_history(path: Path, title: str, versions_ahead: int = 1) -> None:
    """A history file as a newer SpecChat leaves it: one conversation and a
    schema version this app does not know (shared by the store and UI tests
    of read-only opening)."""
    from specchat.store import db

    conn = db.connect(path)
    conn.execute("INSERT INTO conversations(title, created_at, updated_at) VALUES (?, 0, 0)",
                 (title,))
    conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION + versions_ahead}")
    conn.close()
