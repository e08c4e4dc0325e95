"""Conversation history and settings: SQLite under SPECCHAT_HOME, written
while replies stream, read back by a new window."""
# ruff: noqa: F811  (fixtures imported from ui_support)

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest
from specchat.store import db
from specchat.store.conversations import ConversationStore
from specchat.store.settings import AppSettings, SettingsStore, apply_preset, preset_of
from ui_support import aloop, load, make_window, send_and_wait, ui_home, wait_until  # noqa: F401


@pytest.fixture
def store(tmp_path):
    conn = db.connect(tmp_path / "c.sqlite3")
    yield ConversationStore(conn)
    conn.close()


def test_store_is_wal_under_specchat_home(ui_home):
    conn = db.connect()
    assert (ui_home / "conversations.sqlite3").exists()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_conversations_crud_search_export(store):
    a = store.create("Binary search")
    store.add_message(a.id, "user", "Write a binary search in Python")
    mid = store.add_message(a.id, "assistant", "", complete=False)
    store.update_message(mid, "```python\ndef bs(): pass\n```", runs=[("draft", "x")],
                         summary={"new_tokens": 5, "tokens_per_s": 12.5, "ttft_s": 0.1,
                                  "drafted": 4, "accepted": 3, "acceptance_rate": 0.75,
                                  "tokens_per_step": 2.5, "mode": "hybrid",
                                  "finish_reason": "stop"}, complete=True)
    b = store.create("Other chat")
    store.add_message(b.id, "user", "zebra quokka")
    assert [c.title for c in store.list("binary")] == ["Binary search"]
    assert [c.title for c in store.list("quokka")] == ["Other chat"]
    assert [c.title for c in store.list("100%")] == []
    store.rename(b.id, "Animals")
    assert store.get(b.id).title == "Animals"
    msgs = store.messages(a.id)
    assert msgs[1].runs == [("draft", "x")] and msgs[1].complete
    md = store.export_markdown(a.id)
    assert md.startswith("# Binary search")
    assert "## You" in md and "## Assistant" in md and "```python" in md
    assert "12.5 tok/s" in md and "acceptance 75%" in md
    store.delete(a.id)
    assert store.get(a.id) is None and store.messages(a.id) == []


def test_settings_roundtrip_and_presets(tmp_path):
    conn = db.connect(tmp_path / "s.sqlite3")
    st = SettingsStore(conn)
    assert st.load() == AppSettings()
    s = replace(apply_preset(AppSettings(), "Creative"), system_prompt="Be brief.", k=4)
    st.save(s)
    conn.close()
    again = SettingsStore(db.connect(tmp_path / "s.sqlite3")).load()
    assert again == s and preset_of(again) == "Creative"


def test_history_persisted_and_reloaded(qtbot, aloop, ui_home, tiny_target, tiny_draft):
    w = make_window(qtbot)
    w.settings = replace(w.settings, max_tokens=40)
    load(qtbot, w, tiny_target, tiny_draft)
    reply = send_and_wait(qtbot, w, "Remember this conversation")
    cid = w.controller.conversation_id
    w.close()

    # A new window (and store) on the same SQLite file.
    w2 = make_window(qtbot)
    titles = [c.title for c in w2.sidebar.model.items]
    assert titles == ["Remember this conversation"]
    w2.sidebar.openRequested.emit(cid)
    msgs = w2.chat_model.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].text == reply.text and msgs[1].summary["new_tokens"] == reply.summary[
        "new_tokens"]
    assert "tok/s" in w2.chat_view.delegate.footer(msgs[1])
    w2.close()


def test_partial_reply_saved_while_streaming(qtbot, aloop, ui_home, tiny_target, tiny_draft):
    w = make_window(qtbot)
    w.settings = replace(w.settings, max_tokens=1500)
    load(qtbot, w, tiny_target, tiny_draft)
    w.composer.edit.setPlainText("A long reply please")
    w.composer.send_button.click()
    path = ui_home / "conversations.sqlite3"

    def saved_partial():
        with sqlite3.connect(path) as other:  # another process could read this too
            row = other.execute("SELECT content, complete FROM messages WHERE role='assistant'"
                                ).fetchone()
        return row is not None and row[0] and row[1] == 0

    wait_until(saved_partial, timeout=30_000)
    assert w.controller.busy
    w.controller.stop()
    wait_until(lambda: not w.controller.busy, timeout=30_000)
    with sqlite3.connect(path) as other:
        content, complete = other.execute(
            "SELECT content, complete FROM messages WHERE role='assistant'").fetchone()
    assert complete == 1 and content == w.chat_model.messages[-1].text
    w.close()


def test_sidebar_new_rename_delete_search_export(qtbot, aloop, ui_home, tmp_path):
    w = make_window(qtbot)
    store = w.conversations
    a = store.create("First chat")
    store.add_message(a.id, "user", "hello there")
    b = store.create("Second chat")
    store.add_message(b.id, "user", "something else")
    w.sidebar.refresh()
    assert len(w.sidebar.model.items) == 2
    w.sidebar.search.setText("hello")
    wait_until(lambda: len(w.sidebar.model.items) == 1, timeout=5000)
    assert w.sidebar.model.items[0].title == "First chat"
    w.sidebar.search.clear()
    wait_until(lambda: len(w.sidebar.model.items) == 2, timeout=5000)
    w.open_conversation(a.id)
    assert [m.text for m in w.chat_model.messages] == ["hello there"]
    idx = w.sidebar.model.index(w.sidebar.model.row_of(a.id))
    assert w.sidebar.model.setData(idx, "Renamed")
    assert store.get(a.id).title == "Renamed"
    out = w.sidebar.export_current(str(tmp_path / "chat.md"))
    assert open(out, encoding="utf-8").read().startswith("# Renamed")
    w.sidebar.delete_current(confirm=False)
    assert store.get(a.id) is None
    assert w.chat_model.rowCount() == 0 and w.controller.conversation_id is None
    w.sidebar.new_button.click()
    assert w.controller.conversation_id is None
    w.close()


def test_closing_mid_reply_keeps_the_partial_reply(qtbot, aloop, ui_home, tiny_target,
                                                   tiny_draft):
    w = make_window(qtbot)
    w.settings = replace(w.settings, max_tokens=1500)
    load(qtbot, w, tiny_target, tiny_draft)
    w.composer.edit.setPlainText("A long reply please")
    w.composer.send_button.click()
    path = ui_home / "conversations.sqlite3"

    def saved_partial():
        with sqlite3.connect(path) as other:
            row = other.execute("SELECT content FROM messages WHERE role='assistant'").fetchone()
        return row is not None and row[0]

    wait_until(saved_partial, timeout=30_000)
    cid = w.controller.conversation_id
    w.close()  # as if the app were quit mid-reply
    wait_until(lambda: w.controller.task.done(), timeout=30_000)
    assert w.controller.task.exception() is None

    w2 = make_window(qtbot)
    w2.open_conversation(cid)
    reply = w2.chat_model.messages[-1]
    assert reply.role == "assistant" and reply.text and not reply.complete
    assert "interrupted" in w2.chat_view.delegate.footer(reply)
    w2.close()
