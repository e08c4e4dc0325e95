"""The index of installed models: one small JSON file, ``<home>/index.json``.

An entry is written only after a model's files are complete, and the file is
replaced atomically (write a temporary file, fsync, rename), so a download
cut off midway or a crash never leaves a half-model listed. Writers take an
advisory lock so two SpecChat processes (the app and a terminal) do not lose
each other's entries.

Entries are read back checked field by field (``specchat.records``): one a
hand edit or another version broke is left out of every listing and named in
the log once, the others still list, and the file keeps it for whoever fixes
it (``specchat models rm NAME`` takes it off the list).

Only json, os and pathlib here: ``specchat models list`` must stay fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from specchat import records
from specchat.library import paths
from specchat.library.errors import LibraryError
from specchat.library.facts import ModelFacts

INDEX_VERSION = 1
# About 16,000 models' entries: anything bigger is not an index SpecChat wrote.
MAX_INDEX_BYTES = 16 * 2**20
log = logging.getLogger("specchat.library")
_thread_lock = threading.Lock()


# The index's own fields, which ``to_json`` puts before the folder's facts.
_PROVENANCE = ("name", "source", "kind", "path", "revision")


@dataclass(frozen=True)
class InstalledModel(ModelFacts):
    """One installed model, as the GUI and ``models list --json`` show it:
    the facts about its folder (it *is* a ModelFacts, so the index stores
    them flat) and where it came from.

    ``source`` says where it came from: ``hf:org/repo``, ``import:/folder``,
    ``gguf:/file.gguf`` or ``bundled:name``; ``kind`` is hub, import, gguf or
    bundled. ``revision`` is the Hub commit for hub models.
    """

    name: str
    source: str
    kind: str
    path: str
    revision: str | None
    installed_at: str

    @classmethod
    def create(cls, name: str, source: str, kind: str, path: Path, facts: ModelFacts,
               revision: str | None = None) -> InstalledModel:
        return cls(name=name, source=source, kind=kind, path=str(path), revision=revision,
                   installed_at=datetime.now(UTC).isoformat(timespec="seconds"),
                   **facts.to_json())

    @property
    def facts(self) -> ModelFacts:
        """Just the folder's facts (what a model on disk but not listed has too)."""
        return ModelFacts.from_json(asdict(self))

    @property
    def ref(self) -> str:
        """The reference that names this model everywhere (its installed name)."""
        return self.name

    def to_json(self) -> dict:
        data = asdict(self)
        return {**{k: data.pop(k) for k in _PROVENANCE}, **data}

    @classmethod
    def from_json(cls, data: object) -> InstalledModel:
        """An index entry, each field checked against its type
        (``records.fields_of``); ``records.BadRecord`` names the field that is
        not what it must be. Entries of older versions lack newer facts
        (None), and may lack or null the cache kind and the size."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items()
                    if not (k in ("attention", "size_bytes") and v is None)}
        return cls(**records.fields_of(cls, data, defaults={"attention": "full",
                                                             "size_bytes": 0}))


# -- reading and writing ------------------------------------------------------


def _read() -> dict[str, object]:
    """The index's entries by name, as stored (``_checked`` reads them)."""
    path = paths.index_file()
    try:
        data = records.read_json(path, MAX_INDEX_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, records.BadRecord) as exc:
        why = exc if isinstance(exc, records.BadRecord) else exc.strerror or exc
        raise LibraryError(
            f"The model index {path} cannot be read: {why}. Move it away and re-import or "
            "re-download your models; their files are still in the same folder.") from exc
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        records.report(log, f"The model index {path} holds no models table; it was read as "
                            "empty.")
        return {}
    return models


def _checked(models: dict[str, object]) -> dict[str, InstalledModel]:
    """The entries that are what they must be; each other one is named in
    the log (once) and left out."""
    out = {}
    for key, data in models.items():
        try:
            out[key] = InstalledModel.from_json(data)
        except records.BadRecord as exc:
            records.report(log, f"The model index {paths.index_file()}: the entry {key!r} was "
                                f"skipped: {exc}. Fix or remove it (`specchat models rm {key}`).")
    return out


