"""A real subprocess stopped in the middle of its work, to be killed there.

The child prints ``HELD`` when it has reached the point under test (its
progress callback does, then sleeps); the test kills it with SIGKILL, as a
crash or a force-quit would, and checks what the next run finds.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys


def start_held(args: list[str]) -> subprocess.Popen:
    """``python *args``, returned once it printed ``HELD`` (AssertionError
    with its stderr if it ended or stalled first)."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ))
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout=120)  # generous: a loaded 2-core box starting Python
    sel.close()
    line = proc.stdout.readline() if ready else b""
    if line.strip() != b"HELD":
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"the child never got going: {line!r} {proc.stderr.read()!r}")
    return proc


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL, then reap it and close its pipes."""
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
