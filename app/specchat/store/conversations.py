"""Conversations and their messages, in SQLite.

Messages carry what the UI needs to redraw a reply exactly as it was: the
text (a reply's answer), its reasoning apart, the token-origin runs of each
(for colouring accepted draft tokens) and the reply's summary. A
conversation keeps its thinking switch (``reasoning_effort``: an effort
word the window chose, "" for the model's default). A reply is saved while it streams with ``complete=0``; if
the app dies mid-reply, the partial text is still there on the next start.

Ids are made where a conversation or a message is made (``new_id``, a
UUID), not by SQLite: the window knows a chat's id from its first message,
so it never waits for a row to be numbered, the history index keys the chat
by it from its first reply, and rows are written by upsert (writing one
again updates it), so a turn whose write failed is simply written again.

Rows are read back checked (``specchat.records``): SQLite keeps whatever a
hand edit or another program puts in a column (a BLOB as a message's text,
``"fast"`` as a summary's speed). A conversation or message whose own fields
are not what they must be is skipped; a message's colouring, summary or
error that is not is dropped and the message kept. Each is said once in the
log; every other row still lists, exports and feeds the history index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from specchat import records
from specchat.store.summary import REASONING, ReplySummary


def new_id() -> str:
    """The id of a conversation or message, made with it (see the module docstring)."""
    return uuid.uuid4().hex


@dataclass
class Conversation:
    id: str
    title: str
    created_at: float
    updated_at: float
    target: str | None = None
    draft: str | None = None
    reasoning_effort: str = ""


@dataclass
class MessageContent:
    """What a message holds, saved or not (recovery.py keeps unsaved ones).
    A reply's ``content`` is its answer; what it reasoned first is
    ``reasoning``, with its own ``reasoning_runs``."""

    role: str
    content: str
    runs: list[tuple[str, str]] = field(default_factory=list)
    summary: ReplySummary | None = None
    error: str | None = None
    complete: bool = True
    id: str = field(default_factory=new_id)
    reasoning: str = ""
    reasoning_runs: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class ChatContent:
    """A conversation as the window has it: what ``save`` writes, and what a
    recovery file keeps (recovery.py)."""

    id: str
    title: str
    messages: list[MessageContent]
    target: str | None = None
    draft: str | None = None
    reasoning_effort: str = ""  # the thinking switch, written with a new conversation


log = logging.getLogger("specchat.store")


def _history_name(conn: sqlite3.Connection) -> str:
    """How the log names this history: its file (a read-only copy and the
    app's own history are different files)."""
    file = next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "")
    return f"The history {file}" if file else "The history"


def _conversation(row: sqlite3.Row, where: str) -> Conversation | None:
    data = dict(row)
    effort = data.get("reasoning_effort", "")
    if not isinstance(effort, str):  # the switch alone is dropped, not the conversation
        records.report(log, f"{where}: conversation {row['id']}: its reasoning_effort was dropped "
                            f"(it is {records.described(effort)}, not text).")
        data["reasoning_effort"] = ""
    try:
        return Conversation(**records.fields_of(Conversation, data))
    except records.BadRecord as exc:
        records.report(log, f"{where}: conversation {row['id']} was skipped: {exc}.")
        return None


def _text_fields(row: sqlite3.Row, where: str) -> bool:
    """Whether a message row's id, role and text are text (else it is skipped, and said)."""
    for name in ("id", "role", "content"):
        if not isinstance(row[name], str):
            records.report(log, f"{where}: message {row['id']} was skipped: its {name} is "
                                f"{records.described(row[name])}, not text.")
            return False
    return True


# A message's parts beyond its text, each read from its column; one that is
# not what it must be is dropped (read as an empty column), the message kept.

def _runs(value: object) -> list[tuple[str, str]]:
    if not value:
        return []
    runs = records.parse_json(value) if isinstance(value, str | bytes) else value
    if not records.conforms(runs, list[tuple[str, str]]):
        raise records.BadRecord(f"it is {records.described(runs)}, not (origin, text) pairs")
    return [(o, t) for o, t in runs]


def _summary(value: object) -> ReplySummary | None:
    if not value:
        return None
    return ReplySummary.from_json(
        records.parse_json(value) if isinstance(value, str | bytes) else value)