def _write(models: dict[str, dict]) -> None:
    records.write_json(paths.index_file(), {"version": INDEX_VERSION, "models": models},
                       indent=2, sort_keys=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Exclusive lock for read-modify-write of the index (threads and processes)."""
    home = paths.home()
    home.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(home / ".index.lock", "a+") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        yield


# -- public API ----------------------------------------------------------------


def list_installed() -> list[InstalledModel]:
    """Installed models, sorted by name. Entries whose folder has vanished
    (deleted by hand) are left out."""
    out = [m for m in _checked(_read()).values() if Path(m.path).is_dir()]
    return sorted(out, key=lambda m: m.name.lower())


def get(name: str) -> InstalledModel | None:
    """The installed model called ``name`` (exact, then case-insensitive)."""
    models = {m.name: m for m in list_installed()}
    if name in models:
        return models[name]
    folded = [m for n, m in models.items() if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def find_source(source: str) -> InstalledModel | None:
    """The installed model that came from ``source`` (e.g. ``hf:org/repo``)."""
    return next((m for m in list_installed() if m.source == source), None)


def add(model: InstalledModel) -> InstalledModel:
    """List a model whose files are complete; an entry of the same name is
    overwritten (an updated download)."""
    with _locked():
        models = _read()
        models[model.name] = model.to_json()
        _write(models)
    return model


def unlist(name: str) -> None:
    """Take a model off the list and leave its files (a download found one
    of them damaged and is about to replace it)."""
    with _locked():
        models = _read()
        if name in models:
            del models[name]
            _write(models)


def unique_name(wanted: str, source: str | None = None, path: Path | None = None) -> str:
    """``wanted`` made safe as a folder name, with -2, -3... appended if a
    different model already has it (the same source keeps its name), or if
    no model has it but ``<home>/models/<name>`` is there and is not
    ``path`` (the model's own folder: a head trained in the library): an
    import whose listing was lost, a head being trained, a folder of the
    person's. An import never lands on one (importing.py)."""
    base = sanitize(wanted)
    models = _read()
    name, n = base, 2
    while _taken(name, models, source, path):
        name = f"{base}-{n}"
        n += 1
    return name


def _taken(name: str, models: dict[str, object], source: str | None,
           path: Path | None) -> bool:
    if name in models:
        return _source(models[name]) != source
    folder = paths.models_dir() / name
    return os.path.lexists(folder) and folder != path


def _source(entry: object) -> object:
    return entry.get("source") if isinstance(entry, dict) else None


def sanitize(name: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9._+-]+", "-", name.strip()).strip(".-")
    if not clean:
        raise LibraryError(f"{name!r} cannot be used as a model name")
    return clean[:120]


def remove(name: str) -> InstalledModel | None:
    """Unlist a model, then delete its files (the index first, so an
    interrupted removal never leaves a listed model with missing files).
    Files outside the library folder are never deleted. A damaged entry is
    only unlisted (None): where its files are is not known for sure."""
    with _locked():
        models = _read()
        key = name if name in models else next(
            (k for k in models if k.lower() == name.lower()), None)
        if key is None:
            installed = ", ".join(sorted(models)) or "none"
            raise LibraryError(f"No installed model named {name!r} (installed: {installed})")
        entry = models.pop(key)
        _write(models)
        others = list(_checked(models).values())
    model = _checked({key: entry}).get(key)
    if model is not None:
        _delete_files(model, others)
    return model


def _delete_files(model: InstalledModel, others: list[InstalledModel]) -> None:
    home = paths.home()
    path = Path(model.path)
    if model.kind == "hub":
        # The whole repo folder of the Hub cache (blobs, snapshots, refs) unless
        # another entry still uses the same repo.
        repo_dir = _hub_repo_dir(path)
        if repo_dir is not None and not any(
                _hub_repo_dir(Path(o.path)) == repo_dir for o in others):
            shutil.rmtree(repo_dir, ignore_errors=True)
            lock_dir = paths.hub_cache() / ".locks" / repo_dir.name
            shutil.rmtree(lock_dir, ignore_errors=True)
        return
    if _inside(path, home) and not any(Path(o.path) == path for o in others):
        shutil.rmtree(path, ignore_errors=True)


def _hub_repo_dir(snapshot: Path) -> Path | None:
    """.../hub/models--org--repo/snapshots/<sha> -> .../hub/models--org--repo"""
    hub = paths.hub_cache()
    if snapshot.parent.name == "snapshots" and _inside(snapshot, hub):
        return snapshot.parent.parent
    return None


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is below ``root`` (not ``root`` itself), links resolved."""
    path, root = path.resolve(), root.resolve()
    return path.is_relative_to(root) and path != root
