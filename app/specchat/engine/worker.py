"""The engine thread: the only thread that touches MLX.

MLX streams are per thread (since mlx 0.31.2), so arrays and models must not
cross threads; mlx_lm.server's answer, used here too, is one dedicated
thread that loads and runs every model. Callers submit jobs and receive
plain Python values through a Job, which works from synchronous code
(``for event in job``) and from asyncio (``async for event in job``, fed with
``loop.call_soon_threadsafe``). ``mx.eval`` releases the GIL, so a Qt/asyncio
thread stays responsive while the engine computes.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specchat.engine.errors import EngineError
from specchat.errors import SpecChatError


@dataclass(frozen=True)
class JobDone:
    result: Any


@dataclass(frozen=True)
class JobFailed:
    message: str
    detail: str = ""


class Job:
    """A unit of engine work and its event stream.

    Events are whatever the job emits, then exactly one JobDone or JobFailed.
    ``cancel()`` sets a flag the engine checks between steps.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.cancelled = threading.Event()
        self._loop = loop
        self._aq: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self._q: queue.Queue = queue.Queue()
        self.outcome: JobDone | JobFailed | None = None
        self._finished = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    # engine thread side
    def emit(self, event: Any) -> None:
        if isinstance(event, JobDone | JobFailed):
            self.outcome = event
            self._finished.set()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, event)
            except RuntimeError:  # loop closed: nobody is listening any more
                pass
        else:
            self._q.put(event)

    # consumer side
    def __iter__(self):
        if self._loop is not None:
            raise RuntimeError("this job streams to an asyncio loop; use 'async for'")
        while True:
            ev = self._q.get()
            yield ev
            if isinstance(ev, JobDone | JobFailed):
                return

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        if self._aq is None:
            raise RuntimeError("this job was not created with an asyncio loop")
        while True:
            ev = await self._aq.get()
            yield ev
            if isinstance(ev, JobDone | JobFailed):
                return

    def wait(self, timeout: float | None = None, on_event: Callable[[Any], None] | None = None):
        """Block until done; return the result or raise EngineError. Every
        event before the end (progress, steps) goes to ``on_event``: the one
        loop over a job's events, for every caller."""
        if self._loop is None:
            for ev in self:
                if on_event is not None and not isinstance(ev, JobDone | JobFailed):
                    on_event(ev)
        elif not self._finished.wait(timeout):
            raise TimeoutError("engine job did not finish in time")
        if isinstance(self.outcome, JobFailed):
            raise EngineError(self.outcome.message)
        return self.outcome.result

    async def result(self, on_event: Callable[[Any], None] | None = None):
        """Drain events (asyncio) and return the result or raise EngineError;
        events before the end go to ``on_event``, as in ``wait``."""
        async for ev in self:
            if on_event is not None and not isinstance(ev, JobDone | JobFailed):
                on_event(ev)
        if isinstance(self.outcome, JobFailed):
            raise EngineError(self.outcome.message)
        return self.outcome.result


class EngineThread:
    """One daemon thread running jobs in order."""

    def __init__(self, name: str = "specchat-engine"):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable[[Job], Any], loop: asyncio.AbstractEventLoop | None = None) -> Job:
        """Run ``fn(job)`` on the engine thread; its return value ends the job."""
        job = Job(loop)
        self._jobs.put((fn, job))
        return job

    def _run(self) -> None:
        while True:
            fn, job = self._jobs.get()
            outcome = _outcome(fn, job)
            # Only now, with the job's frames freed, does its caller hear the
            # outcome. A failed load's exception holds every local of the
            # load (the model's arrays, a 200 MB tokenizer's objects) through
            # its traceback; freeing them after the announcement left this
            # thread still busy when a caller that then exits (the CLI after
            # printing the error) finalized the interpreter, and a thread
            # that ran MLX taking the GIL back from a finalizing interpreter
            # aborts the process (see below).
            job.emit(outcome)
            del outcome

    # There is deliberately no way to end the thread. A thread that imported
    # mlx_lm and then exited made the process abort at interpreter shutdown
    # ("terminate called without an active exception", MLX 0.32 on Linux),
    # so a closed engine thread stays parked on its queue as a daemon.


def _outcome(fn: Callable[[Job], Any], job: Job) -> JobDone | JobFailed:
    """Run one job: its result, or its failure in words. Returns once the
    job's frames (and whatever its exception's traceback held) are freed."""
    try:
        return JobDone(fn(job))
    except SpecChatError as exc:
        failed = JobFailed(str(exc))
    except MemoryError:
        failed = JobFailed("Out of memory: the models do not fit. Choose smaller models "
                           "or close other apps.")
    except Exception as exc:  # noqa: BLE001 - report, never kill the thread
        failed = JobFailed(internal_error(exc), traceback.format_exc())
    return failed


def internal_error(exc: BaseException) -> str:
    """The one line for an exception that is not a SpecChatError: a bug in
    SpecChat, never something the user typed (every value a user can type is
    checked before it reaches MLX, see request_check.py). It says so, names
    the exception, and keeps to one line (the traceback is the JobFailed's detail)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return (f"Internal error (a bug in SpecChat, please report it): {type(exc).__name__}"
            + (f": {first}" if first else ""))