def _error(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise records.BadRecord(f"it is {records.described(value)}, not text")
    return value


def _text(value: object) -> str:
    if value is None:  # the column's default (or a file older than it)
        return ""
    if not isinstance(value, str):
        raise records.BadRecord(f"it is {records.described(value)}, not text")
    return value


def _complete(value: object) -> bool:
    if value is None:  # the column's default
        return True
    if value not in (0, 1) or isinstance(value, float):
        raise records.BadRecord(f"it is {records.described(value)}, not 0 or 1")
    return bool(value)


_PARTS = {"runs": _runs, "summary": _summary, "error": _error, "complete": _complete,
          "reasoning": _text, "reasoning_runs": _runs}


def _message(row: sqlite3.Row, where: str) -> MessageContent | None:
    if not _text_fields(row, where):
        return None
    parts = {}
    columns = row.keys()  # a file older than a column (read-only, tools/history.py) lacks it
    for name, read in _PARTS.items():
        try:
            parts[name] = read(row[name] if name in columns else None)
        except records.BadRecord as exc:
            records.report(log, f"{where}: message {row['id']}: its {name} was dropped ({exc}).")
            parts[name] = read(None)
    return MessageContent(row["role"], row["content"], id=row["id"], **parts)


class ConversationStore:
    def __init__(self, conn: sqlite3.Connection):
        self._db = conn
        self._where = _history_name(conn)

    # -- conversations ---------------------------------------------------
    def create(self, title: str = "New chat", target: str | None = None,
               draft: str | None = None) -> Conversation:
        """A new, empty conversation (the window's own are written by ``save``)."""
        now = time.time()
        conv = Conversation(new_id(), title, now, now, target, draft)
        self.save(ChatContent(conv.id, title, [], target, draft))
        return conv

    def get(self, conversation_id: str) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id=?",
                               (conversation_id,)).fetchone()
        return _conversation(row, self._where) if row else None

    def list(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles and message text."""
        if search.strip():
            pattern = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%").replace(
                "_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.conversation_id=c.id"
                " AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated_at DESC, rowid DESC",
                (pattern,)).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM conversations ORDER BY updated_at DESC, rowid DESC").fetchall()
        return [c for c in (_conversation(r, self._where) for r in rows) if c is not None]

    def set_reasoning_effort(self, conversation_id: str, effort: str) -> None:
        """The conversation's thinking switch (a new one's is written with
        its first ``save``)."""
        self._db.execute("UPDATE conversations SET reasoning_effort=? WHERE id=?",
                         (effort, conversation_id))

    def rename(self, conversation_id: str, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?",
                         (title.strip() or "Untitled", conversation_id))

    def delete(self, conversation_id: str) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def corpus(self) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """Every conversation's text, as the engine's history index reads it:
        (id, stamp, [(role, content), ...]). The stamp changes whenever a
        message is added, edited or removed, so the index knows which
        conversations it must read again."""
        out: list[tuple[str, str, list[tuple[str, str]]]] = []
        rows = self._db.execute(
            "SELECT m.id AS id, m.conversation_id AS cid, m.role AS role, m.content AS content, "
            "c.updated_at AS updated FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id ORDER BY c.rowid, m.position, m.rowid")
        current: str | None = None
        for r in rows:
            if not _text_fields(r, self._where):
                continue
            if r["cid"] != current:
                current = r["cid"]
                out.append((current, str(r["updated"]), []))
            out[-1][2].append((r["role"], r["content"]))
        return [(cid, f"{updated}:{len(msgs)}:{_digest(msgs)}", msgs) for cid, updated, msgs in out]

    # -- messages --------------------------------------------------------
    def messages(self, conversation_id: str) -> list[MessageContent]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id=? ORDER BY position, rowid",
            (conversation_id,)).fetchall()
        return [m for m in (_message(r, self._where) for r in rows) if m is not None]

    def read(self, conversation_id: str) -> tuple[Conversation | None, list[MessageContent]]:
        """A conversation and its messages, read together (what the window opens)."""
        return self.get(conversation_id), self.messages(conversation_id)

    def add_message(self, conversation_id: str, role: str, content: str, *,
                    complete: bool = True) -> str:
        """Add a message after the others; its id."""
        message = MessageContent(role, content, complete=complete)
        with self._transaction():
            self._upsert_message(conversation_id, message)
            self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?",
                             (time.time(), conversation_id))
        return message.id

    def save(self, chat: ChatContent) -> None:
        """Write a conversation as the window has it: its row (added if new)
        and each of ``chat.messages`` (added after the others, or for an id
        the history has, updated in place). All or nothing, in one call, so
        a turn that cannot be written fails once and is written again whole.
        A conversation the history has keeps its title and pair (the person
        may have renamed it); it is only touched."""
        now = time.time()
        with self._transaction():
            self._db.execute(
                "INSERT INTO conversations(id, title, created_at, updated_at, target, draft,"
                " reasoning_effort) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET"
                " updated_at=excluded.updated_at",
                (chat.id, chat.title, now, now, chat.target, chat.draft, chat.reasoning_effort))
            for m in chat.messages:
                self._upsert_message(chat.id, m)

    def _upsert_message(self, conversation_id: str, m: MessageContent) -> None:
        # (The WHERE clause also keeps SQLite from reading ON CONFLICT as a join's.)
        self._db.execute(
            "INSERT INTO messages(id, conversation_id, position, role, content, runs, summary,"
            " error, complete, created_at, reasoning, reasoning_runs) SELECT ?1, ?2,"
            " COALESCE(MAX(position), -1) + 1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11 FROM messages"
            " WHERE conversation_id=?2 ON CONFLICT(id) DO UPDATE SET content=excluded.content,"
            " runs=excluded.runs, summary=excluded.summary, error=excluded.error,"
            " complete=excluded.complete, reasoning=excluded.reasoning,"
            " reasoning_runs=excluded.reasoning_runs",
            (m.id, conversation_id, m.role, m.content, *_encoded(m.runs, m.summary), m.error,
             int(m.complete), time.time(), m.reasoning, _runs_json(m.reasoning_runs)))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction, taking the write lock first: if another program
        holds it, nothing is done and the store's thread can simply try the
        whole call again (a half-done call would add rows twice)."""
        if self._db.in_transaction:  # a part of a larger one (restore)
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def update_message(self, message_id: str, content: str, *,
                       runs: list[tuple[str, str]] | None = None,
                       summary: ReplySummary | None = None,
                       error: str | None = None, complete: bool = False,
                       reasoning: str = "",
                       reasoning_runs: list[tuple[str, str]] | None = None) -> None:
        """Save a reply's current state (called while streaming and at the end)."""
        self._db.execute(
            "UPDATE messages SET content=?, runs=?, summary=?, error=?, complete=?, reasoning=?,"
            " reasoning_runs=? WHERE id=?",
            (content, *_encoded(runs, summary), error, int(complete), reasoning,
             _runs_json(reasoning_runs), message_id))

    def delete_message(self, message_id: str) -> None:
        self._db.execute("DELETE FROM messages WHERE id=?", (message_id,))

    def restore(self, conversations: list[ChatContent]) -> None:
        """Write conversations kept in a recovery file (recovery.py), all or
        nothing: one that still exists gets exactly the messages it had on
        screen (the newest state), the others are added under their ids."""
        with self._transaction():
            for c in conversations:
                self._db.execute("DELETE FROM messages WHERE conversation_id=?", (c.id,))
                self.save(c)

    # -- export ----------------------------------------------------------
    def export_markdown(self, conversation_id: str) -> str:
        conv = self.get(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        out = [f"# {conv.title}", ""]
        if conv.target:
            pair = conv.target + (f" + {conv.draft}" if conv.draft else "")
            out += [f"*Models: {pair}*", ""]
        names = {"user": "You", "assistant": "Assistant", "system": "System"}
        for m in self.messages(conversation_id):
            out += [f"## {names.get(m.role, m.role.title())}", ""]
            if m.reasoning.strip():
                out += [_reasoning_block(m), ""]
            out += [m.content.rstrip(), ""]
            if m.summary:
                out += [f"*{m.summary.line()}*", ""]
                if m.summary.parts_line():
                    out += [f"*{m.summary.parts_line()}*", ""]
        return "\n".join(out).rstrip() + "\n"


def _reasoning_block(m: MessageContent) -> str:
    """A reply's reasoning as a collapsed block (HTML's <details>, which
    Markdown viewers fold), its text verbatim in a fence longer than any
    run of backticks in it, so nothing in it is read as Markdown or HTML."""
    numbers = m.summary.part(REASONING) if m.summary else None
    title = "Thinking" + (f" · {numbers.counts()}" if numbers else "")
    if m.summary is not None and m.summary.cut_off():
        title += f" · {m.summary.cut_off()}"
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", m.reasoning)), default=0))
    return (f"<details>\n<summary>{title}</summary>\n\n{fence}text\n"
            f"{m.reasoning.strip(chr(10)).rstrip()}\n{fence}\n\n</details>")


def _runs_json(runs: list[tuple[str, str]] | None) -> str | None:
    return json.dumps(runs, ensure_ascii=False, separators=(",", ":")) if runs else None


def _encoded(runs: list[tuple[str, str]] | None, summary: ReplySummary | None
             ) -> tuple[str | None, str | None]:
    """A message's runs and summary as their columns hold them (JSON)."""
    return _runs_json(runs), json.dumps(summary.to_json()) if summary else None


def _digest(messages: list[tuple[str, str]]) -> str:
    """A short hash of a conversation's text: an edit that keeps every
    length (and leaves ``updated_at`` alone) still changes it."""
    h = hashlib.sha1()
    for role, content in messages:
        h.update(role.encode())
        h.update(b"\0")
        h.update(content.encode("utf-8", "surrogatepass"))
        h.update(b"\1")
    return h.hexdigest()[:16]
