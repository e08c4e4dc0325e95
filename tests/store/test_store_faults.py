"""The history when something else is wrong: another program holds its lock,
the file cannot be opened, it is a newer version's, or a settings row is
bad. Real files, real second processes holding real SQLite locks."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from lockholder import hold_lock, newer_history
from smalldisk import fill
from specchat import values
from specchat.store import db, recovery, worker
from specchat.store.conversations import ChatContent, MessageContent
from specchat.store.settings import AppSettings, SettingsStore
from specchat.store.worker import HistoryNotSaved, StoreWorker

FAST = 0.2  # seconds: the busy timeout in these tests (5 s in the app)


@pytest.fixture
def fast_busy(monkeypatch):
    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", FAST)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def rows(path) -> list[tuple]:
    with sqlite3.connect(path) as other:
        return other.execute("SELECT role, content, complete FROM messages ORDER BY position"
                             ).fetchall()


def spin_until(loop, cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        loop.run_until_complete(asyncio.sleep(0.02))


# -- 1. no lost turns --------------------------------------------------------

def test_writes_wait_out_a_lock_longer_than_the_busy_timeout_in_order(tmp_path, fast_busy,
                                                                      loop):
    """Another process holds the write lock for many busy timeouts. The
    turn's writes (its user and reply rows, then the reply's streamed saves,
    each naming the row by the id it was made with) wait, say so, and land
    in order once the lock clears. Before, each failed with "database is
    locked" after the timeout and the turn was gone."""
    path = tmp_path / "h.sqlite3"
    waits: list[bool] = []
    w = StoreWorker(path, on_waiting=waits.append)
    conv = w.conversations.blocking.create("chat")
    remote = w.conversations
    with hold_lock(path) as holder:
        reply = MessageContent("assistant", "", complete=False)
        turn = remote.save(ChatContent(conv.id, "chat", [MessageContent("user", "hello"), reply]))
        saves = [remote.update_message(reply.id, "partial " * i, complete=False)
                 for i in range(1, 4)]
        final = remote.update_message(reply.id, "the whole reply", complete=True)
        spin_until(loop, lambda: waits == [True])
        time.sleep(4 * FAST)  # several busy timeouts: nothing gave up
        spin_until(loop, lambda: True)
        assert w.waiting and not turn.done() and not final.done()
        assert rows(path) == []
        holder.release()
        spin_until(loop, final.done)
    assert not any(f.exception() for f in [turn, *saves, final])
    assert waits == [True, False] and not w.waiting
    assert rows(path) == [("user", "hello", 1), ("assistant", "the whole reply", 1)]
    w.close()


def test_closing_gives_up_on_a_lock_after_a_while_and_logs_the_loss(tmp_path, fast_busy,
                                                                     monkeypatch, loop,
                                                                     records):
    """Quitting must not hang on someone else's lock: after CLOSE_WAIT_S the
    queued writes fail at once and the loss is logged."""
    monkeypatch.setattr(worker, "CLOSE_WAIT_S", 0.5)
    path = tmp_path / "h.sqlite3"
    w = StoreWorker(path)
    conv = w.conversations.blocking.create("chat")
    with hold_lock(path):
        writes = [w.conversations.add_message(conv.id, "user", f"m{i}") for i in range(30)]
        start = time.monotonic()
        w.close()
        took = time.monotonic() - start
    assert took < 5  # 0.5 s + one busy timeout, generous for a loaded 2-core box
    spin_until(loop, lambda: all(f.done() for f in writes))
    assert all(db.is_busy(f.exception()) for f in writes)
    assert any("30 change(s) to the history were not saved" in r for r in records)


def test_add_message_is_all_or_nothing_under_a_lock(tmp_path, fast_busy):
    """A busy add_message did nothing, so trying it again adds one row."""
    path = tmp_path / "h.sqlite3"
    conn = db.connect(path)
    from specchat.store.conversations import ConversationStore

    store = ConversationStore(conn)
    conv = store.create("chat")
    with hold_lock(path):
        with pytest.raises(sqlite3.OperationalError) as failed:
            store.add_message(conv.id, "user", "hi")
        assert db.is_busy(failed.value) and not conn.in_transaction
    store.add_message(conv.id, "user", "hi")
    assert rows(path) == [("user", "hi", 1)]
    conn.close()


