"""A known background load, for measuring speed on a busy machine.

``BackgroundLoad(n)`` keeps n other processes spinning on the CPU at normal
priority while its ``with`` block runs: a stand-in for the browser, build or
indexer that real machines have. Each one ends on its own when its deadline
passes or when the process that started it is gone, so a killed benchmark
never leaves a machine loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# Runs in each child: spin until the deadline, checking every few ms whether
# the parent is still there (getppid changes when it dies).
_SPIN = """
import os, sys, time
parent, deadline = int(sys.argv[1]), float(sys.argv[2])
while time.time() < deadline and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


def load_average() -> float | None:
    """The 1-minute load average, where the system reports one (Linux's
    /proc/loadavg, or sysctl on macOS)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class BackgroundLoad:
    """n spinning processes for the duration of a ``with`` block (at most
    ``max_s`` seconds, whatever happens to this process)."""

    def __init__(self, n: int, max_s: float = 6 * 3600):
        if n < 0:
            raise ValueError("a background load is 0 or more processes")
        self.n = n
        self.max_s = max_s
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> BackgroundLoad:
        deadline = time.time() + self.max_s
        for _ in range(self.n):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(os.getpid()), str(deadline)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def running(self) -> int:
        return sum(1 for p in self._procs if p.poll() is None)

    def __exit__(self, *exc) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs = []
