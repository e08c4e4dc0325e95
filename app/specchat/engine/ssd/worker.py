"""SSD's worker: one thread per process that drafts the speculated blocks
while the engine thread verifies, each on a branch of the draft's cache.

BLAS threads: BLIS (and OpenBLAS) take one process-wide thread count
through the CBLAS interface MLX calls (BLIS's per-call ``rntm_t`` is only
reachable through its own expert API, which MLX does not call), so while a
job is queued or running the count is lowered to half the governor's, and
restored when it ends; a count the user fixed is left alone. Draft forwards
are one-row products, single-threaded in BLIS anyway.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specchat.engine import blas, threads
from specchat.engine.drafting import Drafted, DraftHead, distribution, likeliest
from specchat.engine.events import SamplingParams
from specchat.engine.ssd.plan import Key, draft_at


@dataclass
class Spec:
    """A speculated block, ready for the outcome ``key``: its tokens, the
    branch cache holding the new context and every token but the last, and
    the worker seconds behind it."""

    key: Key
    block: Drafted
    q: mx.array | None
    cache: list


def branch(snapshot: list[tuple[mx.array, mx.array]], offset: int) -> list[KVCache]:
    """A new cache holding the first ``offset`` positions of ``snapshot``
    (evaluated arrays). Its first write copies them into a buffer of its
    own, so nothing written to it reaches the snapshot or the draft's cache."""
    out = []
    for keys, values in snapshot:
        c = KVCache()
        c.keys, c.values, c.offset = keys[..., :offset, :], values[..., :offset, :], offset
        out.append(c)
    return out