# -- 2. bad settings ---------------------------------------------------------

BAD_SETTINGS = {"speculative": "yes", "temperature": "hot", "top_p": float("nan"),
                "top_k": [40], "max_tokens": 0, "k": 99, "color_tokens": 1,
                "system_prompt": "Be brief.", "seed": 7, "last_target": "hf:some/model"}


def test_bad_settings_fields_take_their_defaults_and_are_named(tmp_path):
    conn = db.connect(tmp_path / "s.sqlite3")
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)",
                 (json.dumps(BAD_SETTINGS),))
    settings, bad = SettingsStore(conn).read()
    default = AppSettings()
    assert settings == AppSettings(system_prompt="Be brief.", seed=7,
                                   last_target="hf:some/model")
    assert (settings.temperature, settings.speculative, settings.k) == (
        default.temperature, default.speculative, default.k)
    assert sorted(bad) == sorted(["speculative", "temperature", "top-p", "top-k", "max tokens",
                                  "K", "color tokens"])
    for row, named in (("not json", ["all settings"]), ("[1, 2]", ["all settings"]),
                       ('{"temperature": 0.7, "top_k": 40}', [])):
        conn.execute("UPDATE settings SET value=? WHERE key='app'", (row,))
        assert SettingsStore(conn).read()[1] == named
    assert SettingsStore(conn).load().temperature == 0.7
    conn.close()


# -- 3. a history that cannot be opened ---------------------------------------

def test_a_history_locked_at_open_is_unavailable_then_retry_opens_it(tmp_path, fast_busy,
                                                                     loop, records):
    """A second process holds an exclusive lock on the file while SpecChat
    starts: the worker starts anyway, reads an empty history, refuses writes
    in words, and reopen() gets the real file once the lock is gone."""
    path = tmp_path / "h.sqlite3"
    db.connect(path).close()
    with hold_lock(path, "EXCLUSIVE", journal="DELETE"):
        w = StoreWorker(path)
        assert w.state == worker.UNAVAILABLE and not w.saving
        assert "could not be opened: another program has it locked" in w.problem
        assert w.conversations.blocking.list() == []
        with pytest.raises(HistoryNotSaved, match="another program has it locked"):
            w.conversations.blocking.create("lost?")
        assert not loop.run_until_complete(asyncio.wrap_future(w.reopen()))
    assert loop.run_until_complete(asyncio.wrap_future(w.reopen()))
    assert w.saving and w.problem is None
    w.conversations.blocking.create("saved")
    w.close()
    again = StoreWorker(path)
    assert [c.title for c in again.conversations.blocking.list()] == ["saved"]
    again.close()
    assert any("another program has it locked" in r for r in records)


@pytest.mark.parametrize("case", ["folder", "fifo", "wrong layout", "tables of another app"])
def test_a_history_that_cannot_be_opened_says_why(tmp_path, case, records):
    path = tmp_path / "h.sqlite3"
    if case == "folder":
        path.mkdir()
        why = "a folder is in its place"
    elif case == "fifo":  # was "disk I/O error"
        os.mkfifo(path)
        why = "a FIFO (named pipe) is in its place"
    elif case == "wrong layout":
        with sqlite3.connect(path) as other:
            other.executescript("CREATE TABLE conversations(id INTEGER PRIMARY KEY, title TEXT);"
                                "CREATE TABLE messages(id INTEGER PRIMARY KEY);"
                                "CREATE TABLE settings(key TEXT, value TEXT);"
                                "PRAGMA user_version=1;")
        why = "not laid out as SpecChat's history (the conversations table lacks"
    else:
        with sqlite3.connect(path) as other:
            other.execute("CREATE TABLE conversations(x)")
        why = ("not laid out as SpecChat's history (it already has a conversations table"
               " that SpecChat did not make)")
    before = _snapshot(path)
    with pytest.raises(db.HistoryUnavailable) as failed:
        db.open_history(path)
    assert why in str(failed.value) and str(path) in str(failed.value)
    assert "\n" not in str(failed.value)
    assert _snapshot(path) == before  # left as it is, for the user to look at
    assert any(why in r for r in records)
    w = StoreWorker(path)
    assert w.state == worker.UNAVAILABLE and why in w.problem
    w.close()


