"""A cluster's shared secret: 32 random bytes that prove a control
connection comes from the cluster, written once by ``specchat cluster
create``.

Where it lives, and how it travels (never on a command line, never in an
environment variable, so ``ps`` does not show it):

* on rank 0's machine, in the cluster folder as ``secret`` (hex, one line),
  readable by its owner only (0600); rank 0 and ``specchat cluster start``
  read it there, and refuse a copy others can read;
* to ranks 1..N-1 through their standard input: ``cluster start`` writes
  the line into the pipe of each ``specchat cluster rank`` it starts,
  locally or as the stdin of the ssh session (ssh carries it encrypted),
  and the rank reads one line before it listens.

Imports no MLX.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

from specchat import records
from specchat.engine.errors import EngineError

SECRET = "secret"  # the file's name in the cluster folder (one of folders.CLUSTER_FILES)
BYTES = 32
MAX_FILE_BYTES = 4 * BYTES  # the file is one line of 2 * BYTES hex digits


def text(secret: bytes) -> str:
    """The secret as the one line the file and a rank's stdin carry."""
    return secret.hex() + "\n"


def parse(line: bytes | str, where: str) -> bytes:
    """The secret in ``line`` (64 hex digits), or an EngineError naming ``where``."""
    if isinstance(line, bytes):
        line = line.decode("ascii", "replace")
    value = line.strip()
    with contextlib.suppress(ValueError):  # not hex
        if len(value) == 2 * BYTES:
            return bytes.fromhex(value)
    raise EngineError(f"{where} does not hold a cluster secret ({2 * BYTES} hex digits).")


def ensure(folder: str | os.PathLike) -> bytes:
    """The cluster's secret, made now if the folder has none (creating a
    cluster again keeps it, so ranks started with it still answer). What is
    in its place and is no regular file (a FIFO, a link to nothing) held no
    secret anyone could read, and is replaced."""
    path = Path(folder) / SECRET
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.stat(path).st_mode):
            return read(folder)
    secret = secrets.token_bytes(BYTES)
    tmp = path.with_name(SECRET + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text(secret))
    os.chmod(tmp, 0o600)  # whatever the umask
    tmp.replace(path)
    return secret


def read(folder: str | os.PathLike) -> bytes:
    """The secret of the cluster in ``folder``; refused when others can read
    it. Read as every file SpecChat reads back (specchat/records.py): only
    a regular file, of at most MAX_FILE_BYTES (a FIFO in its place would
    hang ``cluster list``, ``cluster start`` and rank 0 for good)."""
    path = Path(folder) / SECRET
    try:
        mode = os.stat(path).st_mode
        data = records.read_file(path, MAX_FILE_BYTES)
    except (OSError, records.BadRecord) as exc:
        raise EngineError(f"The cluster in {folder} has no readable secret ({path}: "
                          f"{getattr(exc, 'strerror', None) or exc}); run `specchat cluster "
                          "create` for it again.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise EngineError(f"{path} can be read by other users (mode "
                          f"{stat.S_IMODE(mode):04o}): run `chmod 600 {path}`.")
    return parse(data, str(path))


def from_stdin(stream: BinaryIO, is_terminal: bool) -> bytes:
    """The secret ``cluster start`` writes on a rank's standard input."""
    if is_terminal:
        raise EngineError("specchat cluster rank reads its cluster's secret from standard input: "
                          "start ranks with `specchat cluster start NAME`, or by hand with "
                          "`specchat cluster rank ... < CLUSTER_FOLDER/secret`.")
    return parse(stream.readline(MAX_FILE_BYTES), "The standard input of specchat cluster rank")
