"""Training a draft head from the window (the model manager's "Train a
draft head" row): the same training as ``specchat heads train``, for the
loaded target, on the person's conversations and the installed packages'
text (library/trained_heads.py), run as an engine job.

The engine is held while it trains (as Compare holds it), so a chat
message is refused with the reason instead of waiting silently behind an
hour of training. Cancel stops the job at its next step with a checkpoint
saved; training again for the same target goes on from it (Resume).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from specchat.engine.events import TrainPlan, TrainProgress
from specchat.library import trained_heads
from specchat.library.errors import LibraryError
from specchat.library.index import InstalledModel

HOLDER = "Training a draft head"
MAX_CHARS = 4_000_000  # text read from files, at most (as the command line's default)
# The window's words for TrainPlan.restart_how (the model manager's checkbox),
# and for what to do when the head's folder in the library is not the head's.
RESTART = "tick Start over and train again"
ELSEWHERE = "move that folder away to train a head for this target here"


STAGES = {  # what a stage says on the line, before the counts ("" says nothing)
    "preparing": "preparing",
    "measuring": "labelling the held-out pieces",
    "labelling": "",
    "training": "",
    "checkpoint": "checkpoint saved",
    "done": "",
}


def progress_text(p: TrainProgress, measured: tuple[float, ...] = (),
                  measured_at: int | None = None) -> str:
    """What the row under the progress bar says. ``measured`` is the last
    held-out acceptance measured before ``p`` (at update ``measured_at``),
    shown while ``p`` brings none of its own (ProgressLine keeps it)."""
    stage = STAGES.get(p.stage, p.stage.replace("_", " "))
    parts = [stage] if stage else []
    parts += [f"{p.tokens:,} tokens labelled", f"{p.step:,} updates",
              f"{p.elapsed_s / 60:.1f} of {p.budget_s / 60:.0f} min"]
    accept, at = (p.accept, p.step) if p.accept else (measured, measured_at)
    if accept:
        parts.append("held-out acceptance by position "
                     + " ".join(f"{a:.0%}" for a in accept)
                     + (f" (at update {at:,})" if at is not None and at != p.step else ""))
    if p.message:
        parts.append(p.message)
    return " · ".join(parts)


class ProgressLine:
    """The progress line of one run: each event's counts, with the last
    held-out acceptance measured (only "checkpoint" and "done" events, and
    the untrained head's first one, carry it) kept on the line until a
    newer measurement replaces it."""

    def __init__(self):
        self.accept: tuple[float, ...] = ()
        self.at: int | None = None  # the update it was measured at
        self.last: TrainProgress | None = None

    def update(self, p: TrainProgress) -> str:
        text = progress_text(p, self.accept, self.at)
        if p.accept:
            self.accept, self.at = tuple(p.accept), p.step
        self.last = p
        return text

    def accept_text(self) -> str:
        """The last measurement, "40% 21%", or "" before the first."""
        return " ".join(f"{a:.0%}" for a in self.accept)


class HeadTraining:
    """The session's side of training: what is loaded, the engine's hold,
    the data, the job. The model manager shows it (a TaskRow)."""

    def __init__(self, session):
        self.session = session
        self._job = None
        self._cancelled = False  # Cancel before the job exists (the texts are being read)

    @property
    def target(self) -> str | None:
        engine = self.session.engine
        return engine.target_ref if engine.ready else None

    @property
    def running(self) -> bool:
        return self.session.engine.held_by == HOLDER

    def refusal(self) -> str | None:
        """Why training cannot start now, in words; None when it can."""
        engine = self.session.engine
        if engine.loading:
            return "A model is loading: train once it has loaded."
        if self.target is None:
            return "Load a model first: a head is trained for the loaded target."
        if engine.held_by is not None:
            return f"{engine.held_by} is running: wait for it to finish or cancel it."
        try:
            trained_heads.head_folder(self.out(), ELSEWHERE)
        except LibraryError as exc:  # a model or a folder of the person's has its name
            return str(exc)
        return None

    def out(self) -> Path | None:
        return trained_heads.default_out(self.target) if self.target else None

    def cancel(self) -> None:
        self._cancelled = True
        if self._job is not None:
            self._job.cancel()

    async def run(self, minutes: float, on_progress: Callable[[TrainProgress], None],
                  max_steps: int | None = None, restart: bool = False) -> InstalledModel | None:
        """Train for ``minutes`` more (or up to ``max_steps`` updates in all;
        with ``restart``, from scratch in place of the checkpoint) and list
        the head; None when cancelled before anything was saved. Raises
        BadValue, EngineError or LibraryError with a readable message, the
        first two before anything is read."""
        engine, target = self.session.engine, self.target
        out = trained_heads.head_folder(self.out(), ELSEWHERE)
        plan = TrainPlan(samples=(), out=str(out), minutes=minutes, max_steps=max_steps,
                         restart=restart, restart_how=RESTART)  # its values checked
        loop = asyncio.get_running_loop()
        engine.hold(HOLDER)
        try:
            corpus = await self.session.conversations.corpus()
            files = await loop.run_in_executor(
                None, trained_heads.file_chats, trained_heads.default_texts(), MAX_CHARS)
            if self._cancelled:
                return None
            plan = replace(plan, samples=tuple(trained_heads.corpus_chats(corpus) + files))
            self._job = engine.client.train_head(plan, loop=loop)
            await self._job.result(on_event=lambda ev: on_progress(ev)
                                   if isinstance(ev, TrainProgress) else None)
            if not trained_heads.can_resume(out):
                return None
            return await loop.run_in_executor(None, trained_heads.list_trained, out, target)
        finally:
            self._job, self._cancelled = None, False
            engine.release(HOLDER)
