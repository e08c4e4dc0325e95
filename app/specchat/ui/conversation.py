"""The open conversation: switching, sending (or keeping a message until
the models load), regenerating, editing the last turn, loading a pair when
no reply is under way, and keeping its rows in SQLite.

One reply streams at a time; its streaming, gauges and partial saves are a
Reply's (reply.py). This controller decides what is in the chat model and
what the history holds, through the store's own thread (store/worker.py):
reading a conversation is awaited, writes go on without the window waiting.

A chat and its messages get their ids where they are made (a new chat with
its first message), so nothing waits for the store to number a row, and
the history index knows the chat by that id from its first reply. The
thinking switch is the conversation's (``reasoning_effort``): written
with it, changed in place, read back when it opens. A turn's
rows are written in one call (the conversation's row with them, if new):
if it fails (a full disk), it fails once and is said once, its messages go
back to unsaved, and the next turn, or Retry, writes them again. What is
still unsaved at quit is handed to the session, which keeps it in a
recovery file.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from specchat.engine.events import GenerateRequest, Message
from specchat.store.conversations import ChatContent, MessageContent, new_id
from specchat.store.worker import report_failure
from specchat.ui import thinking
from specchat.ui.chat_model import ChatMessage, ChatModel
from specchat.ui.history_index import stored_key
from specchat.ui.reply import Reply
from specchat.ui.requests import build_request
from specchat.ui.session import AppSession

TITLE_CHARS = 48
NOT_SENT_CANCELLED = "Not sent: loading was cancelled. Your message is still here."
NOT_SENT_FAILED = "Not sent: the models did not load. Your message is still here."


def _chat_message(m: MessageContent) -> ChatMessage:
    return ChatMessage(m.role, m.content, [list(r) for r in m.runs], m.summary, m.error,
                       False, m.complete, m.id, saved=True, reasoning=m.reasoning,
                       reasoning_runs=[list(r) for r in m.reasoning_runs])


class ConversationController(QObject):
    generatingChanged = Signal(bool)
    gaugesChanged = Signal(object)  # GaugeValues
    replyFinished = Signal(object)  # ReplySummary
    errorRaised = Signal(str)
    conversationsChanged = Signal()
    conversationOpened = Signal(object)  # its id, or None for a new chat
    sent = Signal()  # a message was sent: the composer may let it go
    queueChanged = Signal(bool, str)  # a message waits for the models, or no longer (and why)
    effortChanged = Signal(str)  # the open conversation's thinking switch (a reasoning effort)

    def __init__(self, session: AppSession, model: ChatModel, parent=None):
        super().__init__(parent)
        self.session = session
        self.engine = session.engine
        self.store = session.conversations
        self.model = model
        self.conversation_id: str | None = None  # None: a new chat, until its first message
        self._opening: asyncio.Future | None = None
        self.queued: str | None = None  # a message sent while the models load
        self.reasoning_effort = ""  # the open conversation's thinking switch ("": the default)
        self.reply: Reply | None = None
        self.task: asyncio.Future | None = None
        self._failed_at_open = session.store.failed_writes
        session.keep_at_quit(self.unsaved)
        self.engine.loaded.connect(self._send_queued)
        self.engine.loadFailed.connect(self._load_failed)

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
    def open(self, conversation_id: str | None) -> None:
        """Show a conversation (None: a new, empty chat). Its messages are
        read on the store's thread and shown when they arrive."""
        if self.generating:
            self.stop()
        self.unqueue()  # it was written for the conversation that was open
        self.conversation_id = conversation_id
        self._failed_at_open = self.session.store.failed_writes
        self.model.set_messages([])
        self._opening = None
        self._set_effort("")  # until its own is read
        if conversation_id is None:
            self.conversationOpened.emit(None)
            return
        read = self._opening = self.store.read(conversation_id)
        read.add_done_callback(lambda f: self._show(conversation_id, f))

    def _show(self, conversation_id: str, read: asyncio.Future) -> None:
        if read is not self._opening:
            return  # another conversation was opened meanwhile
        self._opening = None
        if read.cancelled():
            return
        if read.exception() is not None:
            self.errorRaised.emit(f"Could not read this conversation: {read.exception()}")
        else:
            conv, messages = read.result()
            self.model.set_messages([_chat_message(m) for m in messages])
            effort = conv.reasoning_effort if conv is not None else ""
            self._set_effort(effort if thinking.keeps(effort) else "")
        self.conversationOpened.emit(conversation_id)

    def _set_effort(self, effort: str) -> None:
        if effort != self.reasoning_effort:
            self.reasoning_effort = effort
            self.effortChanged.emit(effort)

    def set_reasoning_effort(self, effort: str) -> None:
        """The thinking switch changed: the open conversation keeps it (a
        new chat writes it with its first message); the next reply uses it."""
        if effort == self.reasoning_effort or not thinking.keeps(effort):
            return
        self._set_effort(effort)
        if self.conversation_id is not None and self.session.saving:
            report_failure(self.store.set_reasoning_effort(self.conversation_id, effort),
                           self.errorRaised.emit, "save the thinking switch")

    def request_effort(self) -> str:
        """What the open conversation's switch asks the loaded model for."""
        pair = self.engine.pair
        return thinking.request_effort(pair.chat if pair is not None else None,
                                       self.reasoning_effort)

    def _title(self) -> str:
        first = next((m.text for m in self.model.messages if m.role == "user"), "")
        return " ".join(first.split())[:TITLE_CHARS] or "New chat"

    def _chat(self, messages: list[ChatMessage]) -> ChatContent:
        """``messages`` of the open chat as the store writes them."""
        return ChatContent(
            self.conversation_id, self._title(),
            [MessageContent(m.role, m.text, [(o, t) for o, t in m.runs], m.summary, m.error,
                            m.complete and not m.streaming, m.id, m.reasoning,
                            [(o, t) for o, t in m.reasoning_runs]) for m in messages],
            self.engine.target_ref, self.engine.draft_ref, self.reasoning_effort)

    def save_unsaved(self) -> None:
        """Write the messages on screen that are not in the history (said
        while it could not be opened, or whose write failed): once the
        history is back, nothing said meanwhile is lost. A reply still
        streaming is written when it ends."""
        if not self.busy and self.session.saving:
            self._save([m for m in self.model.messages if not m.saved])

    def _save(self, messages: list[ChatMessage]) -> None:
        """Queue ``messages``' rows, and the chat's if it is new, as one write
        the window does not wait for. If it fails, they go back to unsaved,
        so the next save writes them again instead of failing on them forever."""
        if not messages:
            return
        for m in messages:
            m.saved = True
        written = report_failure(self.store.save(self._chat(messages)), self.errorRaised.emit,
                                 "save this conversation")

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                for m in messages:
                    m.saved = False
            else:
                self.conversationsChanged.emit()  # the sidebar lists a new chat at once

        written.add_done_callback(done)

    def unsaved(self) -> ChatContent | None:
        """The chat on screen, if some of it may not be in the history: a
        message never written, or a write that failed since it was opened
        (the lock still held at quit, a full disk). Asked at quit, once the
        store's queue is done (AppSession.close), for the recovery file."""
        msgs = self.model.messages
        if not msgs or (all(m.saved for m in msgs)
                        and self.session.store.failed_writes == self._failed_at_open):
            return None
        return self._chat(msgs)

    # -- loading and waiting for it -------------------------------------------
    def load(self, target: str, draft: str | None) -> bool:
        """Load a pair, unless a reply or an opening conversation needs the
        engine, or another run holds it (then say why); whether it started."""
        holder = self.engine.held_by
        if self.busy:
            self.errorRaised.emit("Wait for the reply to finish (or stop it) before loading "
                                  "models.")
        elif holder is not None:
            self.errorRaised.emit(f"Wait for {holder} to finish (or cancel it) before loading "
                                  "models.")
        else:
            self.engine.load(target, draft)
            return True
        return False

    def unqueue(self, why: str = "") -> None:
        """The waiting message is not sent: it stays where it was written
        (``why`` says so there, if given)."""
        if self.queued is not None:
            self.queued = None
            self.queueChanged.emit(False, why)

    def _send_queued(self, *_args) -> None:
        text, self.queued = self.queued, None
        if text is not None:
            self.queueChanged.emit(False, "")
            self.send(text)

    def _load_failed(self, *_args) -> None:
        self.unqueue(NOT_SENT_CANCELLED if self.engine.load_cancelled else NOT_SENT_FAILED)

    # -- turns -------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Add a user message and start the reply; while the models load,
        keep it and send it once they are loaded (what a chat app does).
        Whether it was sent now (``sent`` says so too)."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self.engine.loading:
            self.queued = text
            self.queueChanged.emit(True, "")
            return False
        if not self.engine.ready:
            self.errorRaised.emit("No model is loaded yet: wait for loading to finish, or "
                                  "choose a pair above.")
            return False
        if self._held():
            return False
        if self.conversation_id is None:
            self.conversation_id = new_id()  # a chat is made by its first message
        self.model.append(ChatMessage("user", text))
        self._start_reply()
        self.sent.emit()
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
            if m.saved:
                report_failure(self.store.delete_message(m.id), self.errorRaised.emit,
                               "delete the old message")

    def stop(self) -> None:
        if self.reply is not None:
            self.reply.stop()  # also stops a reply whose engine run has not begun
        self.engine.cancel_generation()

    def _history(self) -> list[Message]:
        """The conversation for the template: a reply's answer as its text,
        its reasoning apart (the engine hands it to the template under the
        key the template reads, which decides what to keep of it: Qwen3's
        drops the reasoning of turns before the last question)."""
        return [Message(m.role, m.text, reasoning=m.reasoning) for m in self.model.messages
                if not m.streaming and not (m.role == "assistant" and not m.text)]

    def _start_reply(self) -> None:
        """Show the reply's bubble now; the task saves the turn's rows, then
        runs the engine."""
        mode = self.session.next_mode()
        # The history index's key: the chat's own id, from its first reply.
        request = replace(build_request(self.session.settings, self._history(), mode,
                                        self.request_effort()),
                          history_key=stored_key(self.conversation_id))
        msg = ChatMessage("assistant", "", streaming=True, complete=False)
        self.model.append(msg)
        reply = self.reply = Reply(msg, self.model, self.store, mode,
                                   self.session.plain_speeds.get(self.engine.pair_key), self)
        reply.gaugesChanged.connect(self.gaugesChanged)
        reply.errorRaised.connect(self.errorRaised)
        self.task = asyncio.ensure_future(self._turn(reply, request))
        self.generatingChanged.emit(True)

    async def _turn(self, reply: Reply, request: GenerateRequest) -> None:
        # The turn's rows (with any earlier ones not yet in the history, and
        # the reply's, empty so far) are queued before the first token and
        # every save of the reply after them, in order on the store's
        # thread; nothing waits for them, so the reply streams at once even
        # while another program holds the history's lock. While the history
        # cannot be written nothing is queued: the window says so, and
        # save_unsaved writes the chat once the history is back.
        queued = self.session.saving
        if queued:
            self._save([m for m in self.model.messages if not m.saved])
        summary = await reply.stream(self.engine, request)
        if summary is not None:
            self.session.plain_speeds.note(self.engine.pair_key, summary)
            self.replyFinished.emit(summary)
        self.reply = None
        if not queued:  # the history may have opened meanwhile (Retry)
            self.save_unsaved()
        self.conversationsChanged.emit()
        self.generatingChanged.emit(False)
