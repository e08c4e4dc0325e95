"""Conversation history and settings: SQLite under SPECCHAT_HOME, written
while replies stream, read back by a new window."""

from __future__ import annotations

import os
import sqlite3

from ui_support import load, make_window, send_and_wait, wait_until


def stored_rows(path) -> list[tuple]:
    with sqlite3.connect(path) as other:
        return other.execute("SELECT role, content, complete FROM messages "
                             "ORDER BY conversation_id, position").fetchall()


def test_a_locked_database_neither_freezes_the_window_nor_loses_the_turn(
        qtbot, aloop, home, tiny_target, tiny_draft, monkeypatch):
    """Another process holds the file's write lock (a backup tool, a second
    instance) for longer than SQLite's busy timeout. The window keeps
    running, the reply streams to its end, a line says saving is waiting;
    once the lock is released the whole turn is in the file and the line
    goes. Before, the reply waited for its rows, and after the timeout the
    turn was gone even once the lock was released."""
    from lockholder import hold_lock
    from PySide6.QtCore import QTimer
    from specchat.store import db
    from specchat.ui.history_banner import WAITING

    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.2)  # 5 s in the app
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    path = home / "conversations.sqlite3"
    ticks = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start()

    for stop in (False, True):
        with hold_lock(path) as holder:
            before = len(ticks)
            w.composer.edit.setPlainText(f"Locked turn, stop={stop}")
            w.composer.send_button.click()
            if stop:
                w.composer.stop_button.click()
            wait_until(lambda b=before: len(ticks) >= b + 10, timeout=3000)  # the loop runs
            wait_until(lambda: not w.conversation.busy, timeout=60_000)  # not held up
            wait_until(w.history_banner.isVisible, timeout=10_000)
            assert w.history_banner.label.text() == WAITING
            assert not w.history_banner.button.isVisible()
            with sqlite3.connect(path) as other:
                assert other.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2 * stop
            holder.release()
            wait_until(lambda: not w.history_banner.isVisible(), timeout=10_000)

    timer.stop()
    w.session.store.submit(lambda: None).result()  # whatever was queued has run
    assert not w.error_banner.isVisible()
    msgs = w.chat_model.messages
    assert [m.role for m in msgs] == ["user", "assistant"] * 2
    assert msgs[1].text and msgs[1].summary.new_tokens > 0
    assert msgs[3].text == "" and msgs[3].error == "Stopped."  # stopped before its first step
    with sqlite3.connect(path) as other:
        stored = other.execute("SELECT role, content, complete FROM messages ORDER BY position"
                               ).fetchall()
    assert stored == [(m.role, m.text, 1) for m in msgs]
    assert w.conversation.conversation_id is not None
    w.close()


def test_unreadable_history_is_kept_aside_and_the_window_opens(qtbot, aloop, home):
    home.mkdir(parents=True)
    path = home / "conversations.sqlite3"
    junk = b"not a database, perhaps a half-copied file " * 200
    path.write_bytes(junk)
    w = make_window(qtbot, initial_pair=None)
    kept = [p for p in home.iterdir() if p.name.startswith("conversations.sqlite3.unreadable-")]
    assert len(kept) == 1 and kept[0].read_bytes() == junk  # nothing lost
    text = w.error_banner.label.text()
    assert w.error_banner.isVisible() and "could not be read" in text and str(kept[0]) in text
    w.session.store.conversations.blocking.create("works again")
    w.sidebar.refresh()
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    w.close()


def test_history_persisted_and_reloaded(qtbot, aloop, home, tiny_target, tiny_draft):
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=40)
    load(qtbot, w, tiny_target, tiny_draft)
    reply = send_and_wait(qtbot, w, "Remember this conversation")
    cid = w.conversation.conversation_id
    w.close()

    # A new window (and store) on the same SQLite file.
    w2 = make_window(qtbot)
    wait_until(lambda: w2.sidebar.model.items, timeout=5000)
    titles = [c.title for c in w2.sidebar.model.items]
    assert titles == ["Remember this conversation"]
    w2.sidebar.openRequested.emit(cid)
    wait_until(lambda: w2.chat_model.rowCount() == 2, timeout=5000)
    msgs = w2.chat_model.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].text == reply.text and msgs[1].summary.new_tokens == reply.summary.new_tokens
    assert "tok/s" in w2.chat_view.delegate.footer(msgs[1])
    w2.close()


def _start_long_reply(qtbot, target, draft):
    """A window on the tiny pair streaming a reply of up to 1500 tokens."""
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=1500)
    load(qtbot, w, target, draft)
    w.composer.edit.setPlainText("A long reply please")
    w.composer.send_button.click()
    return w


