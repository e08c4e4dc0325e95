"""The conversation as a list model.

Streaming touches only the last row: ``append_events`` grows one message and
emits ``dataChanged`` for that row alone, so the cost of a token does not
depend on how long the conversation is. Rows hold ChatMessage objects; the
delegate reads them through MessageRole and caches their rendering by
(uid, version).

A reply comes in its parts (the engine's ``StepEvent.segments``): what the
model reasoned before it answered goes to ``reasoning``, the answer to
``text``, the markers that separate them to neither; each keeps the origins
of its tokens (``runs``, ``reasoning_runs``) for Colour tokens. Whether a
reply's Thinking section is open is the message's too (``thinking_open``):
open while the reasoning streams, folded once the answer starts, unless the
person opened or folded it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from specchat.engine.events import ANSWER, REASONING, StepEvent
from specchat.origins import TARGET
from specchat.store.conversations import new_id
from specchat.store.summary import PartNumbers, ReplySummary

MessageRole = Qt.ItemDataRole.UserRole + 1
_uids = itertools.count(1)

Index = QModelIndex | QPersistentModelIndex


@dataclass(eq=False)
class ChatMessage:
    role: str  # "user" or "assistant"
    text: str = ""
    runs: list[list[str]] = field(default_factory=list)  # [[origin, text], ...] merged
    summary: ReplySummary | None = None
    error: str | None = None
    streaming: bool = False
    complete: bool = True
    id: str = field(default_factory=new_id)  # its row's id in the history, from the start
    saved: bool = False  # its row is written, or queued to be (False again if that fails)
    version: int = 0
    uid: int = field(default_factory=lambda: next(_uids))
    steps: int = 0  # engine steps received; none yet while the prompt is read
    reasoning: str = ""  # what the reply reasoned before its answer (``text``)
    reasoning_runs: list[list[str]] = field(default_factory=list)
    thinking_shown: bool | None = None  # the person opened (True) or folded it; None: not yet
    live_parts: dict[str, PartNumbers] = field(default_factory=dict)  # while it streams

    @property
    def waiting(self) -> bool:
        """A reply whose first token has not come: the target is still reading
        the prompt (seconds for a long one), which the bubble says."""
        return self.streaming and self.steps == 0

    @property
    def thinking(self) -> bool:
        """The reply is still writing its reasoning (no answer yet)."""
        return self.streaming and bool(self.reasoning) and not self.text

    @property
    def thinking_open(self) -> bool:
        """The Thinking section shows its text: as the person left it, else
        while the reasoning streams, and in a reply that has no answer."""
        if self.thinking_shown is not None:
            return self.thinking_shown
        return self.thinking or (not self.streaming and not self.text.strip())

    def reasoning_numbers(self) -> PartNumbers | None:
        """The reasoning's tokens and time: the summary's once the reply
        ended, the live count while it streams."""
        if self.summary is not None:
            return self.summary.part(REASONING)
        return self.live_parts.get(REASONING)

    def _run(self, origin: str, text: str, runs: list[list[str]] | None = None) -> None:
        runs = self.runs if runs is None else runs
        if not text:
            return
        if runs and runs[-1][0] == origin:
            runs[-1][1] += text
        else:
            runs.append([origin, text])

    def add_event(self, ev: StepEvent) -> None:
        """One engine step: its text by part (the reasoning, the answer; a
        tool call's text comes back as answer when the window offered no
        tools), each piece tinted by the origin of the token that wrote it."""
        if not ev.segments and not ev.parts and ev.token_ids:  # a step of a reply not split
            self.add(ev.text, ev.origins, ev.pieces)
            return
        self.steps += 1
        n = len(ev.token_ids)
        tokens = (list(zip(ev.parts, ev.pieces, ev.origins, strict=True))
                  if len(ev.parts) == len(ev.pieces) == len(ev.origins) == n else [])
        for part in (REASONING, ANSWER):
            text = "".join(t for p, t in ev.segments if p == part)
            if not text:
                continue
            runs = _runs_of(text, [(piece, o) for p, piece, o in tokens if p == part])
            if not (self.reasoning if part == REASONING else self.text):
                runs = _lstripped(runs)  # a part starts at its first word
            target = self.reasoning_runs if part == REASONING else self.runs
            for origin, piece in runs:
                self._run(origin, piece, target)
            joined = "".join(piece for _, piece in runs)
            if part == REASONING:
                self.reasoning += joined
            else:
                self.text += joined
        self.version += 1

    def add(self, text: str, origins: tuple[str, ...] | None = None,
            pieces: tuple[str, ...] = ()) -> None:
        """Append streamed text; ``origins`` (and ``pieces``, the text each
        token released) decide how it is tinted in the colour-by-origin view."""
        self.text += text
        self.steps += 1
        if not text:
            pass
        elif origins and len(pieces) == len(origins):
            for origin, piece in zip(origins, pieces, strict=True):
                self._run(origin, piece)
        else:
            self._run("target", text)
        self.version += 1


def _runs_of(text: str, tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``text`` (one part of a step) cut into (origin, piece): each token's
    own text where it is next in ``text`` (a marker's is not: it is in no
    part), the rest to the part's last token (text one token held back and
    the next released)."""
    out, at, last = [], 0, tokens[-1][1] if tokens else TARGET
    for piece, origin in tokens:
        if piece and text.startswith(piece, at):
            out.append((origin, piece))
            at += len(piece)
    if at < len(text):
        out.append((last, text[at:]))
    return out


