"""Compare's engine side: one prompt, plain then speculative, same settings.

Both runs go one after the other through the engine thread, so the only
difference between them is the decoding mode; with greedy sampling the two
texts must be identical. The dialog (compare.py) shows each run as it
streams and the outcome at the end.

While a Compare runs it holds the engine (``EngineController.hold``), so a
chat message sent meanwhile is refused with the reason instead of queueing
silently behind both runs; ``cancel`` stops the run going on now and skips
the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerationResult, Message, StepEvent
from specchat.errors import SpecChatError
from specchat.ui.conversation import ConversationController
from specchat.ui.requests import build_request, reply_summary
from specchat.ui.session import AppSession

NO_SPECULATION = ("This pair cannot decode speculatively, so there is nothing to compare.")
HOLDER = "Compare"


class CompareCancelled(SpecChatError):
    """The user cancelled a Compare (Cancel, or closing its window)."""


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


class CompareRunner:
    def __init__(self, session: AppSession, conversation: ConversationController):
        """``conversation``: the window's, whose reply must not be running."""
        self.session = session
        self.conversation = conversation
        self._cancelled = False
        self._task: asyncio.Future | None = None

    @property
    def busy(self) -> bool:
        """Something else has the engine: the chat's reply, or a load."""
        engine = self.session.engine
        return self.conversation.busy or engine.loading or (
            engine.held_by is not None and not self.running)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, prompt: str,
              on_phase: Callable[[modes.Mode], None] | None = None,
              on_step: Callable[[modes.Mode, StepEvent], None] | None = None
              ) -> asyncio.Future:
        """Begin both runs; the future's result is the CompareOutcome, or it
        raises EngineError, or CompareCancelled when cancelled. The engine is
        held from now on, before the first run is even submitted, so no
        chat message can slip in between."""
        self._cancelled = False
        engine = self.session.engine
        engine.hold(HOLDER)
        try:
            self._task = asyncio.ensure_future(self._released(prompt, on_phase, on_step))
        except BaseException:
            engine.release(HOLDER)
            raise
        # Also when the task is cancelled before it ever runs (no finally then).
        self._task.add_done_callback(lambda _f: engine.release(HOLDER))
        return self._task

    async def _released(self, prompt: str, on_phase, on_step) -> CompareOutcome:
        """The runs, the engine released as they end: by the time the task
        is done a chat message can go (a done callback runs a moment later,
        and a message sent in between was refused as if Compare still ran)."""
        try:
            return await self._run(prompt, on_phase, on_step)
        finally:
            self.session.engine.release(HOLDER)

    def cancel(self) -> None:
        """Stop the run going on now (the engine checks every step) and skip
        the rest; the future ends with CompareCancelled."""
        if not self.running:
            return
        self._cancelled = True
        self.session.engine.cancel_generation()

    async def _run(self, prompt: str, on_phase, on_step) -> CompareOutcome:
        engine, settings = self.session.engine, self.session.settings
        spec_mode = self.session.next_mode(speculative=True)
        if not spec_mode.speculative:
            raise EngineError(engine.pair.reason if engine.pair and engine.pair.reason
                              else NO_SPECULATION)
        history = [Message("user", prompt.strip())]
        results = []
        for mode in (self.session.next_mode(speculative=False), spec_mode):
            if self._cancelled:  # before its job was even submitted
                raise _cancelled(mode)
            if on_phase is not None:
                on_phase(mode)
            step = (lambda ev, m=mode: on_step(m, ev)) if on_step is not None else None
            try:
                request = build_request(settings, history, mode,
                                        self.conversation.request_effort())
                results.append(await engine.run(request, on_step=step))
            except EngineError:
                if not self._cancelled:  # else: stopped before its first step
                    raise
            if self._cancelled:
                raise _cancelled(mode)
        self.session.plain_speeds.note(engine.pair_key, reply_summary(results[0].summary))
        return CompareOutcome(prompt, results[0], results[1], settings.temperature <= 0)


def _cancelled(mode: modes.Mode) -> CompareCancelled:
    """What a cancel stopped, for the dialog's status line."""
    return CompareCancelled(
        "Compare cancelled: the speculative run was stopped." if mode.speculative
        else "Compare cancelled: the plain run was stopped and the speculative one skipped.")
