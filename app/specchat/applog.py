"""Where SpecChat writes what went wrong for people who look later.

Some events change a user's files without a question (a history that could
not be read is moved aside) or mean their chats are not being kept (the
history could not be opened). The window says so, but a window is gone once
closed; so these are also logged to stderr and to ``specchat.log`` in the
home folder, where a user (or a bug report) can find them. The file is
capped: it rotates at ``MAX_BYTES`` and keeps one older file.
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import stat
import sys
from pathlib import Path

from specchat import records
from specchat.home import home as default_home

FILENAME = "specchat.log"
MAX_BYTES = 1_000_000
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _LogFile(logging.handlers.RotatingFileHandler):
    """The log file, opened only if it is a regular file: a FIFO in its
    place blocked every command that logged (``models list`` with one
    damaged index entry hung forever), a folder there printed Python's
    "--- Logging error ---" and a traceback under each line. One that
    cannot be written is said once on stderr, where every record goes
    anyway, and not tried again."""

    failed = False

    def _open(self):
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.baseFilename, flags, 0o644)  # a FIFO with no reader: ENXIO at once
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OSError(errno.EINVAL, f"it is {records.file_kind(mode)}, not a regular "
                                            "file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return open(fd, "a", encoding=self.encoding, errors=self.errors)  # noqa: SIM115

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if self.failed:
            return
        self.failed = True
        exc = sys.exc_info()[1]
        why = getattr(exc, "strerror", None) or exc
        sys.stderr.write(f"specchat: note: the log file {self.baseFilename} cannot be written "
                         f"({why}); what went wrong is said here only.\n")


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a redirected
    or captured stream included), not the one at start-up."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup(home: Path | None = None) -> Path | None:
    """Send the ``specchat`` loggers to stderr and to ``<home>/specchat.log``.
    Idempotent: calling it again (another window, another home in tests)
    keeps one stderr handler and points the file at the current home. The
    log file's path, or None if the home folder cannot hold one (logging to
    stderr still works then)."""
    logger = logging.getLogger("specchat")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    formatter = logging.Formatter(FORMAT)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        stderr = _Stderr()
        stderr.setFormatter(formatter)
        logger.addHandler(stderr)
    if home is None:
        home = default_home()
    path = Path(home) / FILENAME
    for h in list(logger.handlers):
        if isinstance(h, logging.handlers.RotatingFileHandler):
            if Path(h.baseFilename) == path.resolve() and not getattr(h, "failed", False):
                return path
            logger.removeHandler(h)
            h.close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _LogFile(path, maxBytes=MAX_BYTES, backupCount=1, encoding="utf-8",
                           delay=True)
    except OSError:
        return None
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    return path


def shutdown() -> None:
    """Undo ``setup``: close the log file and hand records back to the root
    logger. For tests, which share one process's loggers."""
    logger = logging.getLogger("specchat")
    for h in list(logger.handlers):
        if isinstance(h, (_Stderr, logging.handlers.RotatingFileHandler)):
            logger.removeHandler(h)
            h.close()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
