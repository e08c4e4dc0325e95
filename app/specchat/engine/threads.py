"""How many BLAS threads to use, decided from how busy the machine is.

BLIS and OpenBLAS split a product of several rows over threads that meet at
barriers, and BLIS's barrier is a bare spin on a shared flag (no yield, no
sleep, and no setting to change that: see docs/benchmarks.md). When another
program wants a core, one of our threads gets descheduled and the others
spin until it runs again. Every speculative step verifies several rows at
once, so with BLIS speculation is what collapses on a busy machine, while
plain decoding (one row: a matrix-vector product, single-threaded in BLIS)
only slows down in proportion to the CPU it gets; OpenBLAS threads one-row
products too, and plain decoding collapsed with it as well.

So the thread count follows the machine:

- Between steps, once ``WINDOW_S`` has passed since the last reading, read
  how much CPU time the cores we may run on spent busy (``/proc/stat``) and
  how much of it was ours (``time.process_time``). The rest is other
  programs.
- Each core's worth the others keep busy (beyond an allowance of
  ``BUSY_CORES``) takes one thread away at once; on a two-core machine any
  real load means one thread. A single thread never waits for another one,
  so it slows down only by the share of CPU it gets.
- Once the others have left cores free for ``CALM_WINDOWS`` windows in a
  row, those cores go back to BLAS.

No probing and no timing of our own forward passes: a probe at two threads
on a busy machine is exactly the collapse being avoided, and CPU accounting
tells the answer without running it. Threads never change results with
BLIS (it splits rows and columns, never the summed dimension; a test checks
the tokens); with OpenBLAS the last bits of a product can differ.

Small models get one thread whatever the load: starting the extra threads of
a product costs about 0.1 ms, more than it saves when the matrices are tiny
(``PARALLEL_MIN_WEIGHTS``, measured in docs/benchmarks.md).

The count is process-wide (it is the BLAS library's), so there is one
governor per process; the engine thread calls ``tick`` between steps.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable

from specchat.engine import blas, folders

WINDOW_S = 0.25
BUSY_CORES = 0.3  # cores' worth of other programs' CPU that counts as a busy machine
CALM_WINDOWS = 3
# Weights in a model's largest matrix below which extra threads cost more than
# they save (docs/bench/thread-sizes.txt, BLIS: [5 x 512] @ [512 x 2048], 1.05M
# weights, 0.34 ms on one thread and 0.41 ms on two; [5 x 896] @ [896 x 4864],
# 4.36M weights, 1.62 ms and 0.86 ms).
PARALLEL_MIN_WEIGHTS = 2_000_000

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_busy_seconds(cpus: frozenset[int], path: str = "/proc/stat") -> float | None:
    """CPU seconds the given cores have spent busy since boot (everything but
    idle and iowait; steal counts as busy: another guest had our core), or
    None where there is no /proc/stat (macOS)."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy = 0
    seen = False
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            cpu = int(name[3:])
        except ValueError:
            continue
        if cpu not in cpus:
            continue
        # user nice system idle iowait irq softirq steal [guest guest_nice]:
        # guest time is already inside user and nice.
        values = [int(v) for v in fields[:8]]
        busy += sum(values) - values[3] - values[4]
        seen = True
    return busy / _CLK_TCK if seen else None


def decide(current: int, ceiling: int, others: float, calm: int) -> tuple[int, int]:
    """The next thread count, and the count of calm windows so far, from the
    cores' worth of CPU other programs used in the last window.

    Every core the others keep busy (beyond a small allowance) is one thread
    fewer, at once; a count goes back up only after ``CALM_WINDOWS`` windows
    in a row that would allow it, so a load that comes and goes does not
    flip the count every window."""
    if ceiling <= 1:
        return 1, 0
    target = max(1, ceiling - max(0, math.ceil(others - BUSY_CORES)))
    if target < current:
        return target, 0
    if target == current:
        return current, 0
    calm += 1
    if calm < CALM_WINDOWS:
        return current, calm
    return target, 0


