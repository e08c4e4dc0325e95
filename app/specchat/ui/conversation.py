"""The open conversation: switching, sending, regenerating, editing the
last turn, and keeping its rows in SQLite.

One reply streams at a time; its streaming, gauges and partial saves are a
Reply's (reply.py). This controller decides what is in the chat model and
what the history holds, through the store's own thread (store/worker.py):
reading a conversation is awaited, writes go on without the window waiting.

A row that could not be written (a full disk; a new chat whose creation
failed takes its rows with it) goes back to unsaved: the next turn, or
Retry, writes it again, and its failure is reported once. What is still
unsaved at quit is handed to the session, which keeps it in a recovery file.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from specchat.engine.events import GenerateRequest, Message
from specchat.store.conversations import StoredMessage
from specchat.store.recovery import UnsavedConversation, UnsavedMessage
from specchat.store.worker import Later, report_failure
from specchat.ui.chat_model import ChatMessage, ChatModel
from specchat.ui.history_index import new_chat_key, stored_key
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
        self._history_key: str | None = None
        self._view = 0  # counts open() calls: a late read or create must not land in a newer view
        self._opening: asyncio.Future | None = None
        self._creating: Later | None = None  # a new chat's id, while its row is queued
        self.reply: Reply | None = None
        self.task: asyncio.Future | None = None
        self._failed_at_open = session.store.failed_writes
        session.keep_at_quit(self.unsaved)

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
        # The history index's key for this conversation (history_index.py).
        self._history_key = stored_key(conversation_id) if conversation_id is not None else None
        self._creating = None
        self._view += 1
        self._failed_at_open = self.session.store.failed_writes
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

    def _title(self) -> str:
        first = next((m.text for m in self.model.messages if m.role == "user"), "")
        return " ".join(first.split())[:TITLE_CHARS] or "New chat"

    def _conversation_ref(self) -> int | Later:
        """The open conversation's id, or (for a new chat) the id its queued
        creation will have: nothing here waits for the store, so a locked
        history never holds up a reply."""
        if self.conversation_id is not None:
            return self.conversation_id
        if self._creating is None:
            view = self._view
            created = self.store.create(self._title(), self.engine.target_ref,
                                        self.engine.draft_ref)
            report_failure(created, self.errorRaised.emit, "save this conversation")
            creating = self._creating = Later(created, "id")
            created.add_done_callback(lambda f: self._created(view, creating, f))
        return self._creating

    def _created(self, view: int, creating: Later, created: asyncio.Future) -> None:
        if view != self._view or self._creating is not creating:
            if not created.cancelled() and created.exception() is None:
                self.conversationsChanged.emit()
            return  # another conversation is shown now
        self._creating = None  # on failure too: the next turn (or Retry) creates it again
        if created.cancelled() or created.exception() is not None:
            return  # its rows fail with it, and go back to unsaved (_queue_message)
        self.conversation_id = created.result().id
        if self._history_key is not None and self._history_key != stored_key(self.conversation_id):
            # The history index knows this chat by its session key so far.
            new = stored_key(self.conversation_id)
            self.session.history_index.rename(self._history_key, new)
            self._history_key = new
        self.conversationsChanged.emit()

    def save_unsaved(self) -> None:
        """Write the messages on screen that are not in the history (said
        while it could not be opened, or whose rows failed): once the history
        is back, nothing said meanwhile is lost. A reply still streaming is
        written when it ends."""
        if self.busy or not self.session.saving:
            return
        missing = [m for m in self.model.messages if m.db_id is None]
        if missing:
            conv = self._conversation_ref()
            for m in missing:
                self._queue_message(conv, m)

    def _queue_message(self, conv: int | Later, m: ChatMessage) -> None:
        """Queue ``m``'s row, and its reply state if it has one. If the row
        cannot be written, ``m`` goes back to unsaved (``db_id`` None), so
        the next save writes it again instead of failing on it forever."""
        added = self.store.add_message(conv, m.role, m.text, complete=m.complete)
        report_failure(added, self.errorRaised.emit, "save this conversation")
        ref = m.db_id = Later(added)

        def failed(f: asyncio.Future) -> None:
            if (f.cancelled() or f.exception() is not None) and m.db_id is ref:
                m.db_id = None

        added.add_done_callback(failed)
        if m.runs or m.summary is not None or m.error is not None:
            report_failure(
                self.store.update_message(ref, m.text, runs=m.runs, summary=m.summary,
                                          error=m.error, complete=m.complete),
                self.errorRaised.emit, "save this conversation")

    def unsaved(self) -> UnsavedConversation | None:
        """The chat on screen, if some of it may not be in the history: a
        message never written, or a write that failed since it was opened
        (the lock still held at quit, a full disk). Asked at quit, once the
        store's queue is done (AppSession.close), for the recovery file."""
        msgs = self.model.messages
        if not msgs or (all(m.db_id is not None for m in msgs)
                        and self.session.store.failed_writes == self._failed_at_open):
            return None
        return UnsavedConversation(
            self._saved_id(), self._title(),
            [UnsavedMessage(m.role, m.text, [(o, t) for o, t in m.runs], m.summary, m.error,
                            m.complete and not m.streaming) for m in msgs],
            self.engine.target_ref, self.engine.draft_ref)

    def _saved_id(self) -> int | None:
        """The open conversation's row, also when its creation ran but the
        event loop has not yet been told (at quit)."""
        if self.conversation_id is not None:
            return self.conversation_id
        source = self.session.store.source_of(self._creating.future) if self._creating else None
        if source is not None and source.done() and source.exception() is None:
            return source.result().id
        return None

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
        if self._held():
            return False
        self.model.append(ChatMessage("user", text))
        self._start_reply()
        return True

    def _held(self) -> bool:
        """Another run has the engine (Compare): a reply now would wait
        silently behind it, so say why it cannot start instead."""
        holder = self.engine.held_by
        if holder is not None:
            self.errorRaised.emit(f"{holder} is running: wait for it to finish or cancel it, "
                                  "then send again.")
        return holder is not None

    def regenerate(self) -> bool:
        """Replace the last reply with a new one."""
        if self.busy or not self.engine.ready or self._held():
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

    def _start_reply(self) -> None:
        """Show the reply's bubble now; the task saves the turn's rows, then
        runs the engine."""
        mode = self.session.next_mode()
        if self._history_key is None:
            self._history_key = new_chat_key()
        request = replace(build_request(self.session.settings, self._history(), mode),
                          history_key=self._history_key)
        msg = ChatMessage("assistant", "", streaming=True, complete=False)
        self.model.append(msg)
        reply = self.reply = Reply(msg, self.model, self.store, mode,
                                   self.session.plain_speeds.get(self.engine.pair_key), self)
        reply.gaugesChanged.connect(self.gaugesChanged)
        reply.errorRaised.connect(self.errorRaised)
        self.task = asyncio.ensure_future(self._turn(reply, request))
        self.generatingChanged.emit(True)

    async def _turn(self, reply: Reply, request: GenerateRequest) -> None:
        # The turn's rows (with any earlier ones not yet in the history) are
        # queued before the first token and every save of the reply after
        # them, in order on the store's thread; their ids are Later values
        # the store fills in, so the reply streams at once even while another
        # program holds the history's lock. While the history cannot be
        # written nothing is queued: the window says so, and save_unsaved
        # writes the chat once the history is back.
        queued = self.session.saving
        if queued:
            conv = self._conversation_ref()
            for m in self.model.messages:
                if m.db_id is None and m is not reply.message:
                    self._queue_message(conv, m)
            self._queue_message(conv, reply.message)  # empty, complete=False, so far
        summary = await reply.stream(self.engine, request)
        if summary is not None:
            self.session.plain_speeds.note(self.engine.pair_key, summary)
            self.replyFinished.emit(summary)
        self.reply = None
        if not queued:  # the history may have opened meanwhile (Retry)
            self.save_unsaved()
        self.conversationsChanged.emit()
        self.generatingChanged.emit(False)
