"""The conversation as a list model.

Streaming touches only the last row: ``append_text`` grows one message and
emits ``dataChanged`` for that row alone, so the cost of a token does not
depend on how long the conversation is. Rows hold ChatMessage objects; the
delegate reads them through MessageRole and caches their rendering by
(uid, version).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from specchat.store.conversations import new_id
from specchat.store.summary import ReplySummary

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

    @property
    def waiting(self) -> bool:
        """A reply whose first token has not come: the target is still reading
        the prompt (seconds for a long one), which the bubble says."""
        return self.streaming and self.steps == 0

    def _run(self, origin: str, text: str) -> None:
        if not text:
            return
        if self.runs and self.runs[-1][0] == origin:
            self.runs[-1][1] += text
        else:
            self.runs.append([origin, text])

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
