"""Work folders that say whether the process writing them is still alive.

An import writes into a work folder and renames it into place when done; a
process killed mid-import (SIGKILL, a crash, power loss) leaves the folder
behind, and a fresh random name each time means nobody would ever look at
it again. So each work folder ``<prefix><pid>-<random>`` has a lock file
beside it (``...lock``), held with ``flock`` by the process doing the work
for as long as it works. The kernel drops that lock when the process dies,
however it dies, so the next import can tell a dead import's folder (lock
free: removed) from a live one's (lock held: left alone) without trusting
process ids, which the system reuses. The pid in the name only matters for a
folder whose lock file is missing (the instant between creating the two, or
the files of older versions, which wrote no lock: those also go once a day
old, so a reused pid cannot keep them). Imports, GGUF conversions and the
joining of bundled models all go through here, and the Hub cache's partial
downloads take the same lock (hub_files.py): liveness is decided in one
place. What dead processes left is removed when any ``specchat`` command or
the app starts (``sweep_library``, called by cli.py), not only by the next
import of the same kind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from specchat.library import paths
from specchat.library.errors import LibraryError

LOCK_SUFFIX = ".lock"
# Folders from SpecChat versions without pids or locks: removed once nobody
# could still be writing them.
LEGACY_AGE_SECONDS = 24 * 3600

# ``<home>/tmp/import-<pid>-<random>`` (and the older ``import-<random>``).
IMPORT_PREFIX = "import-"
IMPORT_NAMES = re.compile(r"import-(?:(?P<pid>\d+)-)?[0-9a-f]+")
# ``.<name>.partial-<pid>-<random>`` beside a GGUF import's destination.
PARTIAL_NAMES = re.compile(r"\..+\.partial-(?P<pid>\d+)-[0-9a-f]+")
# ``<home>/tmp/bundled-<model>-<pid>-<random>`` where a bundled model's parts
# are joined (and the loose ``...-<pid>-<random>.gguf`` of older versions).
BUNDLED_NAMES = re.compile(r"bundled-.+-(?P<pid>\d+)-[0-9a-f]+(?:\.gguf)?")


# ``.<name>.old-<random>`` beside a converted model being replaced
# (gguf_import._install, bundled.ensure): set aside only to be deleted, and
# known to no one else, so one left by a process killed while deleting it is
# garbage whoever finds it.
OLD_NAMES = re.compile(r"\..+\.old-[0-9a-f]{8}")


def bundled_prefix(model: str) -> str:
    return f"bundled-{model}-"


def partial_prefix(dest: Path) -> str:
    return f".{dest.name}.partial-"


# What flock says when another process holds the lock (filelock's own list).
_HELD = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES}


def try_lock(path: Path, mode: int = 0o600, create: bool = True) -> int | None:
    """A descriptor of ``path`` holding its ``flock``, taken without waiting
    (the file and its folder are made if needed, unless not ``create``);
    None if another process holds it, or it is gone. The same lock
    ``filelock`` takes, so huggingface_hub's downloads and ours exclude each
    other; a file its holder unlinked just before is not taken (it is
    nobody's lock any more: the next try makes a new one)."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError:
        if create:
            raise
        return None  # gone, or not ours to open
    try:
        with contextlib.suppress(PermissionError):  # the umask must not narrow it
            os.fchmod(fd, mode)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_nlink:
            return fd
    except OSError as e:
        if e.errno not in _HELD:  # no flock on this file system: say so, never wait on it
            os.close(fd)
            raise
    os.close(fd)
    return None


def unlock(path: Path, fd: int) -> None:
    """Delete a held lock's file, then drop the lock: in that order, so no
    other process can take the lock of a file about to go."""
    with contextlib.suppress(OSError):  # a lock file left behind is harmless
        path.unlink()
    os.close(fd)


class WorkDir:
    """A claimed work folder; ``release`` deletes whatever is still at its
    path (nothing, once it was renamed into place) and drops the lock."""

    def __init__(self, path: Path, lock: Path, fd: int):
        self.path, self._lock, self._fd = path, lock, fd

    def release(self) -> None:
        if self._fd < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        fd, self._fd = self._fd, -1
        unlock(self._lock, fd)

    def __enter__(self) -> WorkDir:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(parent: Path, prefix: str) -> WorkDir:
    """Create ``parent/<prefix><pid>-<random>`` with its lock held."""
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(8):
        name = f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
        lock = parent / (name + LOCK_SUFFIX)
        # A new file: only a sweep, seeing it before its folder exists, can
        # take or delete it in the moment before ours; a new name then.
        if (fd := try_lock(lock)) is not None:
            break
    else:
        raise FileExistsError(f"Could not lock a work folder in {parent}")
    try:
        (parent / name).mkdir()
    except BaseException:
        unlock(lock, fd)
        raise
    return WorkDir(parent / name, lock, fd)


def sweep(parent: Path, names: re.Pattern) -> list[Path]:
    """Delete the work folders in ``parent`` matching ``names`` whose owner
    is gone, and lock files left without a folder. Returns what was removed.
    Never raises: cleaning up is best effort and must not stop an import."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if name.endswith(LOCK_SUFFIX):
            folder = parent / name[:-len(LOCK_SUFFIX)]
            if names.fullmatch(folder.name) and not folder.exists():
                remove_if_unlocked(entry, None)
            continue
        match = names.fullmatch(name)
        if match is None or entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
            continue
        lock = parent / (name + LOCK_SUFFIX)
        if lock.exists():
            if remove_if_unlocked(lock, entry):
                removed.append(entry)
        elif not _owner_may_live(entry, match.groupdict().get("pid")):
            _remove(entry)
            removed.append(entry)
    return removed


def sweep_library() -> list[Path]:
    """Remove what imports, conversions and joins whose process died left
    in the library (their work folders, joined parts, partial conversions,
    copies set aside to be deleted); a live one's are left alone. Cheap
    when there is nothing to remove (a few folder listings). Never raises."""
    tmp, built = paths.tmp_dir(), paths.bundled_dir()
    removed = sweep(tmp, IMPORT_NAMES) + sweep(tmp, BUNDLED_NAMES) + sweep(built, PARTIAL_NAMES)
    try:
        old = [p for p in built.iterdir() if OLD_NAMES.fullmatch(p.name)]
    except OSError:
        old = []
    for entry in old:
        if not entry.is_symlink():
            _remove(entry)
            removed.append(entry)
    return removed


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def remove_if_unlocked(lock: Path, entry: Path | None, mode: int = 0o600,
                       create: bool = False) -> bool:
    """Take the lock without waiting (making its file first if ``create``);
    if that works its owner is dead, so delete ``entry`` (a folder or a
    file), then the lock file (still holding it, so a second sweeper cannot
    start on the same entry)."""
    try:
        fd = try_lock(lock, mode, create)
    except OSError:
        return False  # not lockable here: leave it
    if fd is None:
        return False  # held: a live owner (or already swept)
    try:
        if entry is not None:
            _remove(entry)
    finally:
        unlock(lock, fd)
    return True


def _owner_may_live(entry: Path, pid: str | None) -> bool:
    """For an entry without a lock file (older versions wrote none): its
    named process is gone, or it has not changed for a day. The age bound
    is what keeps a reused pid from keeping a dead process's files forever."""
    try:
        age = time.time() - entry.stat().st_mtime
    except OSError:
        return True
    if age >= LEGACY_AGE_SECONDS:
        return False
    return pid is None or process_alive(int(pid))


def process_alive(pid: int) -> bool:
    """Whether a process with this id is running (only a fallback: the id
    may belong to another process by now)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process
        pass
    return True


def write_error(src: Path, where: Path, exc: OSError) -> LibraryError:
    """What a person reads when writing an import failed: a full disk is
    called that, and the message names the user's file and the library
    folder, not the work folder the bytes were going to."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LibraryError(
            f"Not enough disk space to import {src}: the disk holding {where} filled up "
            "during the import; nothing was added. Free some space and import again.")
    return LibraryError(f"Could not import {src} into {where}: {exc.strerror or exc}")
