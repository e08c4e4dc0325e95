"""Where a message is written: Enter sends, Shift+Enter starts a new line;
Send turns into Stop while a reply streams; Regenerate and Edit act on the
last turn. A message sent while the models load waits here, read-only,
with a line saying so and "Don't send" (the window sends it once loaded)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from specchat.ui.widgets import button, hbox, label, vbox

QUEUED = "Will be sent when the models are loaded."


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
    unqueueRequested = Signal()  # "Don't send" a message waiting for the models

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Composer")
        self.edit = MessageEdit()
        self.edit.setPlaceholderText("Message  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self.edit.setFixedHeight(72)
        self.send_button = button("Send", name="SendButton", clicked=self._send)
        self.stop_button = button("Stop", "Stop the reply (Esc)", name="StopButton",
                                  shortcut="Esc", clicked=self.stopRequested)
        self.stop_button.hide()
        self.regen_button = button("Regenerate", "Write the last reply again (Ctrl+R)",
                                   shortcut="Ctrl+R", clicked=self.regenerateRequested)
        self.edit_button = button("Edit last",
                                  "Put your last message back here to change and resend it",
                                  clicked=self.editRequested)
        self.note = label(name="ComposerNote", wrap=True)
        self.unqueue_button = button("Don't send", "Keep the message here instead of sending it "
                                     "once the models are loaded (Esc)", shortcut="Esc",
                                     clicked=self.unqueueRequested)
        self.note_bar = QWidget()
        hbox((self.note, 1), self.unqueue_button, parent=self.note_bar, margins=0)
        self.note_bar.hide()
        side = vbox(self.send_button, self.stop_button,
                    hbox(self.regen_button, self.edit_button, spacing=4), spacing=4)
        vbox(self.note_bar, hbox((self.edit, 1), side), parent=self, margins=(12, 8, 12, 10),
             spacing=4)
        self.edit.submitted.connect(self._send)
        self.edit.textChanged.connect(self._edited)
        self._generating = False
        self._queued = False
        self._state = (False, True, False, False)  # set_state's arguments

    def _send(self) -> None:
        """Enter or Send: always heard. What cannot start now (no model yet)
        the window queues or explains; nothing is dropped silently."""
        if self._generating or self._queued:
            return
        text = self.edit.toPlainText()
        if text.strip():
            self.sendRequested.emit(text)

    # -- waiting for the models ---------------------------------------------
    @property
    def queued(self) -> bool:
        return self._queued

    def set_queued(self, on: bool) -> None:
        """The message waits for the models: kept as written, read-only, with
        a line saying so and "Don't send"."""
        self._queued = on
        self.edit.setReadOnly(on)
        if on:
            self._show_note(QUEUED, unqueue=True)
        else:
            self.note_bar.hide()
        self.set_state(*self._state)

    def show_note(self, text: str) -> None:
        """A line above the message (why it was not sent); goes when edited."""
        self._show_note(text, unqueue=False)

    def _show_note(self, text: str, unqueue: bool) -> None:
        self.note.setText(text)
        self.unqueue_button.setVisible(unqueue)
        self.note_bar.show()

    def _edited(self) -> None:
        if not self._queued:
            self.note_bar.hide()

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

    def set_state(self, generating: bool, can_send: bool, has_turn: bool,
                  can_queue: bool = False) -> None:
        """``can_send``: a reply can start now; ``can_queue``: models are
        loading, so a message sent now waits for them."""
        self._generating = generating
        self._state = (generating, can_send, has_turn, can_queue)
        queued = self._queued
        self.send_button.setVisible(not generating and not queued)
        self.stop_button.setVisible(generating)
        self.send_button.setEnabled(can_send or can_queue)
        self.regen_button.setEnabled(not generating and not queued and can_send and has_turn)
        self.edit_button.setEnabled(not generating and not queued and has_turn)
