"""Downloads from the Hugging Face Hub, with progress, cancellation and resume.

How it works, and why:

* One ``model_info`` call lists the repo's files with their sizes and
  content ids at a fixed commit, so the total is known before the first byte
  and a repo without safetensors is refused before anything is downloaded.
* Files are then fetched one by one with ``hf_hub_download`` at that commit
  (small files first) into ``<home>/hub``, the Hub's own cache layout.
  Finished files are content-addressed blobs there, so a retry after a
  cancel, a crash or a dropped connection downloads only what is missing,
  and an update downloads only files that changed. Within a file,
  huggingface_hub itself resumes a dropped connection with a Range request.
* Progress and cancellation go through a small tqdm stand-in handed to
  ``hf_hub_download(tqdm_class=...)``: it is told about every chunk, and
  raises when the ``threading.Event`` is set, which aborts the file (its
  temporary file is deleted) without touching finished ones.
* Xet transfers are switched off: plain HTTP goes through the hooks above,
  and hf_xet would keep a chunk cache in ~/.cache/huggingface, outside our
  folder. ``cache_dir`` and ``endpoint`` are passed explicitly on every call
  (HF_ENDPOINT is read at call time, so tests can point it at a local server).
* The index entry is written last, after every file is checked against its
  expected size: an interrupted pull never lists a model.

The token for gated or private repos is whatever huggingface_hub finds
(HF_TOKEN, or the file ``hf auth login`` writes); SpecChat never reads,
stores or prints it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecChatError
from specchat.library import index, paths
from specchat.library.errors import LibraryError
from specchat.library.index import InstalledModel

# What mlx-lm needs from a repo (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS without
# *.py: SpecChat never runs repository code).
ALLOW_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken",
                  "tiktoken.model", "*.txt", "*.jinja"]
# Read size for streamed downloads: how often progress is reported and
# cancellation is noticed (huggingface_hub's default is 10 MB).
CHUNK_BYTES = 1024 * 1024
# Seconds between progress reports (the first and last of each file always go).
PROGRESS_INTERVAL = 0.1
_PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report: bytes done of the total (None if unknown), the
    recent rate in bytes per second, and what is happening in words."""

    done_bytes: int
    total_bytes: int | None
    rate_bps: float
    message: str
    file: str | None = None
    step_fraction: float | None = None  # for work that is not counted in bytes

    @property
    def fraction(self) -> float | None:
        if not self.total_bytes:
            return self.step_fraction
        return min(1.0, self.done_bytes / self.total_bytes)

    def describe(self) -> str:
        """The message with bytes and rate, e.g. "model.safetensors - 1.2 GB of 3.1 GB, 24.0 MB/s"."""
        from specchat.library.units import size_text

        text = self.message
        if self.total_bytes and self.file:
            text += f" - {size_text(self.done_bytes)} of {size_text(self.total_bytes)}"
            if self.rate_bps > 0:
                text += f", {size_text(self.rate_bps)}/s"
        return text


class DownloadCancelled(LibraryError):
    """The user cancelled; finished files are kept for the next pull."""


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None = None

    @property
    def ref(self) -> str:
        return f"hf:{self.repo}" + (f"@{self.revision}" if self.revision else "")

    @property
    def name(self) -> str:
        return self.repo.split("/", 1)[1]