def _snapshot(path):
    if path.is_dir():
        return sorted(p.name for p in path.iterdir())
    if path.is_fifo():  # never opened: it would wait for a writer
        return "fifo", path.stat().st_mtime_ns
    return path.read_bytes(), path.stat().st_mtime_ns


def test_a_full_disk_is_said_in_words(small_disk, records):
    """A real full disk: a tiny tmpfs (tests/smalldisk.py), filled up."""
    # Room for a new history once the filler goes: its file, WAL and shared
    # memory (text ids have an index each, 2 pages beyond 64k).
    mnt = small_disk("96k")
    fill(mnt)
    with pytest.raises(db.HistoryUnavailable, match="the disk is full"):
        db.open_history(mnt / "h.sqlite3")
    (mnt / "filler").unlink()  # room again: opening works
    db.open_history(mnt / "h.sqlite3").conn.close()
    assert any("the disk is full" in r for r in records)


def test_a_newer_versions_history_is_read_only_and_never_written(tmp_path, loop, records):
    path = tmp_path / "h.sqlite3"
    newer_history(path, 'from the future', versions_ahead=5)
    before = _snapshot(path)
    w = StoreWorker(path)
    assert w.state == worker.READ_ONLY and not w.saving
    assert "newer version of SpecChat" in w.problem and "read-only" in w.problem
    assert [c.title for c in w.conversations.blocking.list()] == ["from the future"]
    with pytest.raises(HistoryNotSaved, match="newer version"):
        w.conversations.blocking.create("new")
    with pytest.raises(HistoryNotSaved):
        w.settings.blocking.save(AppSettings())
    w.close()
    assert _snapshot(path) == before
    assert any("newer version of SpecChat" in r for r in records)


# -- 4. follow-ups: no busy loop, huge numbers, recovery files ---------------

def test_a_lock_that_answers_at_once_is_retried_with_a_pause(tmp_path, monkeypatch, loop):
    """Some busy answers come back without SQLite's busy handler waiting
    (SQLITE_LOCKED, a busy timeout of 0, as at close). The retry loop pauses
    between attempts instead of spinning a core: over a second of lock, a
    handful of attempts. Before, thousands (a tight loop on the store thread)."""
    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.0)  # every busy answer is immediate
    attempts: list[str] = []
    real_connect = db.connect

    def traced(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        conn.set_trace_callback(lambda sql: attempts.append(sql) if sql == "BEGIN IMMEDIATE"
                                else None)
        return conn

    monkeypatch.setattr(db, "connect", traced)
    path = tmp_path / "h.sqlite3"
    w = StoreWorker(path)
    conv = w.conversations.blocking.create("chat")
    with hold_lock(path) as holder:
        added = w.conversations.add_message(conv.id, "user", "hello")
        spin_until(loop, lambda: w.waiting)
        time.sleep(1.0)
        during = len(attempts)
        holder.release()
        spin_until(loop, added.done)
    assert added.exception() is None and rows(path) == [("user", "hello", 1)]
    # ~20 at a 50 ms pause; far below what a spinning loop does in 1 s
    assert 2 <= during <= 1.0 / worker.RETRY_PAUSE_S * 2, during
    w.close()


def test_a_huge_number_in_a_stored_setting_takes_its_default(tmp_path):
    """A 400-digit integer overflowed math.isfinite: OverflowError escaped
    from_stored and the app could not start. Now it is out of range."""
    huge = 10 ** 400
    for name in ("temperature", "top-p", "top-k", "K", "max tokens"):
        with pytest.raises(values.BadValue, match=f"^{name} must be .*got 1000"):
            values.check(name, huge)
    with pytest.raises(values.BadValue, match="got a number too long to show"):
        values.check("temperature", 10 ** 5000)
    conn = db.connect(tmp_path / "s.sqlite3")
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)", (json.dumps(
        {"temperature": huge, "top_p": -huge, "k": huge, "max_tokens": 5}),))
    settings, bad = SettingsStore(conn).read()
    assert settings == AppSettings(max_tokens=5)
    assert sorted(bad) == ["K", "temperature", "top-p"]
    conn.close()


