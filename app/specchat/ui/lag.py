"""How late the event loop runs: the number behind "the UI never blocks".

An asyncio task asks to wake every ``interval`` seconds and records how much
later than asked it actually woke. Anything that blocks the Qt/asyncio
thread (a slow paint, a synchronous call) shows up here directly.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class LagStats:
    samples: int
    mean_ms: float
    p95_ms: float
    max_ms: float
    last_ms: float

    def line(self) -> str:
        return (f"UI lag {self.last_ms:.0f} ms (p95 {self.p95_ms:.0f}, "
                f"max {self.max_ms:.0f} ms)")


class LagMonitor:
    def __init__(self, interval: float = 0.02, keep_s: float = 60.0):
        self.interval = interval
        self.keep_s = keep_s
        self._samples: deque[tuple[float, float]] = deque()  # (monotonic time, lag seconds)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Call with the loop running (qasync: after the window is shown)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            asked = time.monotonic()
            try:
                await asyncio.sleep(self.interval)
            except RuntimeError:  # the loop is closing
                return
            now = time.monotonic()
            self._samples.append((now, max(0.0, now - asked - self.interval)))
            while self._samples and self._samples[0][0] < now - self.keep_s:
                self._samples.popleft()

    def worst(self, since: float, count: int = 3) -> list[tuple[float, float]]:
        """The ``count`` largest lags after ``since``, as (lag s, monotonic time)."""
        return sorted(((lag, t) for t, lag in self._samples if t >= since), reverse=True)[:count]

    def stats(self, since: float | None = None, last_s: float | None = None) -> LagStats:
        """Lag over samples taken after ``since`` (a time.monotonic() value) or
        in the last ``last_s`` seconds; everything kept if neither."""
        if last_s is not None:
            since = time.monotonic() - last_s
        values = [lag for t, lag in self._samples if since is None or t >= since]
        if not values:
            return LagStats(0, 0.0, 0.0, 0.0, 0.0)
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return LagStats(len(values), 1000 * sum(values) / len(values), 1000 * p95,
                        1000 * ordered[-1], 1000 * values[-1])