class ThreadGovernor:
    """Keeps the BLAS thread count in step with the machine's load."""

    def __init__(
        self,
        cores: int,
        set_threads: Callable[[int], bool] = blas.set_threads,
        busy: Callable[[], float | None] | None = None,
        own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        fixed: int | None = None,
    ):
        self.cores = max(1, cores)
        self._set = set_threads
        cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        self._busy = busy or (lambda: read_busy_seconds(cpus))
        self._own = own
        self._clock = clock
        self.fixed = fixed  # the user's own count (environment): never changed
        self.pinned: int | None = None  # a count held by pin() (benchmarks)
        self.ceiling = self.cores
        self.threads = fixed or self.cores
        self._calm = 0
        self._mark: tuple[float, float, float] | None = None
        self.others = 0.0  # cores' worth of other programs' CPU, last window
        self.steps = Counter()  # ticks at each thread count, for reports
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether the count follows the load (a BLAS that can be told, no
        count fixed by the user or pinned, a machine we can read the load of)."""
        return self.fixed is None and self.pinned is None and self._mark is not None

    def pin(self, n: int | None) -> bool:
        """Hold the count at n threads (None: follow the load again). Used to
        measure fixed counts against the governor; a count the user fixed in
        the environment is never overridden. False if the BLAS cannot be told."""
        with self._lock:
            if self.fixed is not None:
                return False
            self.pinned = n
            self._calm = 0
            if n is None:
                if self._mark is None:
                    return False
                # Measure afresh from now, not from before the pin.
                busy = self._busy()
                if busy is not None:
                    self._mark = (self._clock(), busy, self._own())
                return True
            if not self._set(n):
                return False
            self.threads = n
            return True

    def set_ceiling(self, ceiling: int) -> None:
        """The most threads the loaded models can use well (1 for small ones)."""
        with self._lock:
            self.ceiling = max(1, min(self.cores, ceiling))
            if self.active and self.threads > self.ceiling:
                self._apply(self.ceiling)

    def start(self) -> None:
        """Begin measuring; call once the BLAS is loaded."""
        with self._lock:
            if self.fixed is not None:
                return
            busy = self._busy()
            if busy is None or not self._set(self.threads):
                return
            self._mark = (self._clock(), busy, self._own())

    def tick(self) -> int:
        """Before a step: update the count if a window has passed, and return
        the count the step's products will use."""
        with self._lock:
            if self.active:
                self._update()
            self.steps[self.threads] += 1
            return self.threads

    def _update(self) -> None:
        now = self._clock()
        t0, busy0, own0 = self._mark
        if now - t0 < WINDOW_S:
            return
        busy, own = self._busy(), self._own()
        if busy is None:
            return
        self.others = max(0.0, (busy - busy0) - (own - own0)) / (now - t0)
        self._mark = (now, busy, own)
        nxt, self._calm = decide(self.threads, self.ceiling, self.others, self._calm)
        if nxt != self.threads:
            self._apply(nxt)

    def _apply(self, n: int) -> None:
        if self._set(n):
            self.threads = n

    def take_counts(self) -> dict[int, int]:
        """Ticks at each thread count since the last call (then reset)."""
        with self._lock:
            out = dict(sorted(self.steps.items()))
            self.steps.clear()
            return out


_governor: ThreadGovernor | None = None
_governor_lock = threading.Lock()


def governor() -> ThreadGovernor:
    """The process's governor, started on first use."""
    global _governor
    with _governor_lock:
        if _governor is None:
            st = blas.status()
            _governor = ThreadGovernor(blas.cores(), fixed=st.fixed_threads)
            _governor.start()
        return _governor


def parallel_ceiling(largest_matrix: int) -> int:
    """How many threads a model with this many weights in its largest matrix
    can use well."""
    return blas.cores() if largest_matrix >= PARALLEL_MIN_WEIGHTS else 1


def fit_model(config: dict) -> None:
    """Cap the governor for a model loaded with this config.json: the weights
    in a transformer block's largest matrix (its MLP's) decide whether
    splitting products over threads pays; unknown counts as large."""
    cfg = folders.text_config(config)
    hidden, inner = cfg.get("hidden_size"), cfg.get("intermediate_size")
    largest = int(hidden) * int(inner) if hidden and inner else PARALLEL_MIN_WEIGHTS
    governor().set_ceiling(parallel_ceiling(largest))
