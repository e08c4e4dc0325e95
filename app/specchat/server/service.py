"""The API's side of the engine thread: whose turn it is, and what runs.

The server shares one ``EngineClient`` (one set of loaded models) with
whoever else uses it: the window's chat, or nobody under ``specchat serve``.
The engine thread runs jobs one at a time, in the order they were submitted,
so nothing here locks the engine; what this adds is a queue of its own for
API requests, in arrival order, so that a request whose client has gone
while it waited never reaches the engine, and so that the owner can
``pause()`` the API while the pair changes or while Compare needs the
engine to itself. A request then waits its turn; it is never refused for
being second.

Everything here runs on the server's asyncio loop except ``serve``,
``pause``, ``resume`` and ``cancel_all``, which any thread may call.
Activity (a request waiting, generating, ending) goes to ``on_activity``
on the server's thread; the app forwards it to its status line.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from specchat import values
from specchat.engine.client import EngineClient
from specchat.engine.errors import EngineError
from specchat.engine.events import ChatFormat, GenerationResult, LoadedPair, StepEvent
from specchat.server.errors import ApiError
from specchat.server.protocol import MAX_TOKENS_CAP, ApiRequest

log = logging.getLogger("specchat.server")


@dataclass(frozen=True)
class Served:
    """The pair the API answers with, and how its requests decode."""

    model: str  # the id GET /v1/models lists
    mode: str  # a name in engine.modes
    k: int | None = None  # None: adaptive draft length
    draft: str | None = None
    aliases: frozenset[str] = field(default_factory=frozenset)  # other names it answers to
    chat: ChatFormat = ChatFormat()  # what its chat template does with tools and reasoning

    @classmethod
    def of(cls, pair: LoadedPair, mode: str, k: int | None = None,
           target_ref: str | None = None) -> Served:
        """The loaded pair as the API names it: the target's name, and the
        reference it was loaded from as another name for it."""
        aliases = frozenset({target_ref} if target_ref else ())
        return cls(model=pair.target.name, mode=mode, k=k,
                   draft=pair.draft.name if pair.draft else None, aliases=aliases, chat=pair.chat)

    def answers_to(self, name: str) -> bool:
        return name == self.model or name in self.aliases


@dataclass(frozen=True)
class Activity:
    """What the API is doing, for a status line and a log.

    state: "idle" (nothing to do), "waiting" (requests wait for their turn
    or for the owner to resume) or "generating" (``request_id`` runs).
    ``finished`` is set on the update a request ends with: its finish
    reason ("stop", "length", "stop_string", "tool_calls", "cancelled",
    "error"). ``tool`` is the name of the last tool call the reply has
    made so far (a step's ``tool_calls``), shown as it is made."""

    state: Literal["idle", "waiting", "generating"]
    waiting: int = 0
    request_id: str | None = None
    model: str | None = None
    tokens: int = 0
    finished: str | None = None
    summary: object = None  # the engine's Summary of the request that ended, if any
    tool: str | None = None


class ApiService:
    def __init__(self, client: EngineClient, served: Served | None = None,
                 max_tokens_cap: int = MAX_TOKENS_CAP,
                 on_activity: Callable[[Activity], None] | None = None):
        self.client = client
        self.max_tokens_cap = max_tokens_cap
        self.on_activity = on_activity
        self._served = served
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turn: asyncio.Lock | None = None
        self._open: asyncio.Event | None = None
        self._jobs: set = set()  # engine jobs of running requests (for cancel_all)
        self._jobs_lock = threading.Lock()
        self._waiting = 0
        self._current: tuple[str, str] | None = None  # (request id, model)
        self._tokens = 0
        self._tool: str | None = None  # the running request's last tool call

    # -- any thread ----------------------------------------------------------------
    @property
    def served(self) -> Served | None:
        return self._served

    def serve(self, served: Served | None) -> None:
        """Answer with this pair from the next request on (None: no model)."""
        self._served = served

    def pause(self) -> None:
        """Requests wait (the pair is changing, or the engine is held)."""
        self._paused = True
        self._call(lambda: self._open.clear())

    def resume(self) -> None:
        self._paused = False
        self._call(lambda: self._open.set())

    def cancel_all(self) -> None:
        """Stop every running request's engine job (the server is closing)."""
        with self._jobs_lock:
            for job in self._jobs:
                job.cancel()

    def _call(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop has closed: nothing waits any more
                pass

    # -- the server's loop ---------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the server's loop (once it runs, before any request)."""
        self._loop = loop
        self._turn = asyncio.Lock()  # FIFO: waiters acquire in the order they came
        self._open = asyncio.Event()
        if not self._paused:
            self._open.set()

    def model(self, name: str) -> Served:
        """The served pair if ``name`` is one of its names; else ApiError
        (404 for another model, 503 when none is loaded)."""
        served = self._served
        if served is None:
            raise ApiError(503, "No model is loaded yet; try again when SpecChat has "
                                "loaded one.", code="model_not_loaded")
        if not served.answers_to(name):
            # The name as sent, shortened: a body can carry megabytes of it.
            raise ApiError(404, f"The model '{values.shown(name)}' does not exist here; this "
                                f"server serves {served.model!r}.", "model", "model_not_found")
        return served

    async def run(self, req: ApiRequest,
                  on_step: Callable[[StepEvent], None] | None = None) -> GenerationResult:
        """Wait for the request's turn, run it on the engine thread (each
        step to ``on_step``) and return the result. Cancelling the task
        (the client went away) cancels the engine job; the turn passes on
        once the engine has stopped it, and the activity that ends the
        request carries the engine's own summary ("cancelled")."""
        self.model(req.model)  # refuse an unknown model now, not after the queue
        self._waiting += 1
        queued = True
        self._report(None)
        try:
            async with self._turn:
                await self._open.wait()
                self._waiting -= 1
                queued = False
                served = self.model(req.model)  # the pair may have changed meanwhile
                self._current, self._tokens, self._tool = (req.id, served.model), 0, None
                self._report(None)
                result = await self._generate(req, served, on_step)
                self._end(req, served, result.summary.finish_reason, result.summary)
                return result
        except asyncio.CancelledError:
            self._end(req, self._served, "cancelled", None)
            raise
        except BaseException:
            self._end(req, self._served, "error", None)
            raise
        finally:
            if queued:
                self._waiting -= 1
                self._report(None)

    async def count(self, req: ApiRequest) -> int:
        """The tokens of the request's prompt as its reply would read it
        (Anthropic's count_tokens), rendered on the engine thread in the
        request's turn (with the pair it would run on), nothing generated."""
        self.model(req.model)
        async with self._turn:
            await self._open.wait()
            served = self.model(req.model)
            request = req.generate_request(served.mode, served.k, self.max_tokens_cap)
            try:
                return await self._engine_job(self.client.prompt_length(
                    request, asyncio.get_running_loop()))
            except _Stopped:
                raise asyncio.CancelledError from None

    async def _generate(self, req: ApiRequest, served: Served,
                        on_step: Callable[[StepEvent], None] | None) -> GenerationResult:
        loop = asyncio.get_running_loop()

        def step(ev) -> None:
            if isinstance(ev, StepEvent):
                self._tokens += len(ev.token_ids)
                if ev.tool_calls:
                    self._tool = ev.tool_calls[-1].name
                self._report(None)
                if on_step is not None:
                    on_step(ev)

        try:
            ids = None
            if req.prompt is not None:
                ids = await self._engine_job(self.client.call(_tokenizer(req.prompt), loop))
            request = req.generate_request(served.mode, served.k, self.max_tokens_cap, ids)
            return await self._engine_job(self.client.generate(request, loop), step)
        except _Stopped as stopped:
            if isinstance(stopped.result, GenerationResult):
                s = stopped.result.summary
                self._end(req, served, s.finish_reason, s)
            raise asyncio.CancelledError from None

    async def _engine_job(self, job, on_event=None):
        """The job's result; ApiError if the engine refused it. If this task
        is cancelled, the job is too, and this waits (at most one engine
        step) until it has stopped, then raises ``_Stopped``."""
        with self._jobs_lock:
            self._jobs.add(job)
        try:
            return await job.result(on_event=on_event)
        except EngineError as exc:
            raise _api_error(str(exc)) from None
        except asyncio.CancelledError:
            job.cancel()
            try:
                result = await job.result()
            except EngineError:
                result = None
            raise _Stopped(result) from None
        finally:
            with self._jobs_lock:
                self._jobs.discard(job)

    def _end(self, req: ApiRequest, served: Served | None, reason: str, summary) -> None:
        if self._current is None or self._current[0] != req.id:
            return  # it never got its turn: nothing to say but the queue length
        self._current = None
        tokens = summary.new_tokens if summary is not None else self._tokens
        self._report(Activity(self._state(), self._waiting, req.id,
                              served.model if served else None, tokens, reason, summary,
                              self._tool))

    def _state(self) -> str:
        if self._current is not None:
            return "generating"
        return "waiting" if self._waiting else "idle"

    def _report(self, activity: Activity | None) -> None:
        if self.on_activity is None:
            return
        if activity is None:
            rid, model = self._current or (None, None)
            activity = Activity(self._state(), self._waiting, rid, model, self._tokens,
                                tool=self._tool if rid else None)
        try:
            self.on_activity(activity)
        except Exception:  # noqa: BLE001 - a broken listener must not break a request
            log.exception("the API's activity listener failed")


class _Stopped(Exception):
    """An engine job stopped because its request was cancelled."""

    def __init__(self, result):
        super().__init__("stopped")
        self.result = result


def _tokenizer(text: str):
    """``fn(engine)`` for the engine thread: ``text`` as the target's token
    ids, as a completion prompt is read (no chat template)."""

    def encode(engine) -> tuple[int, ...]:
        if engine.target is None:
            raise EngineError("No model is loaded.")
        return tuple(engine.target.tokenizer.encode(text))

    return encode


def _api_error(message: str) -> ApiError:
    """An engine refusal as an HTTP answer: a bug is the server's (500),
    no model is a 503, anything else the request's (400: a prompt longer
    than the model reads, a value the engine refused)."""
    if message.startswith("Internal error"):
        return ApiError(500, message)
    if message.startswith("No model is loaded"):
        return ApiError(503, message, code="model_not_loaded")
    return ApiError(400, message)
