"""One streamed reply, from its first step to its saved summary.

Steps are coalesced (~30 updates a second) so a fast engine cannot flood the
view: they collect here and reach the chat model as one change of one row.
The gauges follow each flush, and the partial reply is saved at most every
250 ms and once at the end, so a crash loses at most the last moment of it.
Saving goes through the store's own thread and is not waited for: a write
waiting on the disk must not freeze the window.
"""

from __future__ import annotations

import asyncio
import time

from PySide6.QtCore import QObject, Signal

from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerateRequest, StepEvent
from specchat.store.conversations import ConversationStore
from specchat.store.summary import ReplySummary
from specchat.store.worker import Remote, report_failure
from specchat.ui.chat_model import ChatMessage, ChatModel
from specchat.ui.engine_controller import EngineController
from specchat.ui.requests import reply_summary
from specchat.ui.stats import LiveStats

FLUSH_S = 0.033
SAVE_S = 0.25
STOPPED = "Stopped."


class Reply(QObject):
    gaugesChanged = Signal(object)  # GaugeValues
    errorRaised = Signal(str)

    def __init__(self, message: ChatMessage, model: ChatModel, store: Remote[ConversationStore],
                 mode: modes.Mode, speed_base: float | None = None, parent=None):
        """``message`` is the reply's bubble, already in ``model``;
        ``speed_base`` is the plain speed "vs plain" compares with."""
        super().__init__(parent)
        self.message = message
        self.model = model
        self.store = store
        self.live = LiveStats(mode)
        self._base = speed_base
        self._pending: list[StepEvent] = []
        self._flush_scheduled = False
        self._saved_at = time.monotonic()
        self._stopped = False

    def stop(self) -> None:
        """Stop before the engine run begins (its rows may still be saving);
        a run already going is stopped through the engine."""
        self._stopped = True

    async def stream(self, engine: EngineController, request: GenerateRequest
                     ) -> ReplySummary | None:
        """Run the request into the bubble; the summary, or None if the
        reply failed or was stopped before it began."""
        summary = error = None
        self.live.fixed_k = request.draft.k  # the K gauge says whether K is adaptive
        if self._stopped:
            error = STOPPED
        else:
            try:
                result = await engine.run(request, on_step=self._step)
                summary = reply_summary(result.summary)
            except EngineError as exc:
                # Stopped before the first step (e.g. while the chat template
                # renders) ends the job as a failure; the user asked for it.
                error = STOPPED if self._stopped else str(exc)
            except asyncio.CancelledError:
                error = STOPPED
                engine.cancel_generation()
        self._flush()
        self._finish(summary, error)
        return summary

    def _row(self) -> int | None:
        """The bubble's row, or None once another conversation is shown."""
        msgs = self.model.messages
        return msgs.index(self.message) if self.message in msgs else None

    def _step(self, ev: StepEvent) -> None:
        self.live.add(ev)
        self._pending.append(ev)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        row = self._row()
        if not self._pending or row is None:
            return
        self.model.append_events(row, self._pending, self.live.part_numbers())
        self._pending = []
        self.gaugesChanged.emit(self.live.values(self._base))
        now = time.monotonic()
        if now - self._saved_at >= SAVE_S:
            self._saved_at = now
            self.save(complete=False)

    def _finish(self, summary: ReplySummary | None, error: str | None) -> None:
        row = self._row()
        if row is not None:
            self.model.update(row, streaming=False, complete=True, summary=summary, error=error)
            self.save(complete=True)
        if summary is not None:
            self.gaugesChanged.emit(self.live.values(self._base, live=False))
        if error and error != STOPPED:
            self.errorRaised.emit(error)

    def save(self, complete: bool) -> None:
        """Queue the reply's current state; the window does not wait for it.
        After the window closed the store refuses it, and the last periodic
        save stands (the reply shows as interrupted)."""
        msg = self.message
        if not msg.saved:
            return  # its row could not be written (said then): the next turn writes it whole
        report_failure(
            self.store.update_message(msg.id, msg.text, runs=msg.runs, summary=msg.summary,
                                      error=msg.error, complete=complete,
                                      reasoning=msg.reasoning, reasoning_runs=msg.reasoning_runs),
            self.errorRaised.emit, "save the reply")
