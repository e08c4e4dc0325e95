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
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

from specchat.store import db
from specchat.store.conversations import ConversationStore
from specchat.store.settings import SettingsStore

T = TypeVar("T")


class StoreWorker:
    """Owns the connection; runs calls on it one at a time, in order."""

    def __init__(self, path: str | Path | None = None):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specchat-store")
        self._closed = False
        # Opened on the worker so the connection belongs to it (sqlite3
        # refuses use from other threads); waiting here is start-up time.
        conn, notice = self._pool.submit(db.connect_or_set_aside, path).result()
        self.notice: str | None = notice  # set if an unreadable history was moved aside
        self._conn = conn
        self.conversations: Remote[ConversationStore] = Remote(ConversationStore(conn), self)
        self.settings: Remote[SettingsStore] = Remote(SettingsStore(conn), self)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Queue ``fn(*args, **kwargs)``; once closed, fails as a closed
        sqlite3 connection would, so callers handle one kind of error."""
        if self._closed:
            failed: Future = Future()
            failed.set_exception(sqlite3.ProgrammingError("The conversation store is closed."))
            return failed
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Finish every queued call, then close the connection."""
        if self._closed:
            return
        self._closed = True
        self._pool.submit(self._conn.close)
        self._pool.shutdown(wait=True)


class Remote(Generic[T]):
    """A store seen from the event loop: each method call runs on the worker
    and returns an asyncio future (``await`` it, or ignore it for a write
    whose failure :func:`report_failure` surfaces). ``blocking`` runs the same
    methods and waits: for start-up, shutdown and tests, never mid-session."""

    def __init__(self, target: T, worker: StoreWorker):
        self._target = target
        self._worker = worker
        self.blocking: T = _Blocking(target, worker)  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Callable[..., asyncio.Future]:
        method = getattr(self._target, name)

        def call(*args: Any, **kwargs: Any) -> asyncio.Future:
            return asyncio.wrap_future(self._worker.submit(method, *args, **kwargs))

        return call


class _Blocking:
    def __init__(self, target: Any, worker: StoreWorker):
        self._target = target
        self._worker = worker

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._target, name)
        return lambda *args, **kwargs: self._worker.submit(method, *args, **kwargs).result()


def report_failure(future: asyncio.Future, report: Callable[[str], None],
                   doing: str) -> asyncio.Future:
    """For a write nobody awaits: say in words what could not be saved."""

    def done(f: asyncio.Future) -> None:
        if f.cancelled():
            return
        exc = f.exception()
        if exc is not None:
            report(f"Could not {doing}: {exc}")

    future.add_done_callback(done)
    return future