def test_partial_reply_saved_while_streaming(qtbot, aloop, home, tiny_target, tiny_draft):
    w = _start_long_reply(qtbot, tiny_target, tiny_draft)
    path = home / "conversations.sqlite3"

    def saved_partial():
        with sqlite3.connect(path) as other:  # another process could read this too
            row = other.execute("SELECT content, complete FROM messages WHERE role='assistant'"
                                ).fetchone()
        return row is not None and row[0] and row[1] == 0

    wait_until(saved_partial, timeout=30_000)
    assert w.conversation.busy
    w.conversation.stop()
    wait_until(lambda: not w.conversation.busy, timeout=30_000)
    w.session.store.submit(lambda: None).result()  # the final save is queued; wait until it ran
    with sqlite3.connect(path) as other:
        content, complete = other.execute(
            "SELECT content, complete FROM messages WHERE role='assistant'").fetchone()
    assert complete == 1 and content == w.chat_model.messages[-1].text
    w.close()


def test_sidebar_new_rename_delete_search_export(qtbot, aloop, home, tmp_path):
    w = make_window(qtbot)
    store = w.session.conversations.blocking
    a = store.create("First chat")
    store.add_message(a.id, "user", "hello there")
    b = store.create("Second chat")
    store.add_message(b.id, "user", "something else")
    w.sidebar.refresh()
    wait_until(lambda: len(w.sidebar.model.items) == 2, timeout=5000)
    w.sidebar.search.setText("hello")
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    assert w.sidebar.model.items[0].title == "First chat"
    w.sidebar.search.clear()
    wait_until(lambda: len(w.sidebar.model.items) == 2, timeout=5000)
    w.open_conversation(a.id)
    assert w.conversation.busy  # until its messages are read in
    wait_until(lambda: w.chat_model.rowCount() == 1, timeout=5000)
    assert [m.text for m in w.chat_model.messages] == ["hello there"]
    assert not w.conversation.busy
    idx = w.sidebar.model.index(w.sidebar.model.row_of(a.id))
    assert w.sidebar.model.setData(idx, "Renamed")
    assert w.sidebar.model.items[w.sidebar.model.row_of(a.id)].title == "Renamed"
    assert store.get(a.id).title == "Renamed"  # queued after the rename
    w.sidebar.search.setText("something")  # lists only the other chat
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    assert w.sidebar.export_button.isEnabled()  # the open chat, though hidden
    export = w.sidebar.export_current(str(tmp_path / "chat.md"))
    wait_until(export.done, timeout=5000)
    assert open(export.result(), encoding="utf-8").read().startswith("# Renamed")
    pipe = tmp_path / "pipe.md"  # opening it to write waited for a reader: the window froze
    os.mkfifo(pipe)
    said = []
    w.sidebar.failed.connect(said.append)
    export = w.sidebar.export_current(str(pipe))
    wait_until(export.done, timeout=5000)
    assert export.result() is None and said == [
        f"Will not write the conversation at {pipe}: it is a FIFO (named pipe), not a file; "
        "nothing was written. Choose a file to export it to."]
    w.sidebar.search.clear()
    wait_until(lambda: len(w.sidebar.model.items) == 2, timeout=5000)
    w.sidebar.delete_current(confirm=False)
    assert store.get(a.id) is None
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    assert w.chat_model.rowCount() == 0 and w.conversation.conversation_id is None
    w.sidebar.new_button.click()
    assert w.conversation.conversation_id is None
    w.close()


def test_an_export_replaces_a_file_whole_or_not_at_all(qtbot, aloop, home, small_disk):
    """Export opened the file the person chose to replace, emptied it and
    wrote: on a full disk the old file was lost and the new one cut short.
    Now the file is replaced whole (written beside it, then renamed) or
    stays as it was; and SpecChat's own folder takes no export."""
    w = make_window(qtbot)
    store = w.session.conversations.blocking
    chat = store.create("Long chat")
    store.add_message(chat.id, "user", "word " * 200_000)  # a megabyte of Markdown
    w.sidebar.refresh()
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    w.open_conversation(chat.id)
    wait_until(lambda: w.chat_model.rowCount() == 1, timeout=5000)
    said = []
    w.sidebar.failed.connect(said.append)
    disk = small_disk("600k")
    old = disk / "notes.md"
    old.write_text("the notes I had\n" * 1000)
    export = w.sidebar.export_current(str(old))
    wait_until(export.done, timeout=10_000)
    assert export.result() is None and len(said) == 1 and "No space left" in said[0], said
    assert old.read_text() == "the notes I had\n" * 1000
    assert sorted(p.name for p in disk.iterdir()) == ["notes.md"]  # nothing half-written
    export = w.sidebar.export_current(str(home / "chat.md"))
    wait_until(export.done, timeout=5000)
    assert export.result() is None and "is in SpecChat's own folder" in said[1], said
    assert not (home / "chat.md").exists()
    w.close()


