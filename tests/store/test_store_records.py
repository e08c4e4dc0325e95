"""Rows of the history read back when a hand edit or another program put
garbage in them (issue 29): SQLite keeps whatever a column is given, so a
BLOB can be a message's text and "fast" a summary's speed.

A conversation or message whose own fields are wrong is skipped, a
message's colouring, summary or error that is wrong is dropped, each said
once in the log; every other row still lists, exports and feeds the history
index. Settings and recovery files nested too deep to parse, or a FIFO in
a recovery file's place, are damaged files like any other. Real SQLite files,
written to by a second connection as another program would.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from specchat.store import db, recovery
from specchat.store.conversations import ConversationStore
from specchat.store.settings import AppSettings, SettingsStore
from specchat.store.summary import ReplySummary

GOOD_SUMMARY = ReplySummary(mode="hybrid", finish_reason="stop", new_tokens=12, drafted=8,
                            accepted=6, acceptance_rate=0.75, tokens_per_step=2.0,
                            tokens_per_s=20.0, ttft_s=0.5)


def _history(path) -> tuple[ConversationStore, int, int]:
    """A history with a good conversation (two turns and a summary) and a
    second one; returns the store and both ids."""
    store = ConversationStore(db.connect(path))
    good = store.create("Good chat", target="t", draft="d")
    store.add_message(good.id, "user", "Write a loop")
    reply = store.add_message(good.id, "assistant", "for i in range(3): print(i)")
    store.update_message(reply, "for i in range(3): print(i)",
                         runs=[("draft", "for i "), ("target", "in range(3): print(i)")],
                         summary=GOOD_SUMMARY, complete=True)
    other = store.create("Other chat")
    store.add_message(other.id, "user", "hello")
    return store, good.id, other.id


def _edit(path, *statements: tuple[str, tuple]) -> None:
    """What a hand edit (the sqlite3 shell, another program) does."""
    with sqlite3.connect(path) as other:
        for sql, args in statements:
            other.execute(sql, args)


def _insert(cid: int, pos: int, role, content, runs=None, summary=None, error=None,
            complete=1) -> tuple[str, tuple]:
    return ("INSERT INTO messages(conversation_id, position, role, content, runs, summary, "
            "error, complete, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (cid, pos, role, content, runs, summary, error, complete))


def test_garbage_message_rows_are_skipped_and_the_rest_export_and_index(tmp_path, records):
    path = tmp_path / "h.sqlite3"
    store, good, other = _history(path)
    clean_export = store.export_markdown(good)
    clean_corpus = store.corpus()
    _edit(path,
          _insert(good, 5, "user", b"\xff\x00 not text"),                    # skipped
          _insert(good, 6, b"user", "a role that is bytes"),                  # skipped
          _insert(other, 5, "assistant", "kept, colours dropped", runs="not json"),
          _insert(other, 6, "assistant", "kept, summary dropped",
                  summary=json.dumps({**GOOD_SUMMARY.to_json(), "tokens_per_s": "fast"})),
          _insert(other, 7, "assistant", "kept, error dropped", error=b"\x00"),
          _insert(other, 8, "assistant", "kept, runs of three dropped", runs="[[1, 2, 3]]"),
          _insert(other, 9, "assistant", "kept, summary list dropped", summary="[1]",
                  complete="yes"))
    ids = {r[0]: r[1] for r in sqlite3.connect(path).execute(
        "SELECT position, id FROM messages WHERE position >= 5 AND conversation_id=?",
        (other,))}
    bad = {r[0]: r[1] for r in sqlite3.connect(path).execute(
        "SELECT position, id FROM messages WHERE position >= 5 AND conversation_id=?",
        (good,))}

    store = ConversationStore(db.connect(path))
    assert store.export_markdown(good) == clean_export  # the bad rows are not in it
    corpus = store.corpus()
    assert corpus[0] == clean_corpus[0]
    assert [m[1] for m in corpus[1][2]] == ["hello", "kept, colours dropped",
                                            "kept, summary dropped", "kept, error dropped",
                                            "kept, runs of three dropped",
                                            "kept, summary list dropped"]
    msgs = store.messages(other)
    assert [(m.content, m.runs, m.summary, m.error, m.complete) for m in msgs[1:]] == [
        ("kept, colours dropped", [], None, None, True),
        ("kept, summary dropped", [], None, None, True),
        ("kept, error dropped", [], None, None, True),
        ("kept, runs of three dropped", [], None, None, True),
        ("kept, summary list dropped", [], None, None, True)]
    assert store.messages(good)[1].summary == GOOD_SUMMARY
    assert "for i in range(3)" in store.export_markdown(good)
    store.export_markdown(other)
    store.messages(other)  # read again: said once
    where = f"The history {path}"
    assert sorted(records) == sorted([
        f"{where}: message {bad[5]} was skipped: its content is b'\\xff\\x00 not text' "
        "(bytes), not text.",
        f"{where}: message {bad[6]} was skipped: its role is b'user' (bytes), not text.",
        f"{where}: message {ids[5]}: its runs was dropped (it is not valid JSON "
        "(Expecting value: line 1 column 1 (char 0))).",
        f"{where}: message {ids[6]}: its summary was dropped (tokens_per_s is 'fast' "
        "(str), not float).",
        f"{where}: message {ids[7]}: its error was dropped (it is b'\\x00' (bytes), "
        "not text).",
        f"{where}: message {ids[8]}: its runs was dropped (it is a list of 1, not "
        "(origin, text) pairs).",
        f"{where}: message {ids[9]}: its summary was dropped (it is a list of 1, "
        "not a summary).",
        f"{where}: message {ids[9]}: its complete was dropped (it is 'yes' (str), "
        "not 0 or 1).",
    ])


def test_a_garbage_conversation_row_is_skipped_and_the_rest_list(tmp_path, records):
    path = tmp_path / "h.sqlite3"
    store, good, other = _history(path)
    _edit(path, ("UPDATE conversations SET updated_at='yesterday' WHERE id=?", (other,)),
          ("INSERT INTO conversations(title, created_at, updated_at) VALUES (?, 0, 0)",
           (b"\x89PNG",)))
    png, = sqlite3.connect(path).execute("SELECT id FROM conversations WHERE title=?",
                                         (b"\x89PNG",)).fetchone()  # its id, made by SQLite
    store = ConversationStore(db.connect(path))
    assert [c.title for c in store.list()] == ["Good chat"]
    assert [c.title for c in store.list("loop")] == ["Good chat"]
    assert store.get(other) is None and store.get(good).draft == "d"
    assert [cid for cid, _stamp, _msgs in store.corpus()] == [good, other]
    where = f"The history {path}"
    assert sorted(records) == sorted([
        f"{where}: conversation {other} was skipped: updated_at is 'yesterday' (str), "
        "not float.",
        f"{where}: conversation {png} was skipped: title is b'\\x89PNG' (bytes), "
        "not str."])


def test_recent_prompts_read_past_a_garbage_row(tmp_path, monkeypatch):
    """``specchat models recommend`` samples the person's recent prompts
    from the history, read-only: a garbage row is skipped there too."""
    from specchat.tools.recommend import history_prompts

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    path = db.default_path()
    _store, good, other = _history(path)
    _edit(path, _insert(other, 5, "user", b"\x00\x01"), _insert(good, 5, b"user", "a role that is bytes"))
    assert history_prompts(3) == ["hello", "Write a loop"]


@pytest.mark.parametrize("value", ["[" * 100_000, b"\xff\xfe", 12])
def test_a_settings_row_nested_too_deep_or_not_text_takes_the_defaults(tmp_path, value):
    """A RecursionError from json.loads escaped the settings read and the
    app could not start."""
    conn = db.connect(tmp_path / "s.sqlite3")
    conn.execute("INSERT INTO settings(key, value) VALUES ('app', ?)", (value,))
    assert SettingsStore(conn).read() == (AppSettings(), ["all settings"])
    conn.close()


@pytest.mark.parametrize("kind", ["deep", "fifo"])
def test_a_recovery_file_nested_too_deep_or_a_fifo_is_set_aside(tmp_path, kind):
    """The start imports recovery files; a FIFO among them blocked it
    forever and JSON nested too deep ended it on a RecursionError (in a
    child, so that a hang fails the test)."""
    path = tmp_path / "h.sqlite3"
    folder = recovery.folder_for(path)
    folder.mkdir(parents=True)
    bad = folder / "20240101-000000-1.json"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.write_text('{"version": 1, "conversations": ' + "[" * 100_000)
    code = ("import sys; from specchat.store.worker import StoreWorker\n"
            "w = StoreWorker(sys.argv[1]); print(w.saving, w.recovered); w.close()")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "0"]
    assert [p.name for p in folder.iterdir()] == ["20240101-000000-1.json.unreadable"]