class _BlasShare:
    """Half the governor's BLAS threads while any speculation job is
    queued or running, all of them otherwise."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0

    def _set(self, share: bool) -> None:
        gov = threads.governor()
        if gov.fixed is None and gov.threads > 1:
            blas.set_threads(max(1, gov.threads // 2) if share else gov.threads)

    def enter(self) -> None:
        with self._lock:
            self._active += 1
            if self._active == 1:
                self._set(True)

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._set(False)


_share = _BlasShare()


class Job:
    """One block's speculation: planned on the engine thread, run on the
    worker, read back (``take``) by the engine thread once the block is
    verified."""

    def __init__(self, runner, head: DraftHead, snapshot: list, start: int, block: Drafted,
                 keys: list[tuple[Key, float]], bonus: int, p_bonus: float, length: int,
                 sampling: SamplingParams, base: int | None, device: str | None):
        self.runner, self.head, self.snapshot, self.start = runner, head, snapshot, start
        self.proposed = list(block.tokens)
        self.keys, self.bonus, self.p_bonus = keys, bonus, p_bonus
        self.length, self.sampling, self.base, self.device = length, sampling, base, device
        self.cond = threading.Condition()
        self.outcome: Key | None = None
        self.asked = False  # the engine thread has asked for its outcome
        self.cancelled = False
        self.current: Key | None = None
        self.results: dict[Key, Spec] = {}
        self.finished = False
        self.error: BaseException | None = None
        self.spent_s = 0.0  # worker forward seconds, every key
        self.forwards = 0
        self.submitted = time.perf_counter()
        _share.enter()

    # -- worker side -------------------------------------------------------------------
    def _abandon(self, key: Key | None) -> bool:
        """Stop drafting ``key`` (None: the bonus forward)? Once the engine
        has asked, only the block for its outcome is still of use."""
        with self.cond:
            return self.cancelled or (self.asked and (key is None or self.outcome != key))

    def run(self) -> None:
        """Draft the planned keys, most likely first (the worker thread)."""
        plan = list(self.keys)
        k = len(self.proposed)
        if self.bonus and not self._abandon(None):
            # Feed d_K on a branch holding the context and d_1..d_{K-1}: the
            # draft's distribution after the whole block, for the bonus keys.
            t0 = time.perf_counter()
            cache = branch(self.snapshot, self.start + k - 1)
            logits = self.head.logits(self.runner(self.proposed[-1:], cache, self.head.which))
            ids, p = likeliest(self.head, distribution(logits, self.sampling)[0][0], self.bonus)
            mx.eval(ids, p, [(c.keys, c.values) for c in cache])
            self._spent(time.perf_counter() - t0, 1)
            bonus_snapshot = [(c.keys, c.values) for c in cache]
            plan += [((k, t), self.p_bonus * q) for t, q in zip(ids.tolist(), p.tolist(),
                                                                 strict=True) if q > 0]
        plan.sort(key=lambda kp: -kp[1])
        for key, _p in plan:
            n, t = key
            with self.cond:
                if self.cancelled or (self.asked and key != self.outcome):
                    return
                self.current = key
            snap = bonus_snapshot if n == k else self.snapshot  # (k, t): planned with it
            cache = branch(snap, self.start + n)
            block = draft_at(self.head, lambda x, c=cache: self.runner(x, c, self.head.which),
                             [t], self.length, self.sampling, self.base, self.start + n + 1,
                             lambda _c: True, abandon=lambda key=key: self._abandon(key))
            if block is None:
                return
            q = block.q(self.head, self.sampling)
            mx.eval(q if q is not None else [], [(c.keys, c.values) for c in cache])
            self._spent(block.forward_s, block.forwards)
            with self.cond:
                self.results[key] = Spec(key, block, q, cache)
                self.current = None
                self.cond.notify_all()

    def _spent(self, seconds: float, forwards: int) -> None:
        with self.cond:
            self.spent_s += seconds
            self.forwards += forwards

    def finish(self) -> None:
        with self.cond:
            if self.finished:
                return
            self.finished = True
            self.current = None
            self.cond.notify_all()
        _share.leave()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    # -- engine side -------------------------------------------------------------------
    def take(self, outcome: Key | None, settle: bool) -> tuple[Spec | None, float]:
        """The block speculated for ``outcome`` (None if there is none, or
        the outcome is unknown), and the seconds spent waiting for it: only
        while the worker drafts that very key (or, with ``settle``, until
        the job is done)."""
        t0 = time.perf_counter()
        with self.cond:
            if settle:
                while not self.finished:
                    self.cond.wait()
            self.outcome, self.asked = outcome, True
            self.cond.notify_all()
            while (outcome is not None and outcome not in self.results
                   and self.current == outcome and not self.finished):
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("the SSD draft worker failed") from self.error
            spec = self.results.get(outcome) if outcome is not None else None
        return spec, time.perf_counter() - t0


class _Worker:
    """The process's one speculation thread: runs the newest job, parked
    otherwise. A newer job replaces one still queued and cancels the one
    running (only the latest block's speculation is of use)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: Job | None = None
        self._running: Job | None = None
        self._streams: dict[str | None, mx.Stream] = {}
        threading.Thread(target=self._run, name="specchat-ssd-draft", daemon=True).start()
        atexit.register(self.park)

    def submit(self, job: Job) -> None:
        with self._cv:  # an RLock: cancel takes it again
            self.cancel()
            self._pending = job
            self._cv.notify_all()

    def cancel(self) -> None:
        with self._cv:
            if self._pending is not None:
                self._pending.cancel()
                self._pending.finish()
                self._pending = None
            if self._running is not None:
                self._running.cancel()

    def park(self, timeout: float = 60.0) -> None:
        """Cancel everything and wait until the thread is out of MLX."""
        self.cancel()
        with self._cv:
            self._cv.wait_for(lambda: self._running is None, timeout)

    def _stream(self, device: str | None) -> mx.Stream:
        if device not in self._streams:
            dev = {"cpu": mx.cpu, "gpu": mx.gpu}.get(device or "", mx.default_device())
            self._streams[device] = mx.new_stream(dev)
        return self._streams[device]

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None)
                job, self._pending = self._pending, None
                self._running = job
            try:
                with mx.stream(self._stream(job.device)):
                    job.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the engine thread
                with job.cond:
                    job.error = exc
            finally:
                job.finish()
                with self._cv:
                    self._running = None
                    self._cv.notify_all()


_worker_lock = threading.Lock()
_the_worker: _Worker | None = None


def worker() -> _Worker:
    global _the_worker
    with _worker_lock:
        if _the_worker is None:
            _the_worker = _Worker()
        return _the_worker

