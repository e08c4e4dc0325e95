"""Real processes started at once, optionally lined up behind a lock.

Two commands racing for one name or one file hit the race only when their
critical moments overlap, which a plain start at once does in some runs and
not others. Lined up (``lined_up=lock``), the test holds the lock every
writer of that file takes (an ``flock``, as another SpecChat process writing
the file holds it) until every process still running is waiting for it,
then lets go: each has done all its work before that point, and they reach
what the lock guards together, every time. Where the system does not say who
waits for a lock (``/proc/locks`` is Linux's), the test waits a few seconds
instead.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")


@dataclass
class Ran:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def waiting_for(lock: Path) -> int | None:
    """How many processes wait for ``lock``'s flock; None if unknown here."""
    if not PROC_LOCKS.exists():
        return None
    inode = os.stat(lock).st_ino
    count = 0
    for line in PROC_LOCKS.read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[-3].rsplit(":", 1)[-1] == str(inode):
            count += 1
    return count


def run_at_once(commands: list[list[str]], env: dict[str, str], lined_up: Path | None = None,
                timeout: float = 120) -> list[Ran]:
    """Start every command at once; with ``lined_up``, hold that lock file's
    flock until each still-running command waits for it (at most 30 s)."""
    fd = None
    if lined_up is not None:
        lined_up.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lined_up, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for c in commands]
    try:
        if fd is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                running = sum(p.poll() is None for p in procs)
                waiting = waiting_for(lined_up)
                if waiting is None:
                    time.sleep(3)
                    break
                if running and waiting >= running:
                    break
                if not running:
                    break
                time.sleep(0.02)
            os.close(fd)
            fd = None
        outs = [p.communicate(timeout=timeout) for p in procs]
        return [Ran(c, p.returncode, *out) for c, p, out in zip(commands, procs, outs, strict=True)]
    finally:
        if fd is not None:
            os.close(fd)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
