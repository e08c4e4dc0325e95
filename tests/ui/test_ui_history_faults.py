"""The window when the history or the settings are not as expected: it
opens, says why in one place, keeps chatting, and saves what it can once it
can. Real files, a real second process holding the lock, a real window."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3

import pytest
from lockholder import hold_lock, newer_history
from specchat import applog
from specchat.store import db, worker
from specchat.ui.history_banner import NOT_SAVED
from ui_support import load, make_window, send_and_wait, wait_until


@pytest.fixture
def app_log(home):
    """The app's logging as its entry point sets it up (cli.main, ui/app.run):
    stderr and <home>/specchat.log. Undone after the test, so the others see
    the loggers as pytest does (propagating, caplog works)."""
    applog.setup(home)
    yield home / applog.FILENAME
    applog.shutdown()


def stored_rows(path) -> list[tuple]:
    with sqlite3.connect(path) as other:
        return other.execute("SELECT role, content, complete FROM messages ORDER BY position"
                             ).fetchall()


def test_a_window_opens_over_bad_settings_and_keeps_the_good_ones(qtbot, aloop, home,
                                                                  tiny_target, tiny_draft):
    """Wrong types in the stored settings crashed the app at every launch;
    now those fields take their defaults, the others stay, a notice names
    them, and a reply runs on the result."""
    conn = db.connect(home / "conversations.sqlite3")
    bad = {"speculative": "yes", "temperature": "hot", "top_p": float("nan"), "top_k": [1],
           "k": "many", "system_prompt": "Answer in one line.", "max_tokens": 10}
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)", (json.dumps(bad),))
    conn.close()
    w = make_window(qtbot, initial_pair=None)
    s = w.session.settings
    assert (s.system_prompt, s.max_tokens) == ("Answer in one line.", 10)
    assert (s.speculative, s.temperature, s.top_p, s.top_k, s.k) == (True, 0.0, 1.0, 0, None)
    text = w.error_banner.label.text()
    assert w.error_banner.isVisible() and "not valid" in text
    for name in ("speculative", "temperature", "top-p", "top-k", "K"):
        assert name in text
    load(qtbot, w, tiny_target, tiny_draft)
    reply = send_and_wait(qtbot, w, "Still works?")
    assert reply.summary.new_tokens > 0 and reply.error is None
    w.close()


def test_a_history_locked_at_start_opens_the_window_and_retry_saves_the_chat(
        qtbot, aloop, home, tiny_target, tiny_draft, monkeypatch):
    """Another process holds an exclusive lock while SpecChat starts. The
    window opens and says why, chatting works unsaved, and Retry (once the
    lock is gone) opens the history and writes the chat that was on screen."""
    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.2)  # 5 s in the app
    path = home / "conversations.sqlite3"
    conn = db.connect(path)
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)",
                 (json.dumps({"system_prompt": "From the file", "max_tokens": 99}),))
    conn.close()
    with hold_lock(path, "EXCLUSIVE", journal="DELETE"):
        w = make_window(qtbot)
        w.session.update_settings(max_tokens=12)
        banner = w.history_banner
        assert banner.isVisible() and banner.button.isVisible()
        assert banner.button.text() == "Retry"
        assert "another program has it locked" in banner.label.text()
        assert NOT_SAVED in banner.label.text()
        assert not w.error_banner.isVisible()  # one place says it, not an error per write
        load(qtbot, w, tiny_target, tiny_draft)
        reply = send_and_wait(qtbot, w, "Said while locked")
        assert reply.summary.new_tokens > 0 and not w.error_banner.isVisible()
        banner.button.click()  # still locked: stays, says so again
        wait_until(lambda: banner.button.isEnabled(), timeout=10_000)
        assert banner.isVisible() and "another program has it locked" in banner.label.text()
    banner.button.click()
    wait_until(lambda: not banner.isVisible(), timeout=10_000)
    # The file's settings apply, except what was changed meanwhile.
    assert (w.session.settings.system_prompt, w.session.settings.max_tokens) == (
        "From the file", 12)
    wait_until(lambda: w.conversation.conversation_id is not None, timeout=10_000)
    w.session.store.submit(lambda: None).result()
    assert stored_rows(path) == [("user", "Said while locked", 1),
                                 ("assistant", reply.text, 1)]
    wait_until(lambda: [c.title for c in w.sidebar.model.items] == ["Said while locked"],
               timeout=10_000)
    w.close()


def test_a_folder_in_the_historys_place_is_said_logged_and_retried(qtbot, aloop, home, capfd,
                                                                   app_log):
    """The window opens, the banner says why, and the same line goes to
    stderr and to specchat.log in the home folder; removing the folder and
    pressing Retry brings the history back."""
    path = home / "conversations.sqlite3"
    path.mkdir(parents=True)
    w = make_window(qtbot, initial_pair=None)
    text = w.history_banner.label.text()
    assert w.history_banner.isVisible() and "a folder is in its place" in text
    assert str(path) in text
    line = f"Your conversation history ({path}) could not be opened: a folder is in its place."
    assert line in capfd.readouterr().err
    assert line in (home / applog.FILENAME).read_text(encoding="utf-8")
    assert "a folder is in its place" in w.sidebar.rename_button.toolTip()  # (disabled)
    path.rmdir()
    w.history_banner.button.click()
    wait_until(lambda: not w.history_banner.isVisible(), timeout=10_000)
    assert w.session.saving
    assert "Not available" not in w.sidebar.rename_button.toolTip()
    w.session.update_settings(temperature=0.5)
    w.close()
    with sqlite3.connect(path) as other:  # saved now
        assert json.loads(other.execute("SELECT value FROM settings").fetchone()[0]
                          )["temperature"] == 0.5


def test_a_history_set_aside_is_logged_to_stderr_and_the_home_log(qtbot, aloop, home, capfd,
                                                                  app_log):
    home.mkdir(parents=True, exist_ok=True)
    (home / "conversations.sqlite3").write_bytes(b"not a database " * 300)
    w = make_window(qtbot, initial_pair=None)
    kept = next(p for p in home.iterdir() if ".unreadable-" in p.name)
    assert str(kept) in w.error_banner.label.text()
    err = capfd.readouterr().err
    log = (home / applog.FILENAME).read_text(encoding="utf-8")
    for text in (err, log):
        assert "could not be read" in text and str(kept) in text
    w.close()


def test_a_newer_versions_history_is_read_only_and_left_untouched(qtbot, aloop, home,
                                                                  tiny_target, tiny_draft):
    """A history written by a newer SpecChat (a higher schema version) is
    shown read-only with a notice; a whole session that chats, changes a
    setting and quits leaves its bytes and mtime as they were."""
    path = home / "conversations.sqlite3"
    newer_history(path, 'Kept by the newer app', versions_ahead=1)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    w = make_window(qtbot)
    banner = w.history_banner
    assert banner.isVisible() and not banner.button.isVisible()
    assert "newer version of SpecChat" in banner.label.text()
    assert "read-only" in banner.label.text()
    wait_until(lambda: [c.title for c in w.sidebar.model.items] == ["Kept by the newer app"],
               timeout=10_000)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    reply = send_and_wait(qtbot, w, "Not to be saved")
    assert reply.summary.new_tokens > 0 and not w.error_banner.isVisible()
    w.close()
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_the_log_file_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(applog, "MAX_BYTES", 4000)
    folder = tmp_path / "logs"
    path = applog.setup(folder)
    log = logging.getLogger("specchat.test")
    try:
        for i in range(200):
            log.warning("line %d of a long run of warnings", i)
        assert path.stat().st_size <= 4000
        assert (folder / f"{applog.FILENAME}.1").stat().st_size <= 4000
        assert "line 199" in path.read_text(encoding="utf-8")
    finally:
        applog.shutdown()  # let go of this test's file
        shutil.rmtree(folder, ignore_errors=True)


def test_a_turn_still_locked_out_at_quit_is_in_the_history_at_the_next_start(
        qtbot, aloop, home, tiny_target, tiny_draft, monkeypatch):
    """Another process holds the history's lock while a turn is said and
    still when the window closes. Quitting does not wait for it (past
    CLOSE_WAIT_S): the chat on screen goes to a recovery file, and the next
    start, with the lock gone, adds it to the history, says so, and deletes
    the file. Before, those writes were dropped and only logged."""
    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.2)  # 5 s in the app
    monkeypatch.setattr(worker, "CLOSE_WAIT_S", 0.5)
    path = home / "conversations.sqlite3"
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    with hold_lock(path) as holder:
        reply = send_and_wait(qtbot, w, "Said while locked, then quit")
        wait_until(w.history_banner.isVisible, timeout=10_000)
        w.close()
        kept = list((home / "unsaved").iterdir())
        assert len(kept) == 1 and kept[0].suffix == ".json"
        holder.release()
    assert stored_rows(path) == []
    again = make_window(qtbot, initial_pair=None)
    assert ("Recovered 1 conversation(s) that could not be saved last time."
            in again.error_banner.label.text())
    assert not kept[0].exists()
    assert stored_rows(path) == [("user", "Said while locked, then quit", 1),
                                 ("assistant", reply.text, 1)]
    wait_until(lambda: [c.title for c in again.sidebar.model.items] == [
        "Said while locked, then quit"], timeout=10_000)
    again.close()


def test_a_chat_said_while_the_history_was_unavailable_is_kept_at_quit(
        qtbot, aloop, home, tiny_target, tiny_draft):
    """No Retry before quitting: the chat is not lost but kept, and added
    once the history opens (here by Retry in the next session)."""
    path = home / "conversations.sqlite3"
    path.mkdir(parents=True)
    w = make_window(qtbot)
    w.session.update_settings(max_tokens=12)
    load(qtbot, w, tiny_target, tiny_draft)
    reply = send_and_wait(qtbot, w, "Said with no history")
    w.close()
    again = make_window(qtbot, initial_pair=None)  # still a folder: kept waiting
    assert len(list((home / "unsaved").glob("*.json"))) == 1
    path.rmdir()
    again.history_banner.button.click()
    wait_until(lambda: not again.history_banner.isVisible(), timeout=10_000)
    assert "Recovered 1 conversation(s)" in again.error_banner.label.text()
    assert stored_rows(path) == [("user", "Said with no history", 1),
                                 ("assistant", reply.text, 1)]
    assert list((home / "unsaved").glob("*.json")) == []
    again.close()


def test_a_session_leaves_the_loggers_as_they_are(qtbot, aloop, home, caplog):
    """Logging is set up by the entry points (cli.main, ui/app.run), not by
    each session: a window in a test changes no logger, and what the store
    reports reaches pytest's caplog. Before, every session made the
    specchat logger stop propagating."""
    (home / "conversations.sqlite3").mkdir(parents=True)
    logger = logging.getLogger("specchat")
    before = (logger.propagate, list(logger.handlers), logger.level)
    w = make_window(qtbot, initial_pair=None)
    assert (logger.propagate, list(logger.handlers), logger.level) == before
    assert any("a folder is in its place" in r.getMessage() for r in caplog.records)
    w.close()


def test_a_huge_number_in_the_stored_settings_does_not_stop_the_window(qtbot, aloop, home):
    """A 400-digit temperature overflowed a float check and the app crashed
    at every launch; now that field takes its default and the notice names it."""
    conn = db.connect(home / "conversations.sqlite3")
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)",
                 (json.dumps({"temperature": 10 ** 400, "top_k": -10 ** 400,
                              "max_tokens": 10}),))
    conn.close()
    w = make_window(qtbot, initial_pair=None)
    s = w.session.settings
    assert (s.temperature, s.top_k, s.max_tokens) == (0.0, 0, 10)
    text = w.error_banner.label.text()
    assert "not valid" in text and "temperature" in text and "top-k" in text
    w.close()


def test_a_read_only_history_cannot_be_renamed_or_deleted_from_the_sidebar(qtbot, aloop,
                                                                           home):
    """Rename and delete are disabled, and say why, while the history cannot
    be written. Before, they changed the list on screen and then failed."""
    from PySide6.QtCore import Qt

    newer_history(home / "conversations.sqlite3", "Kept by the newer app")
    w = make_window(qtbot, initial_pair=None)
    sb = w.sidebar
    wait_until(lambda: len(sb.model.items) == 1, timeout=10_000)
    cid = sb.model.items[0].id
    w.open_conversation(cid)
    assert sb.export_button.isEnabled()  # reading still works
    for button in (sb.rename_button, sb.delete_button):
        assert not button.isEnabled()
        assert "newer version of SpecChat" in button.toolTip()
    index = sb.model.index(0)
    assert not sb.model.flags(index) & Qt.ItemFlag.ItemIsEditable
    assert not sb.model.setData(index, "Renamed")
    sb.rename_current()
    sb.delete_current(confirm=False)
    assert [c.title for c in sb.model.items] == ["Kept by the newer app"]
    assert w.conversation.conversation_id == cid and not w.error_banner.isVisible()
    w.close()
