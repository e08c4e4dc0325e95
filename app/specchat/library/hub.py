"""Downloads from the Hugging Face Hub: checked, resumable, cancellable,
and bounded in time.

How it works, and why:

* One ``model_info`` call lists the repo's files with their sizes and
  content ids at a fixed commit, so the total is known before the first byte,
  a repo without safetensors is refused before anything is downloaded, and
  a pull that cannot fit on the disk is refused with the numbers (only what
  is still missing counts).
* Files are fetched one by one (small files first) into ``<home>/hub``, the
  Hub's own cache layout: content-addressed blobs named by their id, linked
  from ``snapshots/<commit>/``. A retry after a cancel, a crash or a dropped
  connection downloads only what is missing, an update only what changed.
* Every file is checked against the id the Hub gives (SHA-256 for LFS
  files, the git blob id for small ones) before it becomes a blob, and
  cached blobs are checked again (cheaply: only those that changed since
  their last check, see ``hub_files``) before a pull says "up to date" and
  before an installed copy is used. A file that does not match is deleted
  and named, with the expected and the actual id.
* What the server says becomes paths and bytes on disk, so it is bounded
  first: the commit must be 40 hex digits (it names ``snapshots/<commit>``),
  a typed revision a name git allows (it names ``refs/<revision>``), and a
  file is written only up to its listed size (a server sending more, or
  never stopping, is cut off there instead of filling the disk).
* A file cut off midway stays as ``blobs/<id>.incomplete`` under a lock, and
  the next pull, in this process or another, resumes it with a Range request;
  partial and lock files of dead processes are removed (``hub_files``).
* The HTTP requests, their timeouts, Cancel while the server is silent, and
  the one-line messages for what a server said are in ``hub_net``.
* The index entry is written last, after every file is complete and
  checked: an interrupted or refused pull never lists a model, and a listed
  model whose file turns out damaged is unlisted before the file is removed.

The token for gated or private repos is whatever huggingface_hub finds
(HF_TOKEN, or the file ``hf auth login`` writes); SpecChat never reads,
stores or prints it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat.engine.folders import MODEL_JSON  # the JSON files loading reads
from specchat.library import disk, hub_files, hub_net, index, paths
from specchat.library.catalog import load_catalog
from specchat.library.errors import LibraryError
from specchat.library.facts import read_folder
from specchat.library.hub_ref import HubRef, parse_ref
from specchat.library.index import InstalledModel
from specchat.library.progress import DownloadProgress
from specchat.library.units import size_text

# What mlx-lm needs from a repo (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS without
# *.py, since SpecChat never runs repository code, and with MODEL_JSON for
# *.json). Folder imports copy the same files (importing.wanted_files).
ALLOW_PATTERNS = [*MODEL_JSON, "model*.safetensors", "tokenizer.model", "*.tiktoken",
                  "tiktoken.model", "*.txt", "*.jinja"]
# Seconds between progress reports (the first and last of each file always go).
PROGRESS_INTERVAL = 0.1
_PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # always fullmatch: "$" lets a trailing newline through
_BLOB_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob id or a SHA-256


class DownloadCancelled(LibraryError):
    """The user cancelled; finished files are kept for the next pull."""


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    if value.upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    # As huggingface_hub read it at its import, if it is imported (never imported for this).
    hf_constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(hf_constants, "HF_HUB_OFFLINE", False))


def installed(ref: str | HubRef) -> InstalledModel | None:
    """The installed copy of a Hub reference, without any network access."""
    hub = ref if isinstance(ref, HubRef) else parse_ref(ref)
    model = index.find_source(hub.ref)
    if model is None and hub.revision and _COMMIT.fullmatch(hub.revision):
        model = next((m for m in index.list_installed()
                      if m.kind == "hub" and m.revision == hub.revision
                      and m.source.split("@", 1)[0] == f"hf:{hub.repo}"), None)
    return model


# -- progress ------------------------------------------------------------------


class _Tracker:
    """Adds up bytes over files, computes the rate, throttles reports and
    raises DownloadCancelled when asked to. It runs on the calling thread
    only: the network waits call ``tick`` every ~0.1 s (``hub_net``)."""

    def __init__(self, total: int, label: str, progress: Callable[[DownloadProgress], None] | None,
                 cancelled: threading.Event | None):
        self.total = total
        self.base = 0  # bytes of finished files
        self.current = 0  # bytes of the file being downloaded
        self.label = label
        self.file: str | None = None
        self.progress = progress
        self.cancelled = cancelled
        self._last = 0.0
        self._samples: deque[tuple[float, int]] = deque()

    @property
    def done(self) -> int:
        return self.base + self.current

    def check(self) -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise DownloadCancelled(
                f"Download of {self.label} cancelled; the finished files are kept and the "
                "next pull continues from them.")

    def tick(self) -> None:
        """Called while waiting on the network or hashing: Cancel and progress."""
        self.check()
        self.emit()

    def rate(self) -> float:
        now = time.monotonic()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > 5.0:
            self._samples.popleft()
        t0, d0 = self._samples[0]
        return max(0.0, (self.done - d0) / (now - t0)) if now > t0 else 0.0

    def emit(self, message: str | None = None, force: bool = False) -> None:
        rate = self.rate()
        now = time.monotonic()
        if self.progress is None or (not force and now - self._last < PROGRESS_INTERVAL):
            return
        self._last = now
        text = message or (f"Downloading {self.label}: {self.file}" if self.file
                           else f"Downloading {self.label}")
        self.progress(DownloadProgress(self.done, self.total, rate, text, self.file))

    def advance(self, n: int) -> None:
        self.current = max(0, self.current + n)
        self.tick()

    def start(self, name: str) -> None:
        self.check()
        self.file = name
        self.current = 0
        self.emit(force=True)

    def finish(self, size: int) -> None:
        self.base += size
        self.current = 0
        self.emit(force=True)


# -- what went wrong, in words ---------------------------------------------------------


# -- what the repo has -------------------------------------------------------------------


@dataclass(frozen=True)
class _RemoteFile:
    name: str
    size: int
    etag: str  # LFS sha256, else the git blob id: the cache's blob name and its checksum


def _remote_files(hub: HubRef, tick: Callable[[], None]
                  ) -> tuple[str, list[_RemoteFile], list[str]]:
    """(commit, wanted files, every file name) at the requested revision."""
    info = hub_net.model_info(hub.repo, hub.revision, tick)
    if not info.sha:
        raise LibraryError(f"The Hub did not say which commit {hub.ref} is at.")
    if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
        # It becomes a folder name (snapshots/<commit>): "../.." would write
        # outside the library.
        raise LibraryError(
            f"{hub_net.host(hub_net.endpoint())} gave {hub_net.short(repr(info.sha))} as the "
            f"commit of {hub.ref}, which is not a commit id (40 hex digits); nothing was "
            "downloaded. Is HF_ENDPOINT right?")
    siblings = info.siblings or []
    names = [s.rfilename for s in siblings]
    from huggingface_hub.utils import filter_repo_objects

    wanted = set(filter_repo_objects(names, allow_patterns=ALLOW_PATTERNS))
    files = []
    for s in siblings:
        if s.rfilename not in wanted or "/" in s.rfilename:
            continue
        lfs = getattr(s, "lfs", None)
        etag = lfs.sha256 if lfs is not None else getattr(s, "blob_id", None)
        if not etag or not _BLOB_ID.fullmatch(etag) or s.size is None:
            raise LibraryError(
                f"The Hub gave no checksum or size for {s.rfilename} of {hub.ref}; SpecChat "
                "does not install files it cannot check.")
        files.append(_RemoteFile(s.rfilename, s.size, etag))
    return info.sha, files, names


HEAD_MAX_BYTES = 4 << 30  # a draft head is one layer: published ones are well under 1 GB


def _refuse_unusable(hub: HubRef, files: list[_RemoteFile], names: list[str]) -> None:
    have = {f.name for f in files}
    if not any(n.startswith("model") and n.endswith(".safetensors") for n in have):
        pickled = [n for n in names if n.endswith(_PICKLED)]
        ggufs = [n for n in names if n.lower().endswith(".gguf")]
        if pickled:
            raise LibraryError(
                f"{hub.ref} has no safetensors weights, only pickled PyTorch files "
                f"({pickled[0]}); SpecChat does not load pickled weights because they can run "
                "code. Look for an MLX or safetensors version, e.g. on "
                "https://huggingface.co/mlx-community.")
        if ggufs:
            raise LibraryError(
                f"{hub.ref} has GGUF files ({ggufs[0]}) but no safetensors weights: download "
                "the .gguf and bring it in with `specchat models import FILE.gguf`.")
        raise LibraryError(f"{hub.ref} has no model weights (no model*.safetensors files).")
    if "config.json" not in have:
        raise LibraryError(f"{hub.ref} is not a model repo mlx-lm can load (no config.json).")
    # A draft head (EAGLE-3) has no tokenizer of its own: it drafts with the
    # target's. Its config, read once downloaded (facts.read_folder), says
    # whether it is one; a model that small without one is refused there.
    small = sum(f.size for f in files) <= HEAD_MAX_BYTES
    if "tokenizer.json" not in have and "tokenizer.model" not in have and not small:
        raise LibraryError(f"{hub.ref} has no tokenizer (tokenizer.json is missing).")


def _storage_folder(hub: HubRef) -> Path:
    return paths.hub_cache() / ("models--" + hub.repo.replace("/", "--"))


def _entry_name(hub: HubRef) -> str:
    """The name a new download is listed under (``index.claim`` adds -2...
    if another model has it)."""
    if hub.revision is not None:
        wanted = f"{hub.name}@{hub.revision[:12]}"
    else:  # a catalog model is named by its catalog id
        known = load_catalog().model(hub.ref)
        wanted = known.id if known is not None else hub.name
    return index.sanitize(wanted)


def pull(ref: str, progress: Callable[[DownloadProgress], None] | None = None,
         cancelled: threading.Event | None = None) -> InstalledModel:
    """Download (or update) ``hf:org/repo[@revision]`` and list it (a
    catalog id or a ``bundled:`` reference is pulled by ``refs.pull``,
    which comes here for the Hub's).

    Asks the Hub which commit the revision is at and fetches only files that
    are not cached (or whose cached copy no longer matches its checksum).
    Offline (HF_HUB_OFFLINE=1) or with the Hub out of reach, an installed
    copy is returned as it is (after checking its files) and the progress
    message says so; without one, LibraryError explains what to do.
    """
    hub = parse_ref(ref)
    say = progress or (lambda _p: None)
    have = installed(hub)
    if offline():
        if have is not None:
            return _fall_back(hub, have, progress, cancelled, "Offline mode:")
        raise LibraryError(
            f"Offline mode (HF_HUB_OFFLINE is set): {hub.ref} has not been downloaded yet. "
            "Unset HF_HUB_OFFLINE and connect to the internet to pull it, or pick an "
            "installed model (`specchat models list`).")
    if have is not None and hub.revision and _COMMIT.fullmatch(hub.revision) \
            and have.revision == hub.revision:
        # A commit never changes: nothing to ask the Hub, but the files are checked.
        _check_installed(hub, have, progress, cancelled)
        return have
    say(DownloadProgress(0, None, 0.0, f"Asking the Hub about {hub.ref}"))
    asking = _Tracker(0, hub.name, None, cancelled)
    try:
        commit, files, names = _remote_files(hub, asking.tick)
    except Exception as exc:  # noqa: BLE001 - translated into one message
        err = hub_net.translate(exc, hub)
        if have is not None and isinstance(err, hub_net.HubUnreachable):
            return _fall_back(hub, have, progress, cancelled, "Could not reach the Hub;")
        if err is exc:
            raise
        raise err from exc
    _refuse_unusable(hub, files, names)
    storage = _storage_folder(hub)
    total = sum(f.size for f in files)
    tracker = _Tracker(total, hub.name, progress, cancelled)
    todo = _missing(hub, storage, files, tracker)
    tracker.base = total - sum(f.size for f in todo)
    snapshot = storage / "snapshots" / commit
    have = installed(hub)  # it may have been unlisted for a damaged file
    linked = all(hub_files.points_to(snapshot / f.name, storage / "blobs" / f.etag) for f in files)
    if not todo and have is not None and have.revision == commit \
            and Path(have.path) == snapshot and linked:
        say(DownloadProgress(have.size_bytes, have.size_bytes, 0.0, f"{hub.ref} is up to date"))
        return have
    hub_files.sweep(storage, keep={f.etag for f in todo})
    _check_space(hub, storage, todo)
    _download(hub, commit, files, todo, storage, tracker)
    return _register(hub, commit, snapshot, have)


def _fall_back(hub: HubRef, have: InstalledModel, progress, cancelled,
               why: str) -> InstalledModel:
    """The Hub is out of reach (``why``, in words, ends with its colon or
    semicolon): the installed copy, if its files still check out."""
    _check_installed(hub, have, progress, cancelled)
    if progress is not None:
        progress(DownloadProgress(have.size_bytes, have.size_bytes, 0.0,
                                  f"{why} using the downloaded copy of {hub.ref} (not checked "
                                  "for updates)"))
    return have


def _recheck(hub: HubRef, storage: Path, blob: Path, name: str, size: int | None,
             tracker: _Tracker) -> str | None:
    """None if a cached blob (the file ``name``) still matches its id (it is
    hashed again only if it changed since its last check); else it is
    unlisted and removed, and what was wrong is returned in words."""
    if not hub_files.checked_before(blob):
        tracker.emit(f"Checking {name} of {hub.name}", force=True)
    got = hub_files.check(blob, size, tracker.tick)
    if got is None:
        return None
    _unlist_users(storage, blob)
    hub_files.remove_blob(storage, blob.name)
    return f"{name}: expected {hub_files.kind_of(blob.name)} {blob.name}, the file has {got}"


def _unlist_users(storage: Path, blob: Path) -> None:
    """Unlist every installed model with a file in this blob (before the
    blob is removed, so nothing listed ever misses a file)."""
    for m in index.list_installed():
        folder = Path(m.path)
        if m.kind != "hub" or folder.parent != storage / "snapshots" or not folder.is_dir():
            continue
        if any(hub_files.points_to(p, blob) for p in folder.iterdir()):
            index.unlist(m.name)


def _missing(hub: HubRef, storage: Path, files: list[_RemoteFile],
             tracker: _Tracker) -> list[_RemoteFile]:
    """The files to download: not cached, or cached but no longer matching
    their checksum (those are unlisted, removed and fetched again)."""
    todo = []
    for f in files:
        blob = storage / "blobs" / f.etag
        if blob.is_file():
            damage = _recheck(hub, storage, blob, f.name, f.size, tracker)
            if damage is None:
                continue
            tracker.emit(f"{f.name} in the library was damaged ({damage}); downloading it again",
                         force=True)
        todo.append(f)
    return todo


def _check_space(hub: HubRef, storage: Path, todo: list[_RemoteFile]) -> None:
    """Refuse before the first byte if what is still missing cannot fit
    (bytes already in partial files count as there)."""
    needed = 0
    for f in todo:
        partials = [p for p in (storage / "blobs").glob(f"{f.etag}*.incomplete") if p.is_file()]
        have = max((p.stat().st_size for p in partials), default=0)
        needed += max(0, f.size - min(have, f.size))
    disk.check_free_space(paths.hub_cache(create=True), needed, hub.ref)


class _TooLong(LibraryError):
    """The server sent more bytes than the file has (its partial file is deleted)."""


class _PartialFile:
    """A blob's ``.incomplete`` file: appends what arrives, hashes it, counts
    it, and stops at the file's size (a server that sends more, or never
    stops, must not fill the disk before the checksum can refuse it)."""

    def __init__(self, path: Path, f: _RemoteFile, tracker: _Tracker, ref: str):
        self.path = path
        self.tracker = tracker
        self.name = f.name
        self.size = f.size
        self.ref = ref
        self.hasher = hub_files.Hasher(f.etag, f.size)
        self.offset = path.stat().st_size if path.is_file() else 0
        if self.offset > f.size:
            path.unlink()
            self.offset = 0
        if self.offset:
            tracker.emit(f"Resuming {f.name} of {tracker.label} at {size_text(self.offset)}",
                         force=True)
            hub_files.hash_file(path, f.etag, f.size, tracker.tick, self.hasher)
            tracker.advance(self.offset)
        self.file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def write(self, data: bytes) -> None:
        if self.offset + len(data) > self.size:
            raise _TooLong(
                f"{self.ref}: the server sent more than the {size_text(self.size)} "
                f"({self.size} bytes) the Hub gave as the size of {self.name}; the download was "
                "stopped and deleted and nothing was installed. Something between you and the "
                "Hub (a proxy, a captive portal, a bad mirror) changed it. Try again later or "
                "from another network.")
        view = memoryview(data)
        while view:
            n = self.file.write(view)
            view = view[n:]
        self.hasher.update(data)
        self.offset += len(data)
        self.tracker.advance(len(data))

    def restart(self) -> None:
        self.file.truncate(0)
        self.file.seek(0)
        self.hasher.reset()
        self.tracker.advance(-self.offset)
        self.offset = 0

    def close(self) -> None:
        """Keep what arrived for the next pull to resume (an empty file is dropped)."""
        if not self.file.closed:
            self.file.close()
        if self.offset == 0:
            self.path.unlink(missing_ok=True)

    def finish(self) -> str:
        os.fsync(self.file.fileno())
        self.file.close()
        return self.hasher.hexdigest()

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _download(hub: HubRef, commit: str, files: list[_RemoteFile], todo: list[_RemoteFile],
              storage: Path, tracker: _Tracker) -> None:
    tracker.emit(f"Downloading {hub.name}: {len(todo)} of {len(files)} files to fetch",
                 force=True)
    # Small files first: a cut-off pull then leaves the most files finished.
    for f in sorted(todo, key=lambda f: (f.size, f.name)):
        tracker.start(f.name)
        _fetch(hub, commit, f, storage, tracker)
        tracker.finish(f.size)
    snapshot = storage / "snapshots" / commit
    for f in files:
        blob = storage / "blobs" / f.etag
        if not hub_files.points_to(snapshot / f.name, blob):
            hub_files.link(blob, snapshot / f.name)
    _remember_ref(storage, hub, commit)
    tracker.emit(f"Downloaded {hub.name}", force=True)


def _fetch(hub: HubRef, commit: str, f: _RemoteFile, storage: Path, tracker: _Tracker) -> None:
    """One file into its blob, checked, resuming a partial file if any."""
    blob = storage / "blobs" / f.etag
    blob.parent.mkdir(parents=True, exist_ok=True)

    def waiting() -> None:
        tracker.emit(f"Waiting for another download of {f.name} to finish", force=True)

    with hub_files.claimed(storage, f.etag, tracker.tick, waiting) as partial:
        if blob.is_file():  # another process finished it while we waited
            if hub_files.check(blob, f.size, tracker.tick) is None:
                return
            hub_files.remove_blob(storage, f.etag)
        sink = _PartialFile(partial, f, tracker, hub.ref)
        try:
            hub_net.download(hub_net.file_url(hub.repo, commit, f.name), f.name, f.size, sink,
                             tracker.tick)
        except (DownloadCancelled, _TooLong):
            sink.discard()  # the file is dropped (nothing to resume), finished files stay
            raise
        except BaseException as exc:
            sink.close()  # kept: the next pull resumes it
            err = hub_net.translate(exc, hub, f.name) if isinstance(exc, Exception) else exc
            if err is exc:
                raise
            raise err from exc
        got = sink.finish()
        if got != f.etag or sink.offset != f.size:
            sink.discard()
            sizes = "" if sink.offset == f.size else \
                f" ({sink.offset} bytes instead of {f.size})"
            raise LibraryError(
                f"{hub.ref}: {f.name} as downloaded does not match the Hub's checksum"
                f"{sizes}: expected {hub_files.kind_of(f.etag)} {f.etag}, got {got}. It was "
                "deleted and nothing was installed: something between you and the Hub (a "
                "proxy, a captive portal, a bad mirror) changed it. Try again later or from "
                "another network.")
        os.replace(partial, blob)
        hub_files.remember(blob)


def _remember_ref(storage: Path, hub: HubRef, commit: str) -> None:
    """``refs/<branch>`` -> commit, as huggingface_hub keeps it (for tools
    that read the cache)."""
    revision = hub.revision or "main"
    if revision == commit:
        return
    ref_file = storage / "refs" / revision
    with contextlib.suppress(OSError):  # only a convenience for other tools
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        if not ref_file.is_file() or ref_file.read_text() != commit:
            ref_file.write_text(commit)


def _check_installed(hub: HubRef, have: InstalledModel, progress, cancelled) -> None:
    """Check an installed copy's files without the network (_recheck); a
    damaged one is removed, the model unlisted, and LibraryError names it."""
    tracker = _Tracker(have.size_bytes, hub.name, progress, cancelled)
    folder = Path(have.path)
    storage = folder.parent.parent
    problems = []
    for pointer in sorted(folder.iterdir()) if folder.is_dir() else []:
        blob = Path(os.path.realpath(pointer))
        if _BLOB_ID.fullmatch(blob.name) and blob.is_file():
            damage = _recheck(hub, storage, blob, pointer.name, None, tracker)
            if damage is not None:
                problems.append(damage)
    if problems:
        raise LibraryError(
            f"{have.name} ({hub.ref}) is damaged and was removed from the list: "
            f"{'; '.join(problems)}. Run `specchat models pull {hub.ref}` to download it again.")


def _register(hub: HubRef, commit: str, snapshot: Path,
              previous: InstalledModel | None) -> InstalledModel:
    try:
        facts = read_folder(snapshot)
    except LibraryError as exc:
        raise LibraryError(f"{hub.ref} was downloaded but cannot be used: {exc}") from exc
    if previous is not None:  # an update keeps its name
        model = index.add(InstalledModel.create(previous.name, hub.ref, "hub", snapshot, facts,
                                                revision=commit))
    else:
        model = index.claim(_entry_name(hub), hub.ref, lambda name: InstalledModel.create(
            name, hub.ref, "hub", snapshot, facts, revision=commit))
    if previous is not None and previous.revision != commit:
        prune(_storage_folder(hub))
    return model


def prune(storage: Path) -> None:
    """Delete snapshots of a cached repo that no index entry uses, and blobs
    no remaining snapshot points to (what an update left behind)."""
    snapshots = storage / "snapshots"
    if not snapshots.is_dir():
        return
    used = {Path(m.path).name for m in index.list_installed()
            if m.kind == "hub" and Path(m.path).parent == snapshots}
    keep: set[str] = set()  # the blobs the snapshots kept link to
    for snap in snapshots.iterdir():
        if snap.name not in used:
            shutil.rmtree(snap, ignore_errors=True)
        else:
            keep.update(Path(os.path.realpath(link)).name for link in snap.rglob("*")
                        if link.is_symlink())
    for blob in (storage / "blobs").glob("*"):  # none if there is no such folder
        if blob.is_file() and not blob.name.endswith(".incomplete") and blob.name not in keep:
            blob.unlink(missing_ok=True)


def resolve(ref: str, progress: Callable[[DownloadProgress], None] | None = None,
            cancelled: threading.Event | None = None) -> Path:
    """The folder of an ``hf:`` reference: the installed copy if there is one
    and its files check out (no network), otherwise pulled now."""
    hub = parse_ref(ref)
    have = installed(hub)
    if have is not None and Path(have.path).is_dir():
        try:
            _check_installed(hub, have, progress, cancelled)
            return Path(have.path)
        except DownloadCancelled:
            raise
        except LibraryError as damaged:
            if offline():
                raise
            if progress is not None:
                progress(DownloadProgress(0, None, 0.0, f"{damaged} Downloading it again."))
    return Path(pull(ref, progress, cancelled).path)
