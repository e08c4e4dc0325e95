"""A real full disk for the tests: a small tmpfs mounted for one test.

Why a real filesystem: ENOSPC in the middle of a write, a free-space figure
that is really that low, SQLite failing to grow its file; none of these can
be faked faithfully. Mounting needs root (CI here runs as root); elsewhere
the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def mounter(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Yields ``mount(size) -> folder`` (e.g. ``mount("1500k")``); every
    folder it mounted is unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a small tmpfs needs root")
        point = tmp_path / f"small-disk-{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(point)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def fill(disk: Path) -> None:
    """Take every free byte of the disk, as another program might (big
    writes first, then smaller ones until not even 512 bytes fit)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
