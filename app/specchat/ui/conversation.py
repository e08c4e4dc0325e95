"""The open conversation: switching, sending, regenerating, editing the
last turn, and keeping its rows in SQLite.

One reply streams at a time; its streaming, gauges and partial saves are a
Reply's (reply.py). This controller decides what is in the chat model and
what the history holds, through the store's own thread (store/worker.py):
reading a conversation is awaited, writes go on without the window waiting.
"""

from __future__ import annotations

import asyncio
import sqlite3

from PySide6.QtCore import QObject, Signal

from specchat.engine.events import GenerateRequest, Message
from specchat.store.conversations import StoredMessage
from specchat.store.worker import report_failure
from specchat.ui.chat_model import ChatMessage, ChatModel
from specchat.ui.reply import Reply
from specchat.ui.requests import build_request
from specchat.ui.session import AppSession

TITLE_CHARS = 48


def _chat_message(m: StoredMessage) -> ChatMessage:
    return ChatMessage(m.role, m.content, [list(r) for r in m.runs], m.summary, m.error,
                       False, m.complete, m.id)


class ConversationController(QObject):
    generatingChanged = Signal(bool)
    gaugesChanged = Signal(object)  # GaugeValues
    replyFinished = Signal(object)  # ReplySummary
    errorRaised = Signal(str)
    conversationsChanged = Signal()
    conversationOpened = Signal(int)

    def __init__(self, session: AppSession, model: ChatModel, parent=None):
        super().__init__(parent)
        self.session = session
        self.engine = session.engine
        self.store = session.conversations
        self.model = model
        self.conversation_id: int | None = None
        self._view = 0  # counts open() calls: a late read or create must not land in a newer view
        self._opening: asyncio.Future | None = None
        self.reply: Reply | None = None
        self.task: asyncio.Future | None = None

    # -- state -------------------------------------------------------------
    @property
    def generating(self) -> bool:
        return self.reply is not None

    @property
    def opening(self) -> bool:
        """A conversation's messages are still being read in."""
        return self._opening is not None

    @property
    def busy(self) -> bool:
        return self.generating or self.opening

    # -- conversations ---------------------------------------------------
    def open(self, conversation_id: int | None) -> None:
        """Show a conversation (None: a new, empty chat). Its messages are
        read on the store's thread and shown when they arrive."""
        if self.generating:
            self.stop()
        self.conversation_id = conversation_id
        self._view += 1
        self.model.set_messages([])
        if conversation_id is None:
            self._opening = None
            self.conversationOpened.emit(0)
            return
        view = self._view
        self._opening = self.store.messages(conversation_id)
        self._opening.add_done_callback(lambda f: self._show(view, conversation_id, f))

    def _show(self, view: int, conversation_id: int, read: asyncio.Future) -> None:
        if view != self._view:
            return  # another conversation was opened meanwhile
        self._opening = None
        if read.cancelled():
            return
        if read.exception() is not None:
            self.errorRaised.emit(f"Could not read this conversation: {read.exception()}")
        else:
            self.model.set_messages([_chat_message(m) for m in read.result()])
        self.conversationOpened.emit(conversation_id)

    async def _ensure_conversation(self, first_text: str) -> int:
        if self.conversation_id is not None:
            return self.conversation_id
        view = self._view
        title = " ".join(first_text.split())[:TITLE_CHARS] or "New chat"
        conv = await self.store.create(title, self.engine.target_ref, self.engine.draft_ref)
        if view == self._view:  # still showing this chat
            self.conversation_id = conv.id
        self.conversationsChanged.emit()
        return conv.id

    # -- turns -------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Add a user message and start the reply. False if it cannot start."""
        text = text.strip()
        if not text or self.busy:
            return False
        if not self.engine.ready:
            self.errorRaised.emit("No model is loaded yet: wait for loading to finish, or "
                                  "choose a pair above.")
            return False
        user = ChatMessage("user", text)
        self.model.append(user)
        self._start_reply(user)
        return True

    def regenerate(self) -> bool:
        """Replace the last reply with a new one."""
        if self.busy or not self.engine.ready:
            return False
        msgs = self.model.messages
        if not msgs or msgs[-1].role != "assistant":
            return False
        self._drop_from(len(msgs) - 1)
        self._start_reply()
        return True

    def take_last_turn(self) -> str | None:
        """Remove the last user message (and its reply) and return its text,
        for editing and sending again."""
        if self.busy:
            return None
        msgs = self.model.messages
        rows = [i for i, m in enumerate(msgs) if m.role == "user"]
        if not rows:
            return None
        text = msgs[rows[-1]].text
        self._drop_from(rows[-1])
        return text

    def _drop_from(self, row: int) -> None:
        for m in self.model.remove_from(row):
            if m.db_id is not None:
                report_failure(self.store.delete_message(m.db_id), self.errorRaised.emit,
                               "delete the old message")

    def stop(self) -> None:
        if self.reply is not None:
            self.reply.stop()  # also stops a reply whose engine run has not begun
        self.engine.cancel_generation()

    def _history(self) -> list[Message]:
        return [Message(m.role, m.text) for m in self.model.messages
                if not m.streaming and not (m.role == "assistant" and not m.text)]

    def _start_reply(self, user: ChatMessage | None = None) -> None:
        """Show the reply's bubble now; the task saves the turn's rows, then
        runs the engine (``user`` is a new message that still needs saving)."""
        mode = self.session.next_mode()
        request = build_request(self.session.settings, self._history(), mode)
        msg = ChatMessage("assistant", "", streaming=True, complete=False)
        self.model.append(msg)
        reply = self.reply = Reply(msg, self.model, self.store, mode,
                                   self.session.plain_speeds.get(self.engine.pair_key), self)
        reply.gaugesChanged.connect(self.gaugesChanged)
        reply.errorRaised.connect(self.errorRaised)
        self.task = asyncio.ensure_future(self._turn(reply, user, request))
        self.generatingChanged.emit(True)

    async def _turn(self, reply: Reply, user: ChatMessage | None,
                    request: GenerateRequest) -> None:
        # The reply's row exists before its first token, so every periodic
        # save has a row to update. Saving is one queued write (well under a
        # millisecond unless the disk stalls); the window stays live meanwhile.
        try:
            first = next((m.text for m in self.model.messages if m.role == "user"), "")
            conv = await self._ensure_conversation(first)
            if user is not None:
                user.db_id = await self.store.add_message(conv, "user", user.text)
            reply.message.db_id = await self.store.add_message(conv, "assistant", "",
                                                               complete=False)
        except sqlite3.Error as exc:
            self.errorRaised.emit(f"This conversation could not be saved: {exc}")
        summary = await reply.stream(self.engine, request)
        if summary is not None:
            self.session.plain_speeds.note(self.engine.pair_key, summary)
            self.replyFinished.emit(summary)
        self.reply = None
        self.conversationsChanged.emit()
        self.generatingChanged.emit(False)
