"""Conversations and their messages, in SQLite.

Messages carry what the UI needs to redraw a reply exactly as it was: the
text, the token-origin runs (for colouring accepted draft tokens) and the
reply's summary. A reply is saved while it streams with ``complete=0``; if
the app dies mid-reply, the partial text is still there on the next start.

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
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specchat import records
from specchat.store.summary import ReplySummary

if TYPE_CHECKING:  # recovery.py builds on this module's message type
    from specchat.store.recovery import UnsavedConversation


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    target: str | None = None
    draft: str | None = None


@dataclass
class MessageContent:
    """What a message holds, saved or not (recovery.py keeps unsaved ones)."""

    role: str
    content: str
    runs: list[tuple[str, str]] = field(default_factory=list)
    summary: ReplySummary | None = None
    error: str | None = None
    complete: bool = True


@dataclass
class StoredMessage(MessageContent):
    id: int = 0  # its row in the history


log = logging.getLogger("specchat.store")


def _history_name(conn: sqlite3.Connection) -> str:
    """How the log names this history: its file (a read-only copy and the
    app's own history are different files)."""
    file = next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "")
    return f"The history {file}" if file else "The history"


def _conversation(row: sqlite3.Row, where: str) -> Conversation | None:
    try:
        return Conversation(**records.fields_of(Conversation, dict(row)))
    except records.BadRecord as exc:
        records.report(log, f"{where}: conversation {row['id']} was skipped: {exc}.")
        return None


def _text_fields(row: sqlite3.Row, where: str) -> bool:
    """Whether a message row's role and text are text (else it is skipped, and said)."""
    for name in ("role", "content"):
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


def _complete(value: object) -> bool:
    if value is None:  # the column's default
        return True
    if value not in (0, 1) or isinstance(value, float):
        raise records.BadRecord(f"it is {records.described(value)}, not 0 or 1")
    return bool(value)


_PARTS = {"runs": _runs, "summary": _summary, "error": _error, "complete": _complete}


def _message(row: sqlite3.Row, where: str) -> StoredMessage | None:
    if not _text_fields(row, where):
        return None
    parts = {}
    for name, read in _PARTS.items():
        try:
            parts[name] = read(row[name])
        except records.BadRecord as exc:
            records.report(log, f"{where}: message {row['id']}: its {name} was dropped ({exc}).")
            parts[name] = read(None)
    return StoredMessage(row["role"], row["content"], id=row["id"], **parts)


class ConversationStore:
    def __init__(self, conn: sqlite3.Connection):
        self._db = conn
        self._where = _history_name(conn)

    def _conversations(self, rows: list[sqlite3.Row]) -> list[Conversation]:
        return [c for c in (_conversation(r, self._where) for r in rows) if c is not None]

    # -- conversations ---------------------------------------------------
    def create(self, title: str = "New chat", target: str | None = None,
               draft: str | None = None) -> Conversation:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, created_at, updated_at, target, draft) "
            "VALUES (?, ?, ?, ?, ?)", (title, now, now, target, draft))
        return Conversation(cur.lastrowid, title, now, now, target, draft)

    def get(self, conversation_id: int) -> Conversation | None:
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
                " AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated_at DESC, id DESC",
                (pattern,)).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        return self._conversations(rows)

    def rename(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?",
                         (title.strip() or "Untitled", conversation_id))

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def set_pair(self, conversation_id: int, target: str | None, draft: str | None) -> None:
        self._db.execute("UPDATE conversations SET target=?, draft=? WHERE id=?",
                         (target, draft, conversation_id))

    def _touch(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?",
                         (time.time(), conversation_id))

    def corpus(self) -> list[tuple[int, str, list[tuple[str, str]]]]:
        """Every conversation's text, as the engine's history index reads it:
        (id, stamp, [(role, content), ...]). The stamp changes whenever a
        message is added, edited or removed, so the index knows which
        conversations it must read again."""
        out: list[tuple[int, str, list[tuple[str, str]]]] = []
        rows = self._db.execute(
            "SELECT m.id AS id, m.conversation_id AS cid, m.role AS role, m.content AS content, "
            "c.updated_at AS updated FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id ORDER BY m.conversation_id, m.position, m.id")
        current: int | None = None
        for r in rows:
            if not _text_fields(r, self._where):
                continue
            if r["cid"] != current:
                current = r["cid"]
                out.append((current, str(r["updated"]), []))
            out[-1][2].append((r["role"], r["content"]))
        return [(cid, f"{updated}:{len(msgs)}:{_digest(msgs)}", msgs) for cid, updated, msgs in out]

    # -- messages --------------------------------------------------------
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id=? ORDER BY position, id",
            (conversation_id,)).fetchall()
        return [m for m in (_message(r, self._where) for r in rows) if m is not None]

    def add_message(self, conversation_id: int, role: str, content: str, *,
                    complete: bool = True) -> int:
        # One transaction, taking the write lock first: if another program
        # holds it, nothing is done and the store's thread can simply try
        # the whole call again (a half-done call would add the row twice).
        with self._transaction():
            pos = self._db.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id=?",
                (conversation_id,)).fetchone()[0]
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, position, role, content, complete,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, pos, role, content, int(complete), time.time()))
            self._touch(conversation_id)
        return cur.lastrowid

    @contextmanager
    def _transaction(self) -> Iterator[None]:
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

    def update_message(self, message_id: int, content: str, *,
                       runs: list[tuple[str, str]] | None = None,
                       summary: ReplySummary | None = None,
                       error: str | None = None, complete: bool = False) -> None:
        """Save a reply's current state (called while streaming and at the end)."""
        self._db.execute(
            "UPDATE messages SET content=?, runs=?, summary=?, error=?, complete=? WHERE id=?",
            (content, json.dumps(runs, ensure_ascii=False, separators=(",", ":")) if runs
             else None, json.dumps(summary.to_json()) if summary else None, error, int(complete),
             message_id))

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id=?", (message_id,))

    def restore(self, conversations: list[UnsavedConversation]) -> None:
        """Write conversations kept in a recovery file (recovery.py), all or
        nothing: one that still exists gets exactly the messages it had on
        screen, the others are added as new conversations."""
        with self._transaction():
            for c in conversations:
                if c.id is not None and self.get(c.id) is not None:
                    cid = c.id
                    self._db.execute("DELETE FROM messages WHERE conversation_id=?", (cid,))
                else:
                    cid = self.create(c.title, c.target, c.draft).id
                for m in c.messages:
                    row = self.add_message(cid, m.role, m.content, complete=m.complete)
                    self.update_message(row, m.content, runs=list(m.runs), summary=m.summary,
                                        error=m.error, complete=m.complete)
                self._touch(cid)

    # -- export ----------------------------------------------------------
    def export_markdown(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        out = [f"# {conv.title}", ""]
        if conv.target:
            pair = conv.target + (f" + {conv.draft}" if conv.draft else "")
            out += [f"*Models: {pair}*", ""]
        names = {"user": "You", "assistant": "Assistant", "system": "System"}
        for m in self.messages(conversation_id):
            out += [f"## {names.get(m.role, m.role.title())}", "", m.content.rstrip(), ""]
            if m.summary:
                out += [f"*{m.summary.line()}*", ""]
        return "\n".join(out).rstrip() + "\n"


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
