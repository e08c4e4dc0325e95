"""Conversations and settings on disk: SQLite in WAL mode under
SPECCHAT_HOME, searched, exported, written in order on the store's own
thread, and read back, old files included."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from dataclasses import replace

import pytest
from specchat.store import db, recovery
from specchat.store.conversations import ConversationStore
from specchat.store.settings import PRESETS, AppSettings, SettingsStore, preset_of
from specchat.store.summary import ReplySummary
from specchat.store.worker import StoreWorker

# A summary as an older version saved it: no drafted_by or blas_threads yet,
# and a key this version does not know.
OLD_SUMMARY = {"mode": "hybrid", "finish_reason": "length", "new_tokens": 48, "steps": 20,
               "drafted": 40, "accepted": 28, "acceptance_rate": 0.7, "tokens_per_step": 2.4,
               "tokens_per_s": 31.5, "ttft_s": 0.12, "wall_s": 1.6, "prompt_tokens": 30,
               "reused_prompt_tokens": 0, "prefill_s": 0.1, "forward_s": 1.2,
               "overhead_s": 0.3, "retired_field": [1, 2]}


def test_store_is_wal_under_specchat_home(home):
    conn = db.connect()
    assert (home / "conversations.sqlite3").exists()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_conversations_crud_search_export(store):
    a = store.create("Binary search")
    store.add_message(a.id, "user", "Write a binary search in Python")
    mid = store.add_message(a.id, "assistant", "", complete=False)
    store.update_message(mid, "```python\ndef bs(): pass\n```", runs=[("draft", "x")],
                         summary=ReplySummary(new_tokens=5, tokens_per_s=12.5, ttft_s=0.1,
                                              drafted=4, accepted=3, acceptance_rate=0.75,
                                              tokens_per_step=2.5, mode="hybrid",
                                              finish_reason="stop"), complete=True)
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


def test_store_worker_runs_calls_in_order_on_its_own_thread(tmp_path):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = StoreWorker(tmp_path / "w.sqlite3")
        remote = worker.conversations
        assert worker.submit(threading.get_ident).result() != threading.get_ident()
        # Writes queued without waiting, then a read: FIFO makes it see them all.
        writes = [remote.create(f"chat {i}") for i in range(20)]
        titles = [c.title for c in loop.run_until_complete(remote.list())]
        assert sorted(titles) == sorted(f"chat {i}" for i in range(20))
        assert all(f.done() for f in writes)
        last = remote.create("queued before close")
        worker.close()  # finishes the queue first
        assert loop.run_until_complete(last).title == "queued before close"
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            loop.run_until_complete(remote.list())
        again = StoreWorker(tmp_path / "w.sqlite3")
        assert "queued before close" in [c.title for c in again.conversations.blocking.list()]
        again.close()
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_settings_roundtrip_and_presets(tmp_path):
    conn = db.connect(tmp_path / "s.sqlite3")
    st = SettingsStore(conn)
    assert st.load() == AppSettings()
    s = replace(AppSettings(), **PRESETS["Creative"], system_prompt="Be brief.", k=4)
    st.save(s)
    conn.close()
    again = SettingsStore(db.connect(tmp_path / "s.sqlite3")).load()
    assert again == s and preset_of(again) == "Creative"


def test_old_history_summary_reads_typed_and_saves_back_the_same(tmp_path):
    conn = db.connect(tmp_path / "h.sqlite3")
    store = ConversationStore(conn)
    conv = store.create("Old chat")
    mid = store.add_message(conv.id, "assistant", "reply")
    conn.execute("UPDATE messages SET summary=? WHERE id=?", (json.dumps(OLD_SUMMARY), mid))
    summary = store.messages(conv.id)[0].summary
    assert isinstance(summary, ReplySummary)
    assert (summary.mode, summary.new_tokens, summary.drafted) == ("hybrid", 48, 40)
    assert summary.drafted_by == {}  # missing in old files: the default
    assert summary.line() == ("48 tokens · 31.5 tok/s · first token 0.12 s · acceptance 70% · "
                              "2.40 tokens/step · hybrid · max tokens reached")
    store.update_message(mid, "reply", summary=summary, complete=True)
    saved = json.loads(conn.execute("SELECT summary FROM messages WHERE id=?",
                                    (mid,)).fetchone()[0])
    # nothing lost, unknown keys included; fields added since take their defaults
    assert saved == {**OLD_SUMMARY, "drafted_by": {}, "tokens_by_origin": {}, "paused_steps": 0,
                     "by_part": {}, "ended_in_reasoning": False}
    conn.close()


# The layout of SpecChat's history before ids were text (schema version 1):
# SQLite numbered the rows.
V1_LAYOUT = """
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
PRAGMA user_version=1;
"""


def test_a_history_with_integer_ids_opens_with_every_row_and_takes_new_ones(tmp_path, records):
    """A history an older SpecChat wrote (integer ids) is upgraded when it
    opens: every conversation and message is there under its id's text, in
    its order, with its colours, summary, error and state; a garbage row is
    still skipped and said; a recovery file naming an integer id finds its
    conversation; new rows get UUIDs and deleting still takes a chat's
    messages with it."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(V1_LAYOUT)
        old.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)", [
            (2, "Binary search", 10.0, 30.0, "hf:t/m", "hf:d/m"),
            (10, "Ten", 20.0, 40.0, None, None),
            (11, "To be recovered", 25.0, 25.0, None, None)])
        old.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            (3, 2, 0, "user", "Write a binary search", None, None, None, 1, 11.0),
            (9, 2, 1, "assistant", "def bs(): pass", '[["draft","def "],["target","bs"]]',
             json.dumps(OLD_SUMMARY), None, 1, 12.0),
            (12, 10, 0, "user", "ten?", None, None, None, 1, 21.0),
            (13, 10, 1, "assistant", "partial", None, None, "Stopped.", 0, 22.0),
            (14, 10, 2, "user", b"\x00", None, None, None, 1, 23.0),  # garbage: skipped
            (15, 11, 0, "user", "stale", None, None, None, 1, 26.0)])
        old.execute("INSERT INTO settings VALUES ('app', ?)", (json.dumps({"max_tokens": 77}),))
    recovery.folder_for(path).mkdir()  # what an older version kept at quit:
    (recovery.folder_for(path) / "20240101-000000-1-ab.json").write_text(json.dumps(
        {"version": 1, "saved_at": 0, "conversations": [
            {"id": 11, "title": "To be recovered", "target": None, "draft": None,
             "messages": [{"role": "user", "content": "as on screen", "runs": [],
                           "summary": None, "error": None, "complete": True}]}]}))

    w = StoreWorker(path)
    assert w.saving and w.recovered == 1
    convs = w.conversations.blocking
    assert [(c.id, c.title, c.target) for c in convs.list()] == [  # the recovered one touched
        ("11", "To be recovered", None), ("10", "Ten", None), ("2", "Binary search", "hf:t/m")]
    bs = convs.messages("2")
    assert [(m.id, m.role, m.content, m.runs, m.complete) for m in bs] == [
        ("3", "user", "Write a binary search", [], True),
        ("9", "assistant", "def bs(): pass", [("draft", "def "), ("target", "bs")], True)]
    assert bs[1].summary == ReplySummary.from_json(OLD_SUMMARY)
    assert [(m.id, m.content, m.error, m.complete) for m in convs.messages("10")] == [
        ("12", "ten?", None, True), ("13", "partial", "Stopped.", False)]
    assert any("message 14 was skipped: its content is b'\\x00' (bytes)" in r for r in records)
    assert [m.content for m in convs.messages("11")] == ["as on screen"]
    assert [cid for cid, _stamp, _msgs in convs.corpus()] == ["2", "10", "11"]
    assert "## Assistant\n\ndef bs(): pass" in convs.export_markdown("2")
    assert w.settings.blocking.load().max_tokens == 77

    # New rows next to the old ones: UUIDs, after the old messages.
    new = convs.create("New chat")
    assert len(new.id) == 32 and int(new.id, 16) >= 0
    added = convs.add_message("2", "user", "and a linear one?")
    assert len(added) == 32 and [m.id for m in convs.messages("2")] == ["3", "9", added]
    convs.delete("10")
    w.close()
    with sqlite3.connect(path) as after:
        assert after.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
        assert after.execute("SELECT COUNT(*) FROM messages WHERE conversation_id='10'"
                             ).fetchone()[0] == 0  # the cascade still holds
        assert after.execute("PRAGMA foreign_key_check").fetchall() == []
    again = StoreWorker(path)  # upgraded once: opens as it is
    assert [c.id for c in again.conversations.blocking.list()] == ["2", new.id, "11"]
    again.close()