def test_the_delete_button_asks_first(qtbot, aloop, home, monkeypatch):
    """Delete asks before it deletes, and No keeps the conversation. Before,
    Qt handed the button's ``checked`` (False) to ``delete_current``'s
    ``confirm``: a click deleted at once, without asking."""
    from PySide6.QtWidgets import QMessageBox

    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question", staticmethod(
        lambda _parent, _title, text, *_a: asked.append(text) or QMessageBox.StandardButton.No))
    w = make_window(qtbot)
    store = w.session.conversations.blocking
    a = store.create("Keep me")
    store.add_message(a.id, "user", "hello there")
    w.sidebar.refresh()
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    w.open_conversation(a.id)
    wait_until(lambda: w.sidebar.delete_button.isEnabled(), timeout=5000)
    w.sidebar.delete_button.click()
    assert asked == ["Delete “Keep me”? This cannot be undone."]
    w.session.store.submit(lambda: None).result()  # anything queued has run
    assert store.get(a.id) is not None
    assert w.conversation.conversation_id == a.id
    w.close()


def test_closing_mid_reply_keeps_the_partial_reply(qtbot, aloop, home, tiny_target,
                                                   tiny_draft):
    w = _start_long_reply(qtbot, tiny_target, tiny_draft)
    path = home / "conversations.sqlite3"

    def saved_partial():
        with sqlite3.connect(path) as other:
            row = other.execute("SELECT content FROM messages WHERE role='assistant'").fetchone()
        return row is not None and row[0]

    wait_until(saved_partial, timeout=30_000)
    cid = w.conversation.conversation_id
    w.close()  # as if the app were quit mid-reply
    wait_until(lambda: w.conversation.task.done(), timeout=30_000)
    assert w.conversation.task.exception() is None

    w2 = make_window(qtbot)
    w2.open_conversation(cid)
    wait_until(lambda: w2.chat_model.rowCount() == 2, timeout=5000)
    reply = w2.chat_model.messages[-1]
    assert reply.role == "assistant" and reply.text and not reply.complete
    assert "interrupted" in w2.chat_view.delegate.footer(reply)
    w2.close()


