"""The engine seen from the Qt loop: loads and runs, never blocks.

EngineController owns the EngineClient (whose single thread does all MLX
work) and turns its Jobs into Qt signals and awaitables. Every job is read
with ``Job.result(on_event=...)``, the engine's one loop over a job's
events, so the window never matches event types itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from specchat import values
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    GenerateRequest,
    GenerationResult,
    LoadedPair,
    LoadProgress,
    StepEvent,
)
from specchat.library.engine_link import make_client


class EngineController(QObject):
    loadStarted = Signal(str, object)  # target, draft (or None)
    loadProgress = Signal(str, str, object)  # stage, message, fraction (or None)
    loaded = Signal(object)  # LoadedPair
    loadFailed = Signal(str)
    heldChanged = Signal()  # hold() or release(): held_by changed

    def __init__(self, client=None, parent=None):
        super().__init__(parent)
        self.client = client if client is not None else make_client()
        self.pair: LoadedPair | None = None
        self.target_ref: str | None = None
        self.draft_ref: str | None = None
        self._load_job = None
        self._gen_job = None
        self.loading = False
        self.load_cancelled = False
        self.held_by: str | None = None

    @property
    def ready(self) -> bool:
        return self.pair is not None and not self.loading

    @property
    def pair_key(self) -> tuple[str | None, str | None]:
        """The loaded pair's references: what per-pair records are keyed by."""
        return self.target_ref, self.draft_ref

    # -- loading -------------------------------------------------------------
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
        # A job superseded by a newer load says nothing any more.
        def progress(ev: LoadProgress) -> None:
            if job is self._load_job:
                self.loadProgress.emit(ev.stage, ev.message, ev.fraction)

        try:
            pair = await job.result(on_event=progress)
        except EngineError as exc:
            if job is self._load_job:
                self._load_ended()
                self.loadFailed.emit(str(exc))
            return
        if job is self._load_job:
            self._load_ended()
            self.pair, self.target_ref, self.draft_ref = pair, target, draft
            self.loaded.emit(pair)

    def _load_ended(self) -> None:
        self.loading = False
        self._load_job = None

    def cancel_load(self) -> None:
        if self._load_job is not None:
            self.load_cancelled = True
            self._load_job.cancel()

    # -- generating ------------------------------------------------------------
    async def run(self, request: GenerateRequest,
                  on_step: Callable[[StepEvent], None] | None = None) -> GenerationResult:
        """One generation; each StepEvent goes to ``on_step``. Raises
        EngineError with a readable message."""
        job = self.client.generate(request, loop=asyncio.get_running_loop())
        self._gen_job = job
        try:
            return await job.result(on_event=on_step)
        finally:
            if self._gen_job is job:
                self._gen_job = None

    async def prompt_cache(self, gb: float | None = None):
        """How the engine's cache of conversations put aside stands (its
        ``prompt_cache.CacheUse``: budget, held, conversations, switches),
        after setting its budget to ``gb`` GB if given. It waits its turn
        on the engine thread (behind a reply or a load), never blocking here."""
        budget = None if gb is None else int(gb * values.GB)
        return await self.client.prompt_cache(budget, asyncio.get_running_loop()).result()

    def hold(self, holder: str) -> None:
        """Reserve generation for ``holder`` (Compare, for both its runs):
        the engine thread runs jobs in order, so a chat reply asked for now
        would wait silently behind it; the conversation refuses it with
        the holder's name instead."""
        self.held_by = holder
        self.heldChanged.emit()

    def release(self, holder: str) -> None:
        if self.held_by == holder:
            self.held_by = None
            self.heldChanged.emit()

    def cancel_generation(self) -> None:
        if self._gen_job is not None:
            self._gen_job.cancel()

    def close(self) -> None:
        self.cancel_load()
        self.cancel_generation()
        self.client.close()
