"""The pair picker's "Find the best draft": the library's search
(library/draft_search.py) run for the window.

The search blocks on engine jobs, so it runs in an executor thread, never on
the GUI thread; its progress comes back through the event loop. While it
runs it holds the engine (``EngineController.hold``): a chat message is
refused with the reason instead of queueing behind minutes of measuring, and
no pair is loaded meanwhile. Measuring loads each draft beside the target,
so the pair that was loaded before is loaded again at the end (cancelled or
not), through the controller, so the window, the history index and the
settings all see it.

The sample is the person's own recent prompts, read through the store's
thread, or built-in ones when the history is empty.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from PySide6.QtCore import QCoreApplication, QObject, Signal

from specchat.errors import SpecChatError
from specchat.library import draft_search
from specchat.library import recommendations as rec
from specchat.store.conversations import ConversationStore
from specchat.store.worker import Remote
from specchat.ui.engine_controller import EngineController

HOLDER = "Find the best draft"
log = logging.getLogger("specchat.ui")


class DraftFinder(QObject):
    progressed = Signal(str, float)  # what is being measured, fraction of the whole
    finished = Signal(object)  # Recommendation (``cancelled`` set when it was)
    failed = Signal(str)  # one line: the target could not be measured

    # The sample; the CLI's defaults (``specchat models recommend``).
    prompts = rec.DEFAULT_PROMPTS
    max_tokens = rec.DEFAULT_MAX_TOKENS
    HISTORY_CHATS = 20  # conversations read at most for the sample

    def __init__(self, engine: EngineController, conversations: Remote[ConversationStore],
                 parent: QObject | None = None):
        """``conversations``: where the person's recent prompts are read."""
        super().__init__(parent)
        self.engine = engine
        self.conversations = conversations
        self._cancelled = threading.Event()
        self._task: asyncio.Future | None = None
        self._running = False  # from start until the engine is released
        app = QCoreApplication.instance()
        if app is not None:  # quitting must not wait minutes for the executor thread
            app.aboutToQuit.connect(self.cancel)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def cancelling(self) -> bool:
        return self.running and self._cancelled.is_set()

    def busy_reason(self) -> str | None:
        """Why a search cannot start now, in words; None when it can."""
        engine = self.engine
        if self.running:
            return None
        if engine.held_by is not None:
            return f"{engine.held_by} is running: wait for it to finish or cancel it."
        if engine.loading:
            return "Wait for the models to finish loading."
        return None

    def start(self, target: str) -> asyncio.Future:
        """Measure the installed drafts for ``target``; ``finished`` or
        ``failed`` follows. The engine is held from now on."""
        reason = self.busy_reason()
        if reason is not None or self.running:
            raise SpecChatError(reason or "The search is already running.")
        self._cancelled = threading.Event()
        engine = self.engine
        engine.hold(HOLDER)
        self._running = True
        try:
            self._task = asyncio.ensure_future(self._run(target))
        except BaseException:
            self._running = False
            engine.release(HOLDER)
            raise
        return self._task

    def cancel(self) -> None:
        """Stop after the step running now (the engine checks every token);
        drafts measured so far stay remembered."""
        self._cancelled.set()

    async def _run(self, target: str) -> None:
        engine = self.engine
        loop = asyncio.get_running_loop()
        before = engine.pair_key if engine.pair is not None else None
        outcome: rec.Recommendation | None = None
        error: str | None = None

        def progress(p: draft_search.SearchProgress) -> None:  # on the search's thread
            loop.call_soon_threadsafe(self.progressed.emit, p.message, p.fraction)

        try:
            self.progressed.emit("Reading your recent prompts…", 0.0)
            sample = rec.Sample.choose(await self._history_prompts(), self.prompts)
            # again=True: a click asks for this machine's numbers now; the
            # remembered ones are what the draft list shows in between.
            outcome = await loop.run_in_executor(None, lambda: draft_search.search(
                engine.client, target, sample, again=True, max_tokens=self.max_tokens,
                cancelled=self._cancelled, progress=progress))
        except SpecChatError as exc:
            error = str(exc)
        finally:
            try:
                if before is not None:  # measuring left another draft loaded
                    self.progressed.emit("Loading your pair again…", 1.0)
                    await engine.load(*before)
            finally:
                self._running = False
                engine.release(HOLDER)
        if error is not None:
            self.failed.emit(error)
        else:
            self.finished.emit(outcome)

    async def _history_prompts(self) -> list[str]:
        """The person's recent prompts, newest first (none if the history
        cannot be read: the built-in prompts do then)."""
        store = self.conversations
        try:
            chats = []
            for c in (await store.list())[:self.HISTORY_CHATS]:
                chats.append([(m.role, m.content) for m in await store.messages(c.id)])
                if len(rec.recent_prompts(chats, self.prompts)) >= self.prompts:
                    break
        except SpecChatError as exc:
            log.warning("Find the best draft: the history could not be read (%s).", exc)
            return []
        return rec.recent_prompts(chats, self.prompts)
