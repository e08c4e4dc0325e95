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
from specchat.store import db
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
    assert saved == {**OLD_SUMMARY, "drafted_by": {}, "tokens_by_origin": {}, "paused_steps": 0}
    conn.close()
