"""The ring layout MLX reads from ``MLX_HOSTFILE``, without a file on disk.

MLX's ring backend takes the layout as a path and reads it once, at the
start of ``mx.distributed.init``. A temporary file outlived every rank
killed while it waited in ``init`` (SIGKILL runs no cleanup, and a rank
blocked in MLX's C++ does not run Python signal handlers either). So the
layout goes into a pipe instead, and MLX gets ``/dev/fd/N``, the pipe's
read end: it exists only as long as the process does, however it ends.
Imports no MLX.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from specchat.engine.errors import EngineError


@contextlib.contextmanager
def ring_file(ring: list[list[str]]) -> Iterator[str]:
    """A path to read ``ring`` from (once), valid inside the ``with``."""
    data = json.dumps(ring).encode()
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)  # a layout too long for the pipe fails, never hangs
        try:
            written = os.write(write_end, data)
        except BlockingIOError:
            written = 0
        if written != len(data):
            raise EngineError(f"The cluster's ring layout ({len(data)} bytes) is too long to "
                              "hand to MLX.")
        os.close(write_end)
        write_end = -1
        yield f"/dev/fd/{read_end}"
    finally:
        if write_end >= 0:
            os.close(write_end)
        os.close(read_end)
