"""Files in the Hub cache: checking their content, partial downloads and
their locks, and snapshot links.

* Every file is checked against the id the Hub gives for it, which is also
  its blob's name in the cache: the SHA-256 for LFS files (64 hex digits),
  the git blob id (SHA-1 of ``blob <size>\\0`` + bytes, 40 hex digits) for
  small ones. A size match proves nothing: a tampered or truncated-and-padded
  file with a valid safetensors header loads and generates garbage.
* A blob that passed is remembered by (size, mtime, inode) in
  ``<home>/hub-verified.json`` (like ``bundled.py``'s ``verified.json``), so
  a re-pull or a load re-hashes only blobs that changed since; one that no
  longer matches is reported, not trusted.
* A download in progress is ``blobs/<id>.incomplete``, written only while
  holding ``.locks/models--org--repo/<id>.lock``: the path huggingface_hub
  locks for the same blob, so its downloads into this cache wait too. The
  lock is an ``flock`` (``staging.try_lock``, the library's one lock for
  work in progress), which the kernel drops when its process dies, so
  "can the lock be taken without waiting" tells a dead owner from a live
  one exactly (no pid files, no pid reuse, no clocks). A partial file nobody
  holds is resumed by the next pull of that file or, if the repo no longer
  needs it, deleted; a lock file nobody holds is deleted while held (filelock
  notices an unlinked lock file and retries, so this is safe).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from specchat import records
from specchat.library import disk, paths, staging

READ_BYTES = 1024 * 1024
POLL = 0.1
LOCK_MODE = 0o664  # group read/write, as huggingface_hub makes its lock files

Tick = Callable[[], None]


def kind_of(blob_id: str) -> str:
    return "SHA-256" if len(blob_id) == 64 else "git blob id"


class Hasher:
    """The id a file's bytes have on the Hub, computed as they arrive."""

    def __init__(self, blob_id: str, size: int | None):
        self.blob_id = blob_id
        self.size = size
        self.reset()

    def reset(self) -> None:
        if len(self.blob_id) == 64:
            self._h = hashlib.sha256()
        else:
            self._h = hashlib.sha1(usedforsecurity=False)
            self._h.update(b"blob %d\0" % (self.size or 0))

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def hash_file(path: Path, blob_id: str, size: int | None, tick: Tick,
              hasher: Hasher | None = None) -> str:
    """The id of a file on disk (``size`` None: the file's own size)."""
    hasher = hasher or Hasher(blob_id, size if size is not None else path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            hasher.update(chunk)
            tick()
    return hasher.hexdigest()


# -- remembered checks --------------------------------------------------------------


def record_file() -> Path:
    """Where the checked files' records are kept (a cache: read as no
    record when it is not one)."""
    return paths.home() / "hub-verified.json"


def _key(blob: Path) -> str:
    try:
        return str(blob.relative_to(paths.hub_cache()))
    except ValueError:
        return str(blob)


def _load() -> dict:
    return records.read_record(record_file())


def _change(edit: Callable[[dict], object]) -> None:
    """Edit the records under their lock (another pull may be remembering
    its blobs at the same time), dropping those of blobs that are gone."""
    def apply(data: dict) -> None:
        edit(data)
        for key in [k for k in data if not (paths.hub_cache() / k).exists()]:
            del data[key]

    records.update_record(record_file(), apply, indent=1, sort_keys=True)


def remember(blob: Path) -> None:
    stamp = disk.stamp(blob)  # a JSON list
    _change(lambda data: data.__setitem__(_key(blob), stamp))


def forget(blob: Path) -> None:
    if _key(blob) in _load():
        _change(lambda data: data.pop(_key(blob), None))


def checked_before(blob: Path) -> bool:
    """Whether the blob passed a check and has not changed since."""
    stamp = disk.stamp(blob)
    return stamp is not None and _load().get(_key(blob)) == list(stamp)


def check(blob: Path, size: int | None, tick: Tick) -> str | None:
    """None if the blob's content is its name (checked now or remembered),
    else what its content's id is."""
    if checked_before(blob):
        return None
    blob_id = blob.name
    got = hash_file(blob, blob_id, size, tick)
    if got != blob_id:
        return got
    remember(blob)
    return None


# -- partial downloads and locks --------------------------------------------------------


def lock_path(storage: Path, blob_id: str) -> Path:
    return paths.hub_cache() / ".locks" / storage.name / f"{blob_id}.lock"


@contextlib.contextmanager
def claimed(storage: Path, blob_id: str, tick: Tick, waiting: Callable[[], None]) -> Iterator[Path]:
    """Hold the blob's lock (waiting for a live owner, calling ``tick`` so
    Cancel works, and ``waiting`` once) and yield its partial file's path,
    with whatever a dead process left adopted into it."""
    path = lock_path(storage, blob_id)
    told = False
    while (lock := staging.try_lock(path, LOCK_MODE)) is None:
        if not told:
            waiting()
            told = True
        time.sleep(POLL)
        tick()
    try:
        yield _adopt(storage, blob_id)
    finally:
        staging.unlock(path, lock)


def _adopt(storage: Path, blob_id: str) -> Path:
    """Our partial file, taking over the largest one huggingface_hub's own
    downloads leave (``<id>.<random>.incomplete``) when it is dead."""
    ours = storage / "blobs" / f"{blob_id}.incomplete"
    theirs = sorted((p for p in (storage / "blobs").glob(f"{blob_id}.*.incomplete")),
                    key=lambda p: p.stat().st_size if p.exists() else 0)
    for p in theirs:
        bigger = p.stat().st_size > (ours.stat().st_size if ours.exists() else -1)
        if bigger:
            os.replace(p, ours)
        else:
            p.unlink(missing_ok=True)
    return ours


def sweep(storage: Path, keep: set[str]) -> None:
    """Delete partial files and lock files of this repo that no live
    process holds, except partials of ``keep`` (resumed next). (A folder
    that is not there globs as empty.)"""
    for p in (storage / "blobs").glob("*.incomplete"):
        blob_id = p.name.split(".", 1)[0]
        if blob_id not in keep:
            staging.remove_if_unlocked(lock_path(storage, blob_id), p, LOCK_MODE, create=True)
    locks = paths.hub_cache() / ".locks" / storage.name
    for path in locks.glob("*.lock"):
        staging.remove_if_unlocked(path, None, LOCK_MODE)
    with contextlib.suppress(OSError):
        locks.rmdir()  # only if empty (and there)


# -- blobs and snapshot links ---------------------------------------------------------------


def link(blob: Path, pointer: Path) -> None:
    """``snapshots/<commit>/<name>`` -> ``../../blobs/<id>``, as huggingface_hub
    lays it out (a copy where links are not allowed)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f".{pointer.name}.{secrets.token_hex(4)}.link")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    except OSError:
        shutil.copyfile(blob, tmp)
    os.replace(tmp, pointer)


def points_to(pointer: Path, blob: Path) -> bool:
    try:
        return pointer.is_symlink() and Path(os.path.realpath(pointer)) == blob.resolve()
    except OSError:
        return False


def remove_blob(storage: Path, blob_id: str) -> None:
    """Delete a blob and every snapshot link to it."""
    blob = storage / "blobs" / blob_id
    for pointer in (storage / "snapshots").rglob("*"):  # none if there is no such folder
        if points_to(pointer, blob):
            pointer.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)
    forget(blob)
