"""Where a message is written: Enter sends, Shift+Enter starts a new line;
Send turns into Stop while a reply streams; Regenerate and Edit act on the
last turn."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class MessageEdit(QPlainTextEdit):
    submitted = Signal()

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                e.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
            return
        super().keyPressEvent(e)


class Composer(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal()
    editRequested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Composer")
        self.edit = MessageEdit()
        self.edit.setPlaceholderText("Message  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self.edit.setFixedHeight(72)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("SendButton")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("StopButton")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.setShortcut("Esc")
        self.stop_button.hide()
        self.regen_button = QPushButton("Regenerate")
        self.regen_button.setToolTip("Write the last reply again (Ctrl+R)")
        self.regen_button.setShortcut("Ctrl+R")
        self.edit_button = QPushButton("Edit last")
        self.edit_button.setToolTip("Put your last message back here to change and resend it")
        side = QVBoxLayout()
        side.setSpacing(4)
        side.addWidget(self.send_button)
        side.addWidget(self.stop_button)
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.regen_button)
        row.addWidget(self.edit_button)
        side.addLayout(row)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 10)
        lay.addWidget(self.edit, 1)
        lay.addLayout(side)
        self.edit.submitted.connect(self._send)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stopRequested)
        self.regen_button.clicked.connect(self.regenerateRequested)
        self.edit_button.clicked.connect(self.editRequested)
        self._generating = False
        self._can_send = True

    def _send(self) -> None:
        if self._generating or not self._can_send:
            return
        text = self.edit.toPlainText()
        if text.strip():
            self.sendRequested.emit(text)

    def text(self) -> str:
        return self.edit.toPlainText()

    def clear(self) -> None:
        self.edit.clear()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        self.edit.setFocus()
        cursor = self.edit.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.edit.setTextCursor(cursor)

    def set_state(self, generating: bool, can_send: bool, has_turn: bool) -> None:
        self._generating = generating
        self._can_send = can_send
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)
        self.send_button.setEnabled(can_send)
        self.regen_button.setEnabled(not generating and can_send and has_turn)
        self.edit_button.setEnabled(not generating and has_turn)
