"""A reply's reasoning in the history (issue 49): kept apart from its
answer with its own colouring, saved while it streams, exported in a
collapsed block; each conversation's thinking switch; a history of the
previous version opens with every row, upgraded, and its tools still read
it before it is."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

from specchat.store import db, recovery
from specchat.store.conversations import ChatContent, ConversationStore, MessageContent
from specchat.store.summary import ReplySummary
from specchat.store.worker import StoreWorker

PARTS = {"reasoning": {"tokens": 412, "seconds": 9.3, "drafted": 300, "accepted": 174,
                       "first_s": 0.2, "tokens_by_origin": {"target": 238, "draft": 174}},
         "answer": {"tokens": 120, "seconds": 2.0, "drafted": 100, "accepted": 70,
                    "first_s": 9.5, "tokens_by_origin": {"target": 50, "draft": 70}}}
SUMMARY = ReplySummary(mode="draft", finish_reason="stop", new_tokens=532, drafted=400,
                       accepted=244, acceptance_rate=0.61, tokens_per_s=47.0, by_part=PARTS)
# Backticks and HTML in the reasoning: the export's block must keep them text.
REASONING = "Let me think.\n\n```\nnot code, thought\n```\n</details> <b>bold?</b>"


def test_reasoning_is_kept_apart_saved_while_streaming_and_exported_folded(store):
    conv = store.create("Thinking chat")
    store.add_message(conv.id, "user", "Why?")
    mid = store.add_message(conv.id, "assistant", "", complete=False)
    store.update_message(mid, "", reasoning="Let me", reasoning_runs=[("draft", "Let me")])
    assert store.messages(conv.id)[1].reasoning == "Let me"  # a partial save keeps it
    store.update_message(mid, "Because.", runs=[("target", "Because.")], summary=SUMMARY,
                         complete=True, reasoning=REASONING,
                         reasoning_runs=[("draft", "Let me"), ("target", REASONING[6:])])
    m = store.messages(conv.id)[1]
    assert (m.content, m.reasoning) == ("Because.", REASONING)
    assert m.reasoning_runs == [("draft", "Let me"), ("target", REASONING[6:])]
    assert m.summary.part("reasoning").tokens == 412 and m.summary.reasoned
    assert m.summary.parts_line() == (
        "thinking 412 tokens, 44.3 tok/s, acceptance 58%, draft 42% · "
        "answer 120 tokens, 60.0 tok/s, acceptance 70%, draft 58%")

    md = store.export_markdown(conv.id)
    block = md[md.index("<details>"):md.index("</details>\n") + len("</details>")]
    assert block.startswith("<details>\n<summary>Thinking · 412 tokens · 9.3 s</summary>")
    fence = "````"  # longer than the reasoning's own fence
    assert f"\n{fence}text\n{REASONING}\n{fence}\n" in block
    assert md.index("</details>\n") < md.index("Because.")  # folded above the answer
    assert "*thinking 412 tokens" in md  # and each part's numbers under it
    assert store.list("Because")  # found by its answer


def test_a_reply_cut_off_inside_its_reasoning_says_so_in_the_export(store):
    conv = store.create("Cut")
    store.add_message(conv.id, "user", "Think")
    mid = store.add_message(conv.id, "assistant", "")
    cut = ReplySummary(finish_reason="length", new_tokens=4, by_part={"reasoning": PARTS[
        "reasoning"]}, ended_in_reasoning=True)
    store.update_message(mid, "", summary=cut, complete=True, reasoning="Hmm")
    assert "ended while thinking (max tokens reached), before any answer" in \
        store.export_markdown(conv.id)


def test_a_conversation_keeps_its_thinking_switch(store):
    store.save(ChatContent("c1", "New", [MessageContent("user", "hi")], reasoning_effort="none"))
    assert store.get("c1").reasoning_effort == "none"
    store.save(ChatContent("c1", "New", [MessageContent("user", "again")], reasoning_effort=""))
    assert store.get("c1").reasoning_effort == "none"  # a later save does not change it
    store.set_reasoning_effort("c1", "high")
    conv, messages = store.read("c1")
    assert conv.reasoning_effort == "high" and [m.content for m in messages] == ["hi", "again"]


def test_bad_reasoning_columns_drop_alone(store, store_file, records):
    """A hand edit (another program's connection to the file): bytes as
    the reasoning and the switch. The message and the conversation stay;
    only what is wrong is dropped."""
    conv = store.create("Edited")
    mid = store.add_message(conv.id, "assistant", "answer")
    with closing(sqlite3.connect(store_file)) as hand, hand:
        hand.execute("UPDATE messages SET reasoning=x'0102', reasoning_runs='\"x\"' WHERE id=?",
                     (mid,))
        hand.execute("UPDATE conversations SET reasoning_effort=x'00' WHERE id=?", (conv.id,))
    [m] = store.messages(conv.id)
    assert (m.content, m.reasoning, m.reasoning_runs) == ("answer", "", [])
    assert store.get(conv.id).reasoning_effort == ""
    assert any("its reasoning was dropped" in r for r in records)
    assert any("its reasoning_effort was dropped" in r for r in records)


def test_a_recovery_file_keeps_the_reasoning(tmp_path):
    chat = ChatContent("c9", "Kept", [MessageContent("user", "q"), MessageContent(
        "assistant", "a", reasoning="r", reasoning_runs=[("draft", "r")])],
        reasoning_effort="none")
    path = recovery.write(tmp_path, [chat])
    [back] = recovery.read(path)
    assert back.reasoning_effort == "none"
    assert (back.messages[1].reasoning, back.messages[1].reasoning_runs) == ("r", [("draft", "r")])


# The layout of SpecChat's history before replies kept their reasoning apart
# (schema version 2), as that version made it.
V2_LAYOUT = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY NOT NULL DEFAULT (lower(hex(randomblob(16)))),
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    target TEXT,
    draft TEXT
);
CREATE TABLE messages (
    id TEXT PRIMARY KEY NOT NULL DEFAULT (lower(hex(randomblob(16)))),
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
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
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version=2;
"""


def test_a_history_of_the_previous_version_opens_upgraded_with_every_row(tmp_path):
    """Read-only first (what the terminal tools do, before the app ever
    upgraded it): every row reads, with no reasoning. Then the app opens
    it: upgraded in place, every row kept, a reasoning reply saved and
    read back, the switch kept; opened again, nothing more to do."""
    path = tmp_path / "v2.sqlite3"
    with closing(sqlite3.connect(path)) as old:
        old.executescript(V2_LAYOUT)
        old.execute("INSERT INTO conversations VALUES ('a', 'Old', 1.0, 2.0, 'hf:t/m', NULL)")
        old.executemany("INSERT INTO messages VALUES (?, 'a', ?, ?, ?, ?, ?, NULL, 1, 1.5)", [
            ("m1", 0, "user", "hello", None, None),
            ("m2", 1, "assistant", "<think>old style</think>hi", '[["draft","hi"]]',
             json.dumps({"mode": "draft", "new_tokens": 3}))])
        old.commit()

    with closing(db.connect_read_only(path)) as ro:
        [user, reply] = ConversationStore(ro).messages("a")
        assert reply.content == "<think>old style</think>hi" and reply.reasoning == ""
        assert ro.execute("PRAGMA user_version").fetchone()[0] == 2

    w = StoreWorker(path)
    assert w.saving
    convs = w.conversations.blocking
    [conv] = convs.list()
    assert (conv.id, conv.title, conv.target, conv.reasoning_effort) == ("a", "Old", "hf:t/m", "")
    old_reply = convs.messages("a")[1]
    assert (old_reply.content, old_reply.reasoning, old_reply.runs) == (
        "<think>old style</think>hi", "", [("draft", "hi")])
    assert old_reply.summary.new_tokens == 3 and not old_reply.summary.reasoned
    convs.save(ChatContent("a", "Old", [MessageContent("assistant", "answer", reasoning="why",
                                                       summary=SUMMARY)]))
    convs.set_reasoning_effort("a", "none")
    w.close()
    with closing(sqlite3.connect(path)) as after:
        assert after.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION == 3
    again = StoreWorker(path)
    conv, messages = again.conversations.blocking.read("a")
    assert conv.reasoning_effort == "none"
    assert [(m.content, m.reasoning) for m in messages] == [
        ("hello", ""), ("<think>old style</think>hi", ""), ("answer", "why")]
    assert messages[2].summary.part("answer").tokens == 120
    again.close()
