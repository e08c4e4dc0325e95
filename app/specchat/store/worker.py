"""The one thread that talks to the database, so the GUI thread never does.

Why: a write can wait on the disk. SQLite fsyncs the WAL (and its folder)
when the first write of a session starts it, and again at each checkpoint;
on a busy disk one such wait took 250-380 ms, and on the GUI thread that
froze the window early in a reply. So the window hands every store call to
this thread and awaits the result, or lets a write go on without waiting.
One thread in FIFO order keeps the guarantees the stores had on one
connection: a read queued after a write sees it, and closing drains the
queue, so a normal quit loses nothing that was queued. A kill loses at most
the writes still queued, which is the last moment of a reply.

Another program may hold the file's write lock for longer than SQLite's
busy timeout (a backup, a sync tool, a second instance). Then the call at
the head of the queue is tried again until the lock clears, and every call
behind it waits its turn, so nothing is lost and nothing is reordered;
``on_waiting`` tells the window while that lasts. The window never waits
for a row's id: it makes ids itself (conversations.new_id). Only closing
stops the retrying, after ``CLOSE_WAIT_S``: quitting must not hang on
someone else's lock.

The history may also not open at all (locked, disk full, a folder in its
place, a layout this version does not know) or be a newer version's file.
The worker still starts: the stores then read an empty in-memory history
(or the newer file, read-only), writes fail with ``HistoryNotSaved``, and
``reopen`` tries the file again.

Whatever could still not be written when the app quits is the window's to
keep (recovery.py); each time the history opens for writing, the worker
imports what an earlier session kept that way.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

from specchat.errors import SpecChatError
from specchat.store import db, recovery
from specchat.store.conversations import ConversationStore
from specchat.store.settings import SettingsStore

T = TypeVar("T")

# At close, how long the queued writes may still wait for another program's
# lock (in all) before they are given up and logged as lost.
CLOSE_WAIT_S = 5.0

# Between two attempts of a call while the file is locked. SQLite's busy
# handler usually waits already, but some busy answers (SQLITE_LOCKED, a
# busy timeout of 0 at close) come back at once: without a pause the store's
# thread would spin a core until the lock clears.
RETRY_PAUSE_S = 0.05

# The store methods that only read: their failures lose nothing.
_READS = frozenset({"get", "list", "messages", "export_markdown", "load", "read"})

SAVING, READ_ONLY, UNAVAILABLE = "saving", "read-only", "unavailable"

log = logging.getLogger("specchat.store")


class HistoryNotSaved(SpecChatError):
    """A write while the history can only be read (a newer version's file,
    or none could be opened); the message says why."""


class StoreWorker:
    """Owns the connection; runs calls on it one at a time, in order."""

    def __init__(self, path: str | Path | None = None,
                 on_waiting: Callable[[bool], None] | None = None):
        """``on_waiting(True/False)`` is called on this worker's thread when
        a call starts and stops waiting for another program's lock."""
        self._path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specchat-store")
        self._closed = False
        self._close_by: float | None = None
        self._lost = 0
        self.failed_writes = 0  # calls that change the history and failed
        self.recovered = 0  # conversations imported from recovery files at the last opening
        self._waiting = False
        self._on_waiting = on_waiting
        self._conn: sqlite3.Connection | None = None
        self._stores: dict[type, Any] = {}
        self.state = UNAVAILABLE
        self.problem: str | None = None  # why nothing is saved (read-only or unavailable)
        self.notice: str | None = None  # an unreadable history moved aside, conversations recovered
        # Opened on the worker so the connection belongs to it (sqlite3
        # refuses use from other threads); waiting here is start-up time.
        self._pool.submit(self._open).result()
        self.conversations: Remote[ConversationStore] = Remote(ConversationStore, self)
        self.settings: Remote[SettingsStore] = Remote(SettingsStore, self)

    @property
    def saving(self) -> bool:
        """Writes reach the history file (it opened, and may be written)."""
        return self.state == SAVING

    @property
    def waiting(self) -> bool:
        """A write is waiting for another program's lock."""
        return self._waiting

    # -- opening ---------------------------------------------------------------
    def reopen(self) -> Future:
        """Try the history file again (after it could not be opened); the
        future gives whether it is now saving."""
        return self.submit(self._open)

    def _open(self) -> bool:
        try:
            opened = db.open_history(self._path)
        except db.HistoryUnavailable as exc:
            self.problem = str(exc)
            if self._conn is None:
                self._use(db.placeholder(), UNAVAILABLE)
            return False
        old = self._conn
        self._use(opened.conn, SAVING if opened.writable else READ_ONLY)
        if old is not None:
            old.close()
        self.problem = None if opened.writable else opened.notice
        self.notice = opened.notice if opened.writable else None
        if opened.writable:
            self._import_unsaved()
        return opened.writable

    @property
    def recovery_folder(self) -> Path | None:
        """Where conversations that could not be saved are kept until the
        history takes them (beside the history file)."""
        path = Path(self._path) if self._path is not None else db.default_path()
        return None if str(path) == ":memory:" else recovery.folder_for(path)

    def _import_unsaved(self) -> None:
        """Write what an earlier session kept in recovery files; each file is
        deleted only once its conversations are committed. A file that
        cannot be imported now (locked, disk full) stays for the next time."""
        self.recovered = 0
        folder = self.recovery_folder
        for path in recovery.pending(folder) if folder is not None else []:
            with recovery.claimed(path) as mine:
                if mine:
                    self._import_file(path)
        if self.recovered:
            recovered = (f"Recovered {self.recovered} conversation(s) that could not be saved "
                         "last time.")
            self.notice = f"{self.notice} {recovered}" if self.notice else recovered

    def _import_file(self, path: Path) -> None:
        """Import one recovery file this process holds the lock of."""
        try:
            conversations = recovery.read(path)
            self._stores[ConversationStore].restore(conversations)
        except recovery.Unreadable as exc:
            aside = path.with_name(path.name + ".unreadable")
            log.error("The recovery file %s could not be read (%s); kept as %s.",
                      path, exc, aside)
            path.rename(aside)
            return
        except (sqlite3.Error, OSError) as exc:
            log.error("The recovery file %s could not be added to the history yet (%s); "
                      "it is kept and tried again at the next start.", path, exc)
            return
        try:
            path.unlink()
        except OSError as exc:
            log.error("The recovery file %s was added to the history but could not be "
                      "deleted (%s): delete it, or it is added again.", path, exc)
        self.recovered += len(conversations)
        log.warning("Recovered %d conversation(s) from %s.", len(conversations), path)

    def _use(self, conn: sqlite3.Connection, state: str) -> None:
        self._conn = conn
        self.state = state
        self._stores = {ConversationStore: ConversationStore(conn),
                        SettingsStore: SettingsStore(conn)}

    # -- calls -----------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Queue ``fn(*args, **kwargs)``; once closed, fails as a closed
        sqlite3 connection would, so callers handle one kind of error."""
        if self._closed:
            failed: Future = Future()
            failed.set_exception(sqlite3.ProgrammingError("The conversation store is closed."))
            return failed
        return self._pool.submit(fn, *args, **kwargs)

    def call(self, kind: type, name: str, args: tuple, kwargs: dict) -> Future:
        """Queue the store method ``kind.name``, retried while the file is locked."""
        return self.submit(self._run, kind, name, args, kwargs)

    def _run(self, kind: type, name: str, args: tuple, kwargs: dict) -> Any:
        try:
            method = getattr(self._stores[kind], name)
            while True:
                try:
                    return method(*args, **kwargs)
                except sqlite3.OperationalError as exc:
                    if db.is_busy(exc) and self._may_wait():
                        self._set_waiting(True)
                        time.sleep(RETRY_PAUSE_S)
                        continue
                    if self._closed and db.is_busy(exc):
                        self._lost += 1
                    if (getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY
                            and not self.saving):
                        raise HistoryNotSaved(self.problem or str(exc)) from exc
                    raise
        except Exception:
            if name not in _READS:
                self.failed_writes += 1
            raise
        finally:
            self._set_waiting(False)

    def _may_wait(self) -> bool:
        if self._close_by is None or time.monotonic() < self._close_by:
            return True
        if self._conn is not None:  # the rest of the queue fails at once
            self._conn.execute("PRAGMA busy_timeout=0")
        return False

    def _set_waiting(self, waiting: bool) -> None:
        if waiting == self._waiting:
            return
        self._waiting = waiting
        if waiting:
            log.warning("Saving is waiting: another program holds the history's lock.")
        if self._on_waiting is not None:
            self._on_waiting(waiting)

    def close(self) -> None:
        """Finish every queued call, then close the connection. Calls still
        waiting for a lock after CLOSE_WAIT_S are given up and logged."""
        if self._closed:
            return
        self._closed = True
        self._close_by = time.monotonic() + CLOSE_WAIT_S
        self._pool.submit(lambda: self._conn.close() if self._conn is not None else None)
        self._pool.shutdown(wait=True)
        if self._lost:
            log.error("%d change(s) to the history were not saved: another program held its "
                      "lock until SpecChat quit.", self._lost)


class Remote(Generic[T]):
    """A store seen from the event loop: each method call runs on the worker
    and returns an asyncio future (``await`` it, or ignore it for a write
    whose failure :func:`report_failure` surfaces). ``blocking`` runs the same
    methods and waits: for start-up, shutdown and tests, never mid-session.
    The store object is looked up when the call runs, so a call queued
    before ``reopen`` and one queued after each reach their own file."""

    def __init__(self, kind: type[T], worker: StoreWorker, wait: bool = False):
        self._kind = kind
        self._worker = worker
        self._wait = wait
        if not wait:
            self.blocking: T = Remote(kind, worker, wait=True)  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not callable(getattr(self._kind, name, None)):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            future = self._worker.call(self._kind, name, args, kwargs)
            return future.result() if self._wait else asyncio.wrap_future(future)

        return call


def report_failure(future: asyncio.Future, report: Callable[[str], None],
                   doing: str) -> asyncio.Future:
    """For a write nobody awaits: say in words what could not be saved."""

    def done(f: asyncio.Future) -> None:
        if not f.cancelled() and (exc := f.exception()) is not None:
            report(f"Could not {doing}: {exc}")

    future.add_done_callback(done)
    return future