def parse_ref(ref: str) -> HubRef:
    """``hf:org/repo[@revision]`` (the ``hf:`` prefix is optional here)."""
    body = ref[3:] if ref.startswith("hf:") else ref
    repo, _, revision = body.partition("@")
    repo = repo.strip().strip("/")
    if not _REPO.match(repo):
        raise LibraryError(
            f"{ref!r} is not a Hub reference: use hf:org/repo or hf:org/repo@revision, "
            "e.g. hf:mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    return HubRef(repo, revision.strip() or None)


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    if value.upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    try:
        import sys

        hf_constants = sys.modules.get("huggingface_hub.constants")
        return bool(hf_constants and hf_constants.HF_HUB_OFFLINE)
    except AttributeError:
        return False


def endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def installed(ref: str | HubRef) -> InstalledModel | None:
    """The installed copy of a Hub reference, without any network access."""
    hub = ref if isinstance(ref, HubRef) else parse_ref(ref)
    model = index.find_source(hub.ref)
    if model is None and hub.revision and _COMMIT.match(hub.revision):
        model = next((m for m in index.list_installed()
                      if m.kind == "hub" and m.revision == hub.revision
                      and m.source.split("@", 1)[0] == f"hf:{hub.repo}"), None)
    return model


# -- progress ------------------------------------------------------------------


class _Tracker:
    """Adds up bytes over files, computes the rate, throttles reports and
    raises DownloadCancelled from inside the download when asked to."""

    def __init__(self, total: int, done: int, label: str,
                 progress: Callable[[DownloadProgress], None] | None,
                 cancelled: threading.Event | None, interval: float | None = None):
        self.total = total
        self.base = done  # bytes of finished files
        self.current = 0  # bytes of the file being downloaded
        self.label = label
        self.file: str | None = None
        self.progress = progress
        self.cancelled = cancelled
        self.interval = PROGRESS_INTERVAL if interval is None else interval
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

    def rate(self) -> float:
        now = time.monotonic()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > 5.0:
            self._samples.popleft()
        t0, d0 = self._samples[0]
        return (self.done - d0) / (now - t0) if now > t0 else 0.0

    def emit(self, message: str | None = None, force: bool = False) -> None:
        rate = self.rate()
        now = time.monotonic()
        if self.progress is None or (not force and now - self._last < self.interval):
            return
        self._last = now
        text = message or (f"Downloading {self.label}: {self.file}" if self.file
                           else f"Downloading {self.label}")
        self.progress(DownloadProgress(self.done, self.total, rate, text, self.file))

    def advance(self, n: int) -> None:
        self.check()
        self.current = max(0, self.current + int(n or 0))
        self.emit()

    def start(self, name: str) -> None:
        self.check()
        self.file = name
        self.current = 0
        self.emit(force=True)

    def finish(self, size: int) -> None:
        self.base += size
        self.current = 0
        self.emit(force=True)

    def fail(self) -> None:
        self.current = 0


def _bar_class(tracker: _Tracker) -> type:
    """A tqdm look-alike bound to ``tracker`` (huggingface_hub instantiates
    ``tqdm_class(total=..., initial=..., desc=..., ...)`` per file and calls
    ``update(n)`` per chunk, with a negative n when it restarts a file)."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            self.n = kwargs.get("initial") or 0
            self.total = kwargs.get("total")

        def update(self, n: int | float | None = 1) -> None:
            self.n += n or 0
            tracker.advance(int(n or 0))

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> bool:
            return False

        def close(self) -> None:
            pass

        def refresh(self, *args, **kwargs) -> None:
            pass

        def set_description(self, *args, **kwargs) -> None:
            pass

        def set_postfix_str(self, *args, **kwargs) -> None:
            pass

    return _Bar


# -- talking to the Hub --------------------------------------------------------


def _hf():
    """Import huggingface_hub and set the two knobs SpecChat relies on."""
    import huggingface_hub
    from huggingface_hub import constants

    constants.HF_HUB_DISABLE_XET = True
    constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
    return huggingface_hub


class HubUnreachable(LibraryError):
    """The Hub could not be reached (no network, DNS, firewall, Hub down)."""


# Exception class names, across huggingface_hub's HTTP stacks (requests in
# 0.x, httpx in 1.x, httpx2 in 2.x), that mean "no connection at all" or "the
# connection broke midway".
_UNREACHABLE = {"ConnectError", "ConnectTimeout", "ConnectionError", "ProxyError",
                "OfflineModeIsEnabled", "PoolTimeout"}
_BROKEN = {"ReadError", "ReadTimeout", "RemoteProtocolError", "ChunkedEncodingError",
           "WriteError", "TimeoutException", "Timeout", "NetworkError", "TransportError"}


def _kinds(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def _translate(exc: Exception, hub: HubRef) -> LibraryError:
    """One sentence a person can act on, for whatever the client raised."""
    from huggingface_hub import errors

    if isinstance(exc, LibraryError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        return LibraryError(
            f"{hub.ref} is gated: accept its terms at https://huggingface.co/{hub.repo} and log "
            "in with `hf auth login` (SpecChat uses the token huggingface_hub saves).")
    if isinstance(exc, errors.RevisionNotFoundError):
        return LibraryError(f"{hub.ref}: revision {hub.revision!r} does not exist on the Hub.")
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(exc, errors.RepositoryNotFoundError) or (
            isinstance(exc, errors.HfHubHTTPError) and status == 401):
        return LibraryError(
            f"{hub.ref} was not found on the Hugging Face Hub. Check the name (it is "
            "case-sensitive, e.g. hf:mlx-community/Qwen2.5-0.5B-Instruct-4bit); private repos "
            "need `hf auth login`.")
    kinds = _kinds(exc)
    if kinds & _UNREACHABLE:
        where = endpoint() or "https://huggingface.co"
        return HubUnreachable(
            f"Could not reach the Hugging Face Hub at {where} ({type(exc).__name__}) for "
            f"{hub.ref}. Check the connection; finished files are kept for the next pull.")
    if kinds & _BROKEN:
        return LibraryError(
            f"The connection to the Hub broke while downloading {hub.ref} "
            f"({type(exc).__name__}). Finished files are kept; run the pull again to continue.")
    if isinstance(exc, errors.HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return LibraryError(f"The Hugging Face Hub answered {status} for {hub.ref}: {first}")
    if isinstance(exc, OSError):
        return LibraryError(
            f"Download of {hub.ref} failed ({exc}). Finished files are kept; run the pull "
            "again to continue.")
    return LibraryError(f"Download of {hub.ref} failed: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class _RemoteFile:
    name: str
    size: int | None
    etag: str | None  # LFS sha256, else the git blob id: the cache's blob name


def _remote_files(hub: HubRef) -> tuple[str, list[_RemoteFile], list[str]]:
    """(commit, wanted files, every file name) at the requested revision."""
    hf = _hf()
    api = hf.HfApi(endpoint=endpoint(), library_name="specchat")
    info = api.model_info(hub.repo, revision=hub.revision, files_metadata=True)
    if not info.sha:
        raise LibraryError(f"The Hub did not say which commit {hub.ref} is at.")
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
        files.append(_RemoteFile(s.rfilename, s.size, etag))
    return info.sha, files, names


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
    if "tokenizer.json" not in have and "tokenizer.model" not in have:
        raise LibraryError(f"{hub.ref} has no tokenizer (tokenizer.json is missing).")


def _storage_folder(hub: HubRef) -> Path:
    return paths.hub_cache() / ("models--" + hub.repo.replace("/", "--"))


def _is_cached(storage: Path, commit: str, f: _RemoteFile) -> bool:
    pointer = storage / "snapshots" / commit / f.name
    if pointer.exists():
        return True
    return bool(f.etag) and (storage / "blobs" / f.etag).exists()


def _entry_name(hub: HubRef) -> str:
    from specchat.library.catalog import load_catalog

    wanted = hub.name
    if hub.revision is None:
        known = load_catalog().model(hub.ref)
        if known is not None:
            wanted = known.id
    else:
        wanted = f"{hub.name}@{hub.revision[:12]}"
    return index.unique_name(wanted, source=hub.ref)


def pull(ref: str, progress: Callable[[DownloadProgress], None] | None = None,
         cancelled: threading.Event | None = None) -> InstalledModel:
    """Download (or update) ``hf:org/repo[@revision]`` and list it.

    Asks the Hub which commit the revision is at and fetches only files that
    are not cached yet. Offline (HF_HUB_OFFLINE=1) or with the Hub out of
    reach, an installed copy is returned as it is and the progress message
    says so; without one, LibraryError explains what to do.
    """
    if not ref.startswith("hf:"):
        from specchat.library.catalog import load_catalog

        known = load_catalog().model(ref)
        ref = known.ref if known is not None else ref
        if ref.startswith("bundled:"):
            from specchat.library.sources.bundled import BundledSource

            return BundledSource().pull(ref, progress, cancelled)
    hub = parse_ref(ref)
    say = progress or (lambda _p: None)
    have = installed(hub)
    if offline():
        if have is not None:
            say(DownloadProgress(have.size_bytes, have.size_bytes, 0.0,
                                 f"Offline mode: using the downloaded copy of {hub.ref} "
                                 "(not checked for updates)"))
            return have
        raise LibraryError(
            f"Offline mode (HF_HUB_OFFLINE is set): {hub.ref} has not been downloaded yet. "
            "Unset HF_HUB_OFFLINE and connect to the internet to pull it, or pick an "
            "installed model (`specchat models list`).")
    if have is not None and hub.revision and _COMMIT.match(hub.revision) \
            and have.revision == hub.revision:
        return have  # a commit never changes: nothing to ask the Hub
    say(DownloadProgress(0, None, 0.0, f"Asking the Hub about {hub.ref}"))
    try:
        commit, files, names = _remote_files(hub)
    except Exception as exc:  # noqa: BLE001 - translated into one message
        err = _translate(exc, hub)
        if have is not None and isinstance(err, HubUnreachable):
            say(DownloadProgress(have.size_bytes, have.size_bytes, 0.0,
                                 f"Could not reach the Hub; using the downloaded copy of "
                                 f"{hub.ref} (not checked for updates)"))
            return have
        raise err from exc
    _refuse_unusable(hub, files, names)
    storage = _storage_folder(hub)
    if have is not None and have.revision == commit and Path(have.path).is_dir() and all(
            (Path(have.path) / f.name).exists() for f in files):
        say(DownloadProgress(have.size_bytes, have.size_bytes, 0.0, f"{hub.ref} is up to date"))
        return have
    snapshot = _download(hub, commit, files, storage, progress, cancelled)
    return _register(hub, commit, snapshot, have)


def _download(hub: HubRef, commit: str, files: list[_RemoteFile], storage: Path,
              progress, cancelled) -> Path:
    hf = _hf()
    todo = [f for f in files if not _is_cached(storage, commit, f)]
    total = sum(f.size or 0 for f in files)
    done = total - sum(f.size or 0 for f in todo)
    tracker = _Tracker(total, done, hub.name, progress, cancelled)
    bar = _bar_class(tracker)
    cache_dir = paths.hub_cache(create=True)
    tracker.emit(f"Downloading {hub.name}: {len(todo)} of {len(files)} files to fetch",
                 force=True)
    # Small files first: a cut-off pull then leaves the most files finished.
    for f in sorted(files, key=lambda f: (f.size or 0, f.name)):
        tracker.check()
        fetched = f in todo
        if not fetched and (storage / "snapshots" / commit / f.name).exists():
            continue
        if fetched:
            tracker.start(f.name)
        try:
            # For a file whose blob is cached (unchanged since another commit)
            # this only links it into the snapshot.
            hf.hf_hub_download(hub.repo, f.name, revision=commit, cache_dir=str(cache_dir),
                               endpoint=endpoint(), library_name="specchat", tqdm_class=bar)
        except SpecChatError:  # DownloadCancelled, or a caller's progress callback refusing
            tracker.fail()
            raise
        except Exception as exc:  # noqa: BLE001
            tracker.fail()
            raise _translate(exc, hub) from exc
        if fetched:
            tracker.finish(f.size or 0)
    snapshot = storage / "snapshots" / commit
    for f in files:
        local = snapshot / f.name
        if not local.exists() or (f.size is not None and local.stat().st_size != f.size):
            raise LibraryError(
                f"{hub.ref}: {f.name} is incomplete after download; run the pull again.")
    tracker.emit(f"Downloaded {hub.name}", force=True)
    return snapshot


def _register(hub: HubRef, commit: str, snapshot: Path,
              previous: InstalledModel | None) -> InstalledModel:
    from specchat.library.facts import read_folder

    try:
        facts = read_folder(snapshot)
    except LibraryError as exc:
        raise LibraryError(f"{hub.ref} was downloaded but cannot be used: {exc}") from exc
    name = previous.name if previous is not None else _entry_name(hub)
    model = InstalledModel.create(name, hub.ref, "hub", snapshot, facts, revision=commit)
    index.add(model)
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
    for snap in snapshots.iterdir():
        if snap.name not in used:
            shutil.rmtree(snap, ignore_errors=True)
    keep: set[str] = set()
    for snap in snapshots.iterdir():
        for link in snap.rglob("*"):
            if link.is_symlink():
                keep.add(Path(os.path.realpath(link)).name)
    blobs = storage / "blobs"
    if blobs.is_dir():
        for blob in blobs.iterdir():
            if blob.is_file() and not blob.name.endswith(".incomplete") and blob.name not in keep:
                blob.unlink(missing_ok=True)


def resolve(ref: str, progress: Callable[[DownloadProgress], None] | None = None,
            cancelled: threading.Event | None = None) -> Path:
    """The folder of an ``hf:`` reference: the installed copy if there is one
    (no network), otherwise pulled now."""
    have = installed(ref)
    if have is not None and Path(have.path).is_dir():
        return Path(have.path)
    return Path(pull(ref, progress, cancelled).path)
