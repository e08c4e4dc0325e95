"""Bringing models the user already has into the library: an MLX folder
(from mlx-lm, LM Studio or a Hugging Face cache) or a GGUF file (from LM
Studio or Ollama, converted to an MLX folder).

An import is checked completely first (facts.validate_folder: what mlx-lm
would refuse at load is refused here, naming the user's files), staged in a
locked work folder ``<home>/tmp/import-<pid>-<random>`` (staging.py) and
moved into ``<home>/models/<name>`` with one rename once it is complete and
readable, then listed; a cancelled or failed import leaves nothing behind,
and the work folders of imports whose process died are removed when the next
import starts. The original is never modified.

Nothing from outside the folder is imported (``_plan``): a symbolic link
whose target lies outside it (``generation_config.json -> /etc/passwd``) is
refused, naming the link, before any file is read; a link inside it to a
file inside it is followed. For a Hugging Face cache snapshot the folder is
its repository (``models--org--name``), whose ``blobs/`` the snapshot links
to. Only regular files are read (a FIFO would block the import forever).
A file is hard-linked into the models folder (no second copy of a 4 GB file)
only when it is in the folder and has no other name (``st_nlink`` 1): a file
that is also a hard link to a file elsewhere is copied, so nothing in the
models folder shares an inode with a file outside the folder the user
imported. Files on another disk are copied too, after checking that they fit.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from specchat import records, values
from specchat.library import index, paths, staging
from specchat.library.disk import check_free_space
from specchat.library.errors import ImportCancelled, LibraryError
from specchat.library.facts import read_folder, validate_folder
from specchat.library.gguf_import import gguf_summary, import_gguf
from specchat.library.hub import ALLOW_PATTERNS
from specchat.library.index import InstalledModel
from specchat.library.progress import Progress

COPY_CHUNK = 8 * 1024 * 1024


def is_gguf(path: Path) -> bool:
    """A GGUF file, by name or by its magic bytes (Ollama's blobs have no
    extension)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def import_path(path: str | os.PathLike, name: str | None = None,
                progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> InstalledModel:
    """Import an MLX folder or a GGUF file and list it under ``name`` (default:
    the folder or file name). Importing the same source again returns the
    model already imported from it."""
    if name is not None:
        try:
            values.name("a model name", name)
        except values.BadValue as exc:
            raise LibraryError(str(exc)) from None
    staging.sweep(paths.tmp_dir(), staging.IMPORT_NAMES)
    shown = Path(path).expanduser()  # what messages name: what the user gave
    if not shown.exists():
        raise LibraryError(f"Nothing to import at {shown}: no such file or folder")
    src = shown.resolve()  # what is read, and the source it is listed from
    say = progress or (lambda _m, _f=None: None)
    if src.is_dir():
        source, kind = f"import:{src}", "import"
    elif is_gguf(src):
        source, kind = f"gguf:{src}", "gguf"
    else:
        raise LibraryError(
            f"{shown} is neither an MLX model folder nor a GGUF file; SpecChat imports folders "
            "with config.json + model*.safetensors + tokenizer.json, and .gguf files")
    existing = index.find_source(source)
    if existing is not None and (name is None or name.lower() == existing.name.lower()):
        say(f"{existing.name} is already imported from {shown}", 1.0)
        return existing
    wanted = name or _default_name(src, kind)
    if name:
        index.refuse_taken(wanted, source, _folder)
    plan: list[_File] = []
    if kind == "import":
        plan = _plan(src, shown)  # before anything reads a file through a link
        validate_folder(src, shown)
    where = paths.models_dir()
    try:
        paths.models_dir(create=True)
        # Released (the work folder deleted, nothing once installed) however this ends.
        with staging.claim(paths.tmp_dir(create=True), staging.IMPORT_PREFIX) as work:
            if kind == "import":
                _check_space_for_copy(plan, shown, work.path, where)
                built = work.path / "model"
                built.mkdir()
                _copy_model_files(plan, shown, built, say, cancelled)
            else:
                built = import_gguf(src, work.path / "model", say, cancelled, shown_dir=where,
                                    shown=shown)
                _check(cancelled, shown)
            # Messages name the user's folder or file, never the work folder.
            return _install(built, wanted, bool(name), source, kind, say, shown)
    except OSError as exc:  # a LibraryError (a cancel too) already says what happened
        raise staging.write_error(shown, where, exc) from exc


def _default_name(src: Path, kind: str) -> str:
    if kind == "gguf":
        try:  # general.name, or the file's stem
            return index.sanitize(gguf_summary(src)["name"])
        except Exception:  # noqa: BLE001 - the file name is a fine fallback
            pass
        stem = src.stem if src.suffix.lower() == ".gguf" else src.name
        return index.sanitize(stem.removeprefix("sha256-")[:40])
    if src.parent.name == "snapshots":  # a Hugging Face cache snapshot
        return index.sanitize(src.parent.parent.name.split("--")[-1])
    return index.sanitize(src.name)


@dataclass(frozen=True)
class _File:
    """One file an import takes: its name in the folder, the file it is (a
    link inside the folder resolved) and that file's stat, checked again
    when it is linked or opened."""

    name: str
    real: Path
    st: os.stat_result

    @property
    def linkable(self) -> bool:
        """Only a file whose one name is in the folder is hard-linked."""
        return self.st.st_nlink == 1


def import_root(src: Path) -> Path:
    """The folder an import of ``src`` may take files from: ``src`` itself,
    or for a Hugging Face cache snapshot (``models--org--name/snapshots/<commit>``,
    whose files are links to ``../../blobs``) its repository folder."""
    repo = src.parent.parent
    if src.parent.name == "snapshots" and repo.name.startswith("models--"):
        return repo
    return src


def _plan(src: Path, shown: Path) -> list[_File]:
    """The files to import from the resolved folder ``src``, each a regular
    file inside ``import_root(src)``; a link out of it or anything that is not
    a regular file (a FIFO, a device) is refused by name (in ``shown``, the
    folder as the user gave it), before it is read."""
    root = import_root(src)
    out = []
    for entry in sorted(src.iterdir()):
        if not any(fnmatch.fnmatch(entry.name, pat) for pat in ALLOW_PATTERNS):
            continue
        real = Path(os.path.realpath(entry))
        if not real.is_relative_to(root):
            raise LibraryError(
                f"{shown / entry.name} is a symbolic link to {real}, outside {root}: SpecChat "
                "never imports a file from outside the folder being imported. Put the file "
                "itself in the folder in place of the link and import again.")
        try:
            st = os.stat(real)
        except FileNotFoundError:  # a dangling link: not a file (the check names what is missing)
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise LibraryError(f"{shown / entry.name} is {records.file_kind(st.st_mode)}, not a "
                               "regular file; SpecChat imports only regular files.")
        out.append(_File(entry.name, real, st))
    return out


def _check_space_for_copy(plan: list[_File], shown: Path, work: Path, where: Path) -> None:
    """Files that will be copied (on another disk, or with other names) must
    fit: refuse up front if they cannot (hard links take no space)."""
    here = os.stat(work).st_dev
    needed = sum(f.st.st_size for f in plan if not (f.linkable and f.st.st_dev == here))
    check_free_space(work, needed, f"importing {shown}", shown=where)


def _copy_model_files(plan: list[_File], shown: Path, dest: Path, say: Progress,
                      cancelled: threading.Event | None) -> None:
    total = sum(f.st.st_size for f in plan) or 1
    done = 0
    for f in plan:
        _check(cancelled, shown)
        say(f"Importing {shown.name}: {f.name}", done / total)
        target = dest / f.name
        if f.linkable and _hard_link(f, target):
            done += f.st.st_size
            continue
        with _open_planned(f, shown) as fin, open(target, "wb") as fout:
            while chunk := fin.read(COPY_CHUNK):
                _check(cancelled, shown)
                fout.write(chunk)
                done += len(chunk)
                say(f"Importing {shown.name}: {f.name}", done / total)
    say(f"Imported the files of {shown.name}", 1.0)


def _hard_link(f: _File, target: Path) -> bool:
    """Link ``target`` to the planned file; False (and nothing left) when
    that is not possible (another disk, links not allowed) or the link is
    not to the file that was checked with no other name (it changed)."""
    try:
        os.link(f.real, target, follow_symlinks=False)
    except OSError:
        return False
    now = os.lstat(target)
    if (now.st_dev, now.st_ino, now.st_nlink) != (f.st.st_dev, f.st.st_ino, 2):
        target.unlink()
        return False
    return True


def _open_planned(f: _File, shown: Path):
    """The planned file open for reading, checked to be the file planned
    (non-blocking, so a FIFO swapped in since cannot stall the import)."""
    fd = os.open(f.real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    fin = open(fd, "rb")  # noqa: SIM115 - the caller's with closes it
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (f.st.st_dev, f.st.st_ino) or not stat.S_ISREG(now.st_mode):
        fin.close()
        raise LibraryError(f"{shown / f.name} changed while it was being imported; nothing was "
                           "added. Import it again.")
    return fin


def _folder(name: str) -> Path:
    """Where an imported model called ``name`` lives."""
    return paths.models_dir() / name


def _install(built: Path, wanted: str, typed: bool, source: str, kind: str, say: Progress,
             shown: Path) -> InstalledModel:
    """Move the built folder into the models folder and list it, under a
    name claimed with the index's lock held (``index.claim``): ``wanted``,
    refused if ``typed`` and taken, else ``wanted-2``...; if another import
    of the same source got there first, that one is the model (this copy is
    dropped with the work folder)."""
    facts = read_folder(built, shown=shown)
    paths.models_dir(create=True)
    placed: list[Path] = []

    def place(name: str) -> InstalledModel:
        dest = _folder(name)
        os.replace(built, dest)
        placed.append(dest)
        return InstalledModel.create(name, source, kind, dest, facts)

    try:
        model = index.claim(wanted, source, place, exact=typed, folder=_folder, keep=True)
    except BaseException:  # e.g. the disk filled up writing index.json: unlisted, so gone
        for dest in placed:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    say(f"Imported {model.name}" if placed else f"{model.name} is already imported from {shown}",
        1.0)
    return model


def _check(cancelled: threading.Event | None, shown: Path) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ImportCancelled(f"Import of {shown.name} cancelled; nothing was added.")
