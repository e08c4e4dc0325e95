"""The engine's public face for the CLI and the GUI.

Every method submits work to the engine thread and returns a Job; nothing
here touches MLX, so the caller's thread never does either. Model references
are turned into folders by a resolver (the model library provides one that
understands bundled:, hf:, .gguf and installed names); the default accepts
folders only.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from pathlib import Path

from specchat.engine import request_check
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerateRequest, LoadProgress, TrainPlan
from specchat.engine.modes import OWN_HEAD
from specchat.engine.worker import EngineThread, Job

Resolver = Callable[[str, Callable[[str, float | None], None], object], Path]
# (target folder, draft folder or None, bytes of loaded models a new load
# would free) -> None; raises EngineError when the pair will not fit.
Preflight = Callable[[Path, Path | None, int], None]


def folder_resolver(ref: str, progress, cancelled=None) -> Path:
    return Path(ref)


class EngineClient:
    def __init__(self, resolver: Resolver | None = None, preflight: Preflight | None = None):
        self._thread = EngineThread()
        self._resolver = resolver or folder_resolver
        self._preflight = preflight
        self._engine = None  # created on the engine thread

    def _engine_here(self):
        if self._engine is None:
            from specchat.engine.session import Engine

            self._engine = Engine()
        return self._engine

    def load(self, target: str, draft: str | None = None,
             loop: asyncio.AbstractEventLoop | None = None, head: str | None = None) -> Job:
        """Resolve references (import/download if needed) and load the pair
        (and a head beside its draft model: Engine.load). Emits
        LoadProgress; the result is a LoadedPair."""

        def work(job: Job):
            def progress(stage: str):
                def cb(message: str, fraction: float | None = None):
                    if job.cancelled.is_set():
                        raise EngineError("Loading cancelled.")
                    job.emit(LoadProgress(stage, message, fraction))
                return cb

            t_path = self._resolver(target, progress("target"), job.cancelled)
            own_head = draft == OWN_HEAD  # the target's own MTP head: nothing to resolve
            d_path = self._resolver(draft, progress("draft"), job.cancelled) \
                if draft and not own_head else None
            h_path = self._resolver(head, progress("draft"), job.cancelled) if head else None
            engine = self._engine_here()
            if self._preflight is not None:
                self._preflight(Path(t_path), Path(d_path) if d_path else None,
                                engine.loaded_bytes())
            return engine.load(t_path, OWN_HEAD if own_head else d_path,
                               lambda stage, msg: progress(stage)(msg), head=h_path)

        return self._thread.submit(work, loop)

    def generate(self, request: GenerateRequest, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Emits StepEvent per verify step; the result is a GenerationResult."""

        def work(job: Job):
            return self._engine_here().generate(request, job.cancelled, job.emit)

        return self._thread.submit(work, loop)

    def prompt_length(self, request: GenerateRequest,
                      loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """The tokens of ``request``'s prompt, checked and rendered as
        ``generate`` renders it (tools, switches, a call SpecChat starts),
        nothing generated; the result is an int."""

        def work(job: Job):
            return len(self._engine_here().prompt_ids(request_check.checked(request),
                                                       job.cancelled))

        return self._thread.submit(work, loop)

    def prompt_cache(self, budget: int | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """How the cache of conversations put aside stands
        (prompt_cache.CacheUse), after setting its budget in bytes if given."""

        def work(_job: Job):
            engine = self._engine_here()
            return engine.prompt_cache_use() if budget is None else \
                engine.set_prompt_cache(budget)

        return self._thread.submit(work, loop)

    def train_head(self, plan: TrainPlan, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Train (or go on training) an EAGLE-3 head for the loaded target.
        Emits TrainProgress; ``cancel()`` stops it at the next step with its
        checkpoint saved; the result is the training record (a dict)."""

        def work(job: Job):
            from specchat.engine import head_training

            return head_training.train(self._engine_here(), plan, job.emit, job.cancelled)

        return self._thread.submit(work, loop)

    def call(self, fn: Callable, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Run ``fn(engine)`` on the engine thread (for tools like the bench)."""
        return self._thread.submit(lambda job: fn(self._engine_here()), loop)

    def close(self, timeout: float | None = 30.0) -> None:
        """Free the models (the thread itself stays parked; see worker.py)."""
        def release(_job):
            self._engine = None
            gc.collect()
            import mlx.core as mx

            mx.clear_cache()

        self._thread.submit(release).wait(timeout)

    @property
    def thread(self):
        return self._thread.thread