def _lstripped(runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``runs`` without the whitespace they start with (Qwen3 writes
    "\n\n" after </think>; the answer starts at its first word)."""
    while runs and not runs[0][1].strip():
        runs = runs[1:]
    if runs:
        runs = [(runs[0][0], runs[0][1].lstrip()), *runs[1:]]
    return runs


class ChatModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._messages: list[ChatMessage] = []

    # -- Qt interface ----------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._messages)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._messages):
            return None
        msg = self._messages[index.row()]
        if role == MessageRole:
            return msg
        if role == Qt.ItemDataRole.DisplayRole:
            return msg.text
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        return Qt.ItemFlag.ItemIsEnabled

    # -- editing ---------------------------------------------------------
    @property
    def messages(self) -> list[ChatMessage]:
        return self._messages

    def message(self, row: int) -> ChatMessage:
        return self._messages[row]

    def set_messages(self, messages: list[ChatMessage]) -> None:
        self.beginResetModel()
        self._messages = list(messages)
        self.endResetModel()

    def append(self, msg: ChatMessage) -> int:
        row = len(self._messages)
        self.beginInsertRows(QModelIndex(), row, row)
        self._messages.append(msg)
        self.endInsertRows()
        return row

    def append_text(self, row: int, text: str, origins: tuple[str, ...] | None = None,
                    pieces: tuple[str, ...] = ()) -> None:
        self.append_steps(row, [(text, origins, pieces)])

    def append_steps(self, row: int,
                     steps: list[tuple[str, tuple[str, ...], tuple[str, ...]]]) -> None:
        """Several engine steps (text, origins, pieces) at once, as one change of one row."""
        msg = self._messages[row]
        for text, origins, pieces in steps:
            msg.add(text, origins, pieces)
        self._changed(row)

    def append_events(self, row: int, events: list[StepEvent],
                      live_parts: dict[str, PartNumbers] | None = None) -> None:
        """Several engine steps at once (and the parts' numbers so far), as
        one change of one row."""
        msg = self._messages[row]
        for ev in events:
            msg.add_event(ev)
        if live_parts is not None:
            msg.live_parts = live_parts
        self._changed(row)

    def set_thinking_shown(self, row: int, shown: bool) -> None:
        """The person opened or folded a reply's Thinking section."""
        self.update(row, thinking_shown=shown)

    def update(self, row: int, **fields) -> None:
        msg = self._messages[row]
        for k, v in fields.items():
            setattr(msg, k, v)
        msg.version += 1
        self._changed(row)

    def remove_from(self, row: int) -> list[ChatMessage]:
        """Drop rows ``row..end`` (regenerate, edit-and-resend)."""
        if row >= len(self._messages):
            return []
        self.beginRemoveRows(QModelIndex(), row, len(self._messages) - 1)
        removed = self._messages[row:]
        del self._messages[row:]
        self.endRemoveRows()
        return removed

    def refresh_all(self) -> None:
        """Theme or colouring changed: every row must be drawn again."""
        for m in self._messages:
            m.version += 1
        if self._messages:
            self.dataChanged.emit(self.index(0), self.index(len(self._messages) - 1))

    def _changed(self, row: int) -> None:
        idx = self.index(row)
        self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DisplayRole, MessageRole])
