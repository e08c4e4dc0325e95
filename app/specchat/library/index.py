"""The index of installed models: one small JSON file, ``<home>/index.json``.

An entry is written only after a model's files are complete, and the file is
replaced atomically (write a temporary file, fsync, rename), so a download
cut off midway or a crash never leaves a half-model listed. Writers take an
advisory lock so two SpecChat processes (the app and a terminal) do not lose
each other's entries.

Only json, os and pathlib here: ``specchat models list`` must stay fast.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

from specchat.library import jsonfile, paths
from specchat.library.errors import LibraryError
from specchat.library.facts import ModelFacts

INDEX_VERSION = 1
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
    def from_json(cls, data: dict) -> InstalledModel:
        known = {f.name for f in fields(cls)}
        values = {k: data.get(k) for k in known}
        values["attention"] = values.get("attention") or "full"
        values["size_bytes"] = int(values.get("size_bytes") or 0)
        return cls(**values)


# -- reading and writing ------------------------------------------------------


def _read() -> dict[str, dict]:
    path = paths.index_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LibraryError(
            f"The model index {path} is damaged ({exc}). Move it away and re-import or "
            "re-download your models; their files are still in the same folder.") from exc
    models = data.get("models", {}) if isinstance(data, dict) else {}
    return {k: v for k, v in models.items() if isinstance(v, dict)}


def _write(models: dict[str, dict]) -> None:
    jsonfile.write(paths.index_file(), {"version": INDEX_VERSION, "models": models})


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Exclusive lock for read-modify-write of the index (threads and processes)."""
    home = paths.home()
    home.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(home / ".index.lock", "a+") as lock_file:
        try:
            import fcntl

            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        except ImportError:  # not on macOS/Linux: threads are still serialized
            pass
        yield


# -- public API ----------------------------------------------------------------


def list_installed() -> list[InstalledModel]:
    """Installed models, sorted by name. Entries whose folder has vanished
    (deleted by hand) are left out."""
    out = []
    for data in _read().values():
        try:
            model = InstalledModel.from_json(data)
        except TypeError:
            continue
        if Path(model.path).is_dir():
            out.append(model)
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
    for m in list_installed():
        if m.source == source:
            return m
    return None


def add(model: InstalledModel, replace: bool = True) -> InstalledModel:
    """List a model whose files are complete. With ``replace`` an entry of the
    same name is overwritten (an updated download), otherwise refused."""
    with _locked():
        models = _read()
        if model.name in models and not replace:
            raise LibraryError(f"A model named {model.name!r} is already installed")
        models[model.name] = model.to_json()
        _write(models)
    return model


def unlist(name: str) -> InstalledModel | None:
    """Take a model off the list and leave its files (a download found one
    of them damaged and is about to replace it)."""
    with _locked():
        models = _read()
        data = models.pop(name, None)
        if data is None:
            return None
        _write(models)
    return InstalledModel.from_json(data)


def unique_name(wanted: str, source: str | None = None) -> str:
    """``wanted`` made safe as a folder name, with -2, -3... appended if a
    different model already has it (the same source keeps its name)."""
    base = sanitize(wanted)
    models = _read()
    name, n = base, 2
    while name in models and models[name].get("source") != source:
        name = f"{base}-{n}"
        n += 1
    return name


def sanitize(name: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9._+-]+", "-", name.strip()).strip(".-")
    if not clean:
        raise LibraryError(f"{name!r} cannot be used as a model name")
    return clean[:120]


def remove(name: str) -> InstalledModel:
    """Unlist a model, then delete its files (the index first, so an
    interrupted removal never leaves a listed model with missing files).
    Files outside the library folder are never deleted."""
    with _locked():
        models = _read()
        key = name if name in models else next(
            (k for k in models if k.lower() == name.lower()), None)
        if key is None:
            installed = ", ".join(sorted(models)) or "none"
            raise LibraryError(f"No installed model named {name!r} (installed: {installed})")
        model = InstalledModel.from_json(models.pop(key))
        _write(models)
        others = [InstalledModel.from_json(v) for v in models.values()]
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
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return path.resolve() != root.resolve()