def unsaved_chat(cid=None, title="Kept at quit") -> recovery.UnsavedConversation:
    return recovery.UnsavedConversation(cid, title, [
        recovery.UnsavedMessage("user", "question"),
        recovery.UnsavedMessage("assistant", "partial answer", [("draft", "partial "),
                                                                ("target", "answer")],
                                None, None, complete=False)], "hf:t/model", None)


def test_a_recovery_file_is_imported_once_the_history_can_be_written(tmp_path, fast_busy,
                                                                     records):
    """A recovery file waits until a start that can write the history: while
    another program holds the write lock the import fails and the file stays;
    the next start imports it (a known conversation gets its messages back,
    an unknown one is added) and only then deletes it."""
    path = tmp_path / "h.sqlite3"
    w = StoreWorker(path)
    known = w.conversations.blocking.create("Known")
    w.conversations.blocking.add_message(known.id, "user", "stale")
    w.close()
    folder = recovery.folder_for(path)
    kept = recovery.write(folder, [unsaved_chat(known.id, "Known"), unsaved_chat()])
    assert kept.parent == tmp_path / "unsaved" and [p.name for p in folder.iterdir()] == [
        kept.name]  # no temporary file left beside it
    with hold_lock(path):
        w = StoreWorker(path)
        assert w.saving and w.recovered == 0 and kept.exists()
        w.close()
    assert any("could not be added to the history yet" in r for r in records)
    w = StoreWorker(path)
    assert w.recovered == 2 and not kept.exists()
    assert w.notice == "Recovered 2 conversation(s) that could not be saved last time."
    titles = [c.title for c in w.conversations.blocking.list()]
    assert sorted(titles) == ["Kept at quit", "Known"]
    for conv in w.conversations.blocking.list():
        msgs = w.conversations.blocking.messages(conv.id)
        assert [(m.role, m.content, m.complete) for m in msgs] == [
            ("user", "question", True), ("assistant", "partial answer", False)]
        assert msgs[1].runs == [("draft", "partial "), ("target", "answer")]
    w.close()
    again = StoreWorker(path)  # imported once only
    assert again.recovered == 0 and len(again.conversations.blocking.list()) == 2
    again.close()


# Run in a child: the moment the temporary file is complete and about to be
# renamed into place, the process dies (os._exit, as a kill or power cut would
# end it), leaving the temporary file behind.
_CRASH_AT_RENAME = """
import os, sys
from pathlib import Path
from specchat.store import recovery
from specchat.store.conversations import ChatContent
sys.addaudithook(lambda event, args: os._exit(9) if event == "os.rename" else None)
recovery.write(Path(sys.argv[1]), [ChatContent("c1", "Kept at quit", [])])
"""


def test_a_recovery_write_cut_off_at_its_rename_leaves_nothing_to_import(tmp_path, records):
    """A process that dies while writing a recovery file leaves only its
    temporary file, which the next start neither imports nor sets aside as
    unreadable: it is no recovery file (the writer names it so that no
    ``*.json`` glob takes it)."""
    path = tmp_path / "h.sqlite3"
    folder = recovery.folder_for(path)
    proc = subprocess.run([sys.executable, "-c", _CRASH_AT_RENAME, str(folder)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    left = [p.name for p in folder.iterdir()]
    assert len(left) == 1 and left[0].startswith(".") and left[0].endswith(".tmp")
    assert recovery.pending(folder) == []
    w = StoreWorker(path)
    assert w.saving and w.recovered == 0 and w.notice is None
    assert w.conversations.blocking.list() == []
    w.close()
    assert [p.name for p in folder.iterdir()] == left and records == []


def test_an_unreadable_recovery_file_is_set_aside(tmp_path, records):
    path = tmp_path / "h.sqlite3"
    folder = recovery.folder_for(path)
    folder.mkdir(parents=True)
    (folder / "20240101-000000-1.json").write_text("{not json", encoding="utf-8")
    w = StoreWorker(path)
    assert w.saving and w.recovered == 0 and w.notice is None
    assert [p.name for p in folder.iterdir()] == ["20240101-000000-1.json.unreadable"]
    w.close()
    assert any("could not be read" in r for r in records)
