"""The asyncio side of the window: talks to the engine, never blocks.

EngineController owns the EngineClient (whose single thread does all MLX
work) and turns its Jobs into Qt signals. ChatController runs one reply at a
time: it streams StepEvents into the chat model (coalesced to ~30 updates a
second, so a fast engine cannot flood the view), feeds the gauges, and saves
the partial reply to SQLite at most every 250 ms and once at the end. Every
store call goes through the store's own thread (store/worker.py): a write
waiting on the disk must not freeze the window.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import asdict, dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from specchat.engine.errors import EngineError
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    GenerationResult,
    LoadedPair,
    LoadProgress,
    Message,
    SamplingParams,
    StepEvent,
)
from specchat.engine.worker import JobDone, JobFailed
from specchat.store.conversations import ConversationStore
from specchat.store.settings import AppSettings
from specchat.store.worker import Remote, report_failure
from specchat.ui.chat_model import ChatMessage, ChatModel
from specchat.ui.gauges import LiveStats
from specchat.ui.lag import LagMonitor

FLUSH_S = 0.033
SAVE_S = 0.25


def _default_client():
    from specchat.library.engine_link import make_client

    return make_client()


class EngineController(QObject):
    loadStarted = Signal(str, object)  # target, draft (or None)
    loadProgress = Signal(str, str, object)  # stage, message, fraction (or None)
    loaded = Signal(object)  # LoadedPair
    loadFailed = Signal(str)

    def __init__(self, client=None, parent=None):
        super().__init__(parent)
        self.client = client if client is not None else _default_client()
        self.pair: LoadedPair | None = None
        self.target_ref: str | None = None
        self.draft_ref: str | None = None
        self._load_job = None
        self._gen_job = None
        self.loading = False
        self.load_cancelled = False

    @property
    def ready(self) -> bool:
        return self.pair is not None and not self.loading

    def load(self, target: str, draft: str | None) -> asyncio.Future:
        """Start loading a pair (the loop must be running)."""
        self.cancel_load()
        self.loading = True
        self.load_cancelled = False
        job = self.client.load(target, draft, loop=asyncio.get_running_loop())
        self._load_job = job  # set now, so Cancel works before the task first runs
        self.loadStarted.emit(target, draft)
        return asyncio.ensure_future(self._load(job, target, draft))

    async def _load(self, job, target: str, draft: str | None) -> None:
        async for ev in job:
            if job is not self._load_job:  # superseded by a newer load
                continue
            if isinstance(ev, LoadProgress):
                self.loadProgress.emit(ev.stage, ev.message, ev.fraction)
            elif isinstance(ev, JobDone):
                self.loading = False
                self._load_job = None
                self.pair, self.target_ref, self.draft_ref = ev.result, target, draft
                self.loaded.emit(ev.result)
            elif isinstance(ev, JobFailed):
                self.loading = False
                self._load_job = None
                self.loadFailed.emit(ev.message)

    def cancel_load(self) -> None:
        if self._load_job is not None:
            self.load_cancelled = True
            self._load_job.cancel()

    async def run(self, request: GenerateRequest, on_step=None) -> GenerationResult:
        """One generation; raises EngineError with a readable message."""
        job = self.client.generate(request, loop=asyncio.get_running_loop())
        self._gen_job = job
        try:
            async for ev in job:
                if isinstance(ev, StepEvent):
                    if on_step is not None:
                        on_step(ev)
                elif isinstance(ev, JobDone):
                    return ev.result
                elif isinstance(ev, JobFailed):
                    raise EngineError(ev.message)
        finally:
            if self._gen_job is job:
                self._gen_job = None
        raise EngineError("The engine stopped without an answer.")

    def cancel_generation(self) -> None:
        if self._gen_job is not None:
            self._gen_job.cancel()

    def close(self) -> None:
        self.cancel_load()
        self.cancel_generation()
        self.client.close()


def decode_mode(settings: AppSettings, pair: LoadedPair | None, speculative: bool | None = None
                ) -> str:
    """The engine mode for a reply: plain when speculation is off or cannot
    run on this pair, prompt lookup without a draft, hybrid with one."""
    on = settings.speculative if speculative is None else speculative
    if not on or pair is None or not pair.speculative_ok:
        return "plain"
    return "hybrid" if pair.draft is not None else "lookup"


def build_request(settings: AppSettings, history: list[Message], mode: str) -> GenerateRequest:
    messages = []
    if settings.system_prompt.strip():
        messages.append(Message("system", settings.system_prompt.strip()))
    messages.extend(history)
    return GenerateRequest(
        messages=tuple(messages),
        max_tokens=settings.max_tokens,
        sampling=SamplingParams(settings.temperature, settings.top_p, settings.top_k,
                                settings.seed),
        draft=DraftSettings(mode=mode, k=settings.k),
    )


@dataclass(frozen=True)
class CompareOutcome:
    prompt: str
    plain: GenerationResult
    speculative: GenerationResult
    greedy: bool

    @property
    def speedup(self) -> float:
        base = self.plain.summary.tokens_per_s
        return self.speculative.summary.tokens_per_s / base if base else 0.0

    @property
    def identical(self) -> bool:
        return self.plain.token_ids == self.speculative.token_ids


class ChatController(QObject):
    generatingChanged = Signal(bool)
    gaugesChanged = Signal(object)  # GaugeValues
    replyFinished = Signal(object)  # summary dict
    errorRaised = Signal(str)
    conversationsChanged = Signal()
    conversationOpened = Signal(int)

    def __init__(self, engine: EngineController, store: Remote[ConversationStore], model: ChatModel,
                 settings, lag: LagMonitor | None = None, parent=None):
        """``settings`` is a callable returning the current AppSettings."""
        super().__init__(parent)
        self.engine = engine
        self.store = store
        self.model = model
        self._settings = settings
        self.lag = lag or LagMonitor()
        self.conversation_id: int | None = None
        self._view = 0  # counts open() calls: a late read or create must not land in a newer view
        self._opening: asyncio.Future | None = None
        self._stop_requested = False
        self.task: asyncio.Future | None = None
        self.generating = False
        self.live: LiveStats | None = None
        self.plain_tps: dict[tuple, float] = {}  # (target, draft) -> last plain tok/s
        self.last_reply_lag = None

    # -- conversations ---------------------------------------------------
    @property
    def opening(self) -> bool:
        """A conversation's messages are still being read in."""
        return self._opening is not None

    @property
    def busy(self) -> bool:
        return self.generating or self.opening

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
            self.model.set_messages([
                ChatMessage(m.role, m.content, [list(r) for r in m.runs], m.summary, m.error,
                            False, m.complete, m.id) for m in read.result()])
        self.conversationOpened.emit(conversation_id)

    async def _ensure_conversation(self, first_text: str) -> int:
        if self.conversation_id is not None:
            return self.conversation_id
        view = self._view
        title = " ".join(first_text.split())[:48] or "New chat"
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
        self._stop_requested = True  # also stops a reply whose engine run has not begun
        self.engine.cancel_generation()

    def _history(self) -> list[Message]:
        out = []
        for m in self.model.messages:
            if m.streaming or (m.role == "assistant" and not m.text):
                continue
            out.append(Message(m.role, m.text))
        return out

    def _start_reply(self, user: ChatMessage | None = None) -> None:
        """Show the reply's bubble now; the task saves the turn's rows, then
        runs the engine (``user`` is a new message that still needs saving)."""
        settings = self._settings()
        mode = decode_mode(settings, self.engine.pair)
        request = build_request(settings, self._history(), mode)
        msg = ChatMessage("assistant", "", streaming=True, complete=False)
        self.model.append(msg)
        self.generating = True
        self._stop_requested = False
        self.task = asyncio.ensure_future(self._turn(msg, user, request, mode))
        self.generatingChanged.emit(True)

    async def _turn(self, msg: ChatMessage, user: ChatMessage | None,
                    request: GenerateRequest, mode: str) -> None:
        # The reply's row exists before its first token, so every periodic
        # save has a row to update. Saving is one queued write (well under a
        # millisecond unless the disk stalls); the window stays live meanwhile.
        try:
            first = next((m.text for m in self.model.messages if m.role == "user"), "")
            conv = await self._ensure_conversation(first)
            if user is not None:
                user.db_id = await self.store.add_message(conv, "user", user.text)
            msg.db_id = await self.store.add_message(conv, "assistant", "", complete=False)
        except sqlite3.Error as exc:
            self.errorRaised.emit(f"This conversation could not be saved: {exc}")
        await self._reply(msg, request, mode)

    def _pair_key(self) -> tuple:
        return (self.engine.target_ref, self.engine.draft_ref)

    async def _reply(self, msg: ChatMessage, request: GenerateRequest, mode: str) -> None:
        live = self.live = LiveStats(mode)
        base = self.plain_tps.get(self._pair_key())
        pending: list[tuple[str, tuple[str, ...]]] = []
        loop = asyncio.get_running_loop()
        state = {"scheduled": False, "saved": time.monotonic()}
        started = time.monotonic()

        def flush() -> None:
            state["scheduled"] = False
            if pending and msg in self.model.messages:
                self.model.append_steps(self.model.messages.index(msg), pending)
                pending.clear()
                self.gaugesChanged.emit(live.values(base))
                now = time.monotonic()
                if now - state["saved"] >= SAVE_S:
                    state["saved"] = now
                    self._save(msg, complete=False)

        def on_step(ev: StepEvent) -> None:
            live.add(ev)
            pending.append((ev.text, ev.origins, ev.pieces))
            if not state["scheduled"]:
                state["scheduled"] = True
                loop.call_later(FLUSH_S, flush)

        summary: dict[str, Any] | None = None
        error = None
        if self._stop_requested:  # stopped while its rows were being saved
            error = "Stopped."
        else:
            try:
                result = await self.engine.run(request, on_step)
                summary = asdict(result.summary)
            except EngineError as exc:
                error = str(exc)
            except asyncio.CancelledError:
                error = "Stopped."
                self.engine.cancel_generation()
        flush()
        self.last_reply_lag = self.lag.stats(since=started)
        if msg in self.model.messages:
            r = self.model.messages.index(msg)
            self.model.update(r, streaming=False, complete=True, summary=summary, error=error)
            self._save(msg, complete=True)
        if summary is not None:
            if summary["mode"] == "plain" and summary["new_tokens"] >= 8:
                self.plain_tps[self._pair_key()] = summary["tokens_per_s"]
            final = live.values(base, live=False)
            self.gaugesChanged.emit(final)
            self.replyFinished.emit(summary)
        if error and error != "Stopped.":
            self.errorRaised.emit(error)
        self.generating = False
        self.conversationsChanged.emit()
        self.generatingChanged.emit(False)

    def _save(self, msg: ChatMessage, complete: bool) -> None:
        """Queue the reply's current state; the window does not wait for it.
        After the window closed the store refuses it, and the last periodic
        save stands (the reply shows as interrupted)."""
        if msg.db_id is None:
            return  # its row could not be written: the error was shown then
        report_failure(
            self.store.update_message(msg.db_id, msg.text, runs=msg.runs, summary=msg.summary,
                                      error=msg.error, complete=complete),
            self.errorRaised.emit, "save the reply")

    # -- compare -----------------------------------------------------------
    async def compare(self, prompt: str, on_phase=None) -> CompareOutcome:
        """The same prompt, plain then speculative, with the same settings."""
        settings = self._settings()
        history = [Message("user", prompt.strip())]
        spec_mode = decode_mode(settings, self.engine.pair, speculative=True)
        if spec_mode == "plain":
            raise EngineError(self.engine.pair.reason if self.engine.pair and
                              self.engine.pair.reason else
                              "This pair cannot decode speculatively, so there is nothing to "
                              "compare.")
        results = []
        for mode in ("plain", spec_mode):
            if on_phase is not None:
                on_phase(mode)
            results.append(await self.engine.run(build_request(settings, history, mode)))
        if results[0].summary.new_tokens >= 8:
            self.plain_tps[self._pair_key()] = results[0].summary.tokens_per_s
        return CompareOutcome(prompt, results[0], results[1], settings.temperature <= 0)