KILLED = """
import sys
import specchat.ui.main_window as mw
made = mw.MainWindow.__init__
def watched(self, *args, **kwargs):
    made(self, *args, **kwargs)
    def loaded(pair):  # after the window's own handler: connected after it
        self.session.update_settings(max_tokens=1500)
        self.composer.edit.setPlainText("A long reply please")
        self.composer.send_button.click()
    self.session.engine.loaded.connect(loaded)
mw.MainWindow.__init__ = watched
from specchat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_killed_mid_reply_keeps_the_partial_reply(qtbot, aloop, home, tiny_target,
                                                   tiny_draft):
    """The app process gets SIGKILL while it streams: what the store thread
    had written survives (WAL), and the reply reads back as interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECCHAT_HOME=str(home))
    app = subprocess.Popen([sys.executable, "-c", KILLED, "--target", str(tiny_target),
                            "--draft", str(tiny_draft)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    path = home / "conversations.sqlite3"

    def partial() -> str:
        try:
            with sqlite3.connect(path) as other:
                row = other.execute("SELECT content FROM messages WHERE role='assistant'"
                                    ).fetchone()
        except sqlite3.OperationalError:  # not created yet
            return ""
        return row[0] if row else ""

    try:
        deadline = time.monotonic() + 120
        while len(partial()) < 40:
            assert app.poll() is None, app.stdout.read()
            assert time.monotonic() < deadline, "no partial reply was saved"
            time.sleep(0.1)
        os.kill(app.pid, signal.SIGKILL)
        app.wait(timeout=30)
    finally:
        if app.poll() is None:
            app.kill()
        app.stdout.close()
    assert app.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as other:
        rows = other.execute("SELECT role, content, complete FROM messages ORDER BY position"
                             ).fetchall()
        cid = other.execute("SELECT id FROM conversations").fetchone()[0]
    assert [(r[0], r[2]) for r in rows] == [("user", 1), ("assistant", 0)]
    assert rows[0][1] == "A long reply please" and len(rows[1][1]) >= 40

    w = make_window(qtbot)
    w.open_conversation(cid)
    wait_until(lambda: w.chat_model.rowCount() == 2, timeout=5000)
    reply = w.chat_model.messages[-1]
    assert reply.text == rows[1][1] and not reply.complete
    assert "interrupted" in w.chat_view.delegate.footer(reply)
    w.close()


def _fill(conn: sqlite3.Connection) -> None:
    """Make the history full, as a full disk does: SQLite's own limit on the
    file's pages (SQLITE_FULL, "database or disk is full"), then rows of
    halving size until not even a tiny one fits."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    size = 4096
    while size:
        try:
            conn.execute("INSERT INTO conversations(title, created_at, updated_at) "
                         "VALUES (?, 0, 0)", ("filler" + "x" * size,))
        except sqlite3.OperationalError as exc:
            assert exc.sqlite_errorcode == 13, exc  # SQLITE_FULL
            size //= 2


def _make_room(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM conversations WHERE title LIKE 'filler%'")
    conn.execute("PRAGMA max_page_count=1073741823")


def test_a_new_chat_that_could_not_be_created_is_created_by_the_next_turn(
        qtbot, aloop, home, tiny_target, tiny_draft):
    """The history is full when a new chat's first turn is saved: creating
    the conversation fails, and that is said once (not again for each of its
    rows and each streamed save). Once there is room, the next turn creates
    it and writes the whole chat, the first turn included. Before, every
    later turn reused the failed creation and failed the same way."""
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    errors: list[str] = []
    w.conversation.errorRaised.connect(errors.append)
    store = w.session.store
    path = home / "conversations.sqlite3"
    # The store's own connection: SQLite's page limit is per connection.
    store.submit(lambda: _fill(store._conn)).result()

    first = send_and_wait(qtbot, w, "Said while the disk is full")
    store.submit(lambda: None).result()  # every queued write has run (and failed)
    wait_until(lambda: not any(m.saved for m in w.chat_model.messages), timeout=10_000)
    assert errors == ["Could not save this conversation: database or disk is full"]
    assert w.error_banner.isVisible() and errors[0] in w.error_banner.label.text()
    assert stored_rows(path) == []
    cid = w.conversation.conversation_id  # made with the chat, not by its row

    store.submit(lambda: _make_room(store._conn)).result()
    second = send_and_wait(qtbot, w, "And once there is room again")
    store.submit(lambda: None).result()
    wait_until(lambda: w.conversation.conversation_id is not None, timeout=10_000)
    assert len(errors) == 1
    assert stored_rows(path) == [("user", "Said while the disk is full", 1),
                                 ("assistant", first.text, 1),
                                 ("user", "And once there is room again", 1),
                                 ("assistant", second.text, 1)]
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT id, title FROM conversations").fetchall() == [
            (cid, "Said while the disk is full")]
    w.close()


def test_a_garbage_row_leaves_the_rest_of_the_chat_to_open_and_export(qtbot, aloop, home,
                                                                      tmp_path):
    """A row another program wrote into the history (a BLOB as a message's
    text, a summary that is not one): the chat opens with its other
    messages, its export has them, and the sidebar lists every chat."""
    from specchat.store import db

    w = make_window(qtbot)
    store = w.session.conversations.blocking
    chat = store.create("Kept chat")
    store.add_message(chat.id, "user", "the question")
    reply = store.add_message(chat.id, "assistant", "the answer")
    store.update_message(reply, "the answer", complete=True)
    with sqlite3.connect(db.default_path()) as other:
        other.execute("INSERT INTO messages(conversation_id, position, role, content, summary, "
                      "created_at) VALUES (?, 7, 'user', ?, NULL, 0)", (chat.id, b"\x00\xff"))
        other.execute("UPDATE messages SET summary='{\"new_tokens\": \"many\"}' WHERE id=?",
                      (reply,))
    w.sidebar.refresh()
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    w.open_conversation(chat.id)
    wait_until(lambda: w.chat_model.rowCount() == 2, timeout=5000)
    assert [m.text for m in w.chat_model.messages] == ["the question", "the answer"]
    export = w.sidebar.export_current(str(tmp_path / "chat.md"))
    wait_until(export.done, timeout=5000)
    assert open(export.result(), encoding="utf-8").read() == (
        "# Kept chat\n\n## You\n\nthe question\n\n## Assistant\n\nthe answer\n")
    w.close()
