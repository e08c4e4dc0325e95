"""Bringing models the user already has into the library: an MLX folder
(from mlx-lm, LM Studio or a Hugging Face cache) or a GGUF file (from LM
Studio or Ollama, converted to an MLX folder).

An import is checked completely first (facts.validate_folder: what mlx-lm
would refuse at load is refused here, naming the user's files), staged in a
locked work folder ``<home>/tmp/import-<pid>-<random>`` (staging.py) and
moved into ``<home>/models/<name>`` with one rename once it is complete and
readable, then listed; a cancelled or failed import leaves nothing behind,
and the work folders of imports whose process died are removed when the next
import starts. Files are hard-linked when the source is on the same disk (no
second copy of a 4 GB file) and copied otherwise, after checking that they
fit; the original is never modified.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat.library import index, paths, staging
from specchat.library.errors import ImportCancelled, LibraryError
from specchat.library.index import InstalledModel

Progress = Callable[[str, float | None], None]
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
    staging.sweep(paths.tmp_dir(), staging.IMPORT_NAMES)
    src = Path(path).expanduser()
    if not src.exists():
        raise LibraryError(f"Nothing to import at {src}: no such file or folder")
    src = src.resolve()
    say = progress or (lambda _m, _f=None: None)
    if src.is_dir():
        source, kind = f"import:{src}", "import"
    elif is_gguf(src):
        source, kind = f"gguf:{src}", "gguf"
    else:
        raise LibraryError(
            f"{src} is neither an MLX model folder nor a GGUF file; SpecChat imports folders "
            "with config.json + model*.safetensors + tokenizer.json, and .gguf files")
    existing = index.find_source(source)
    if existing is not None and (name is None or index.sanitize(name) == existing.name):
        say(f"{existing.name} is already imported from {src}", 1.0)
        return existing
    wanted = index.sanitize(name) if name else _default_name(src, kind)
    if name and index.get(wanted) is not None:
        raise LibraryError(
            f"A model named {wanted!r} is already installed; pick another --name or remove it "
            "first (`specchat models rm`).")
    final_name = index.unique_name(wanted, source=source)
    if kind == "import":
        from specchat.library.facts import validate_folder

        validate_folder(src)
    where = paths.models_dir()
    work = None
    try:
        where.mkdir(parents=True, exist_ok=True)
        work = staging.claim(paths.tmp_dir(create=True), staging.IMPORT_PREFIX)
        if kind == "import":
            _check_space_for_copy(src, work.path, where)
            built = work.path / "model"
            built.mkdir()
            _copy_model_files(src, built, say, cancelled)
        else:
            built = _convert_gguf(src, work.path, say, cancelled, where)
        return _install(built, final_name, source, kind, say, src)
    except LibraryError:  # ImportCancelled included: already says what happened
        raise
    except OSError as exc:
        raise staging.write_error(src, where, exc) from exc
    finally:
        if work is not None:
            work.release()


def _default_name(src: Path, kind: str) -> str:
    if kind == "gguf":
        try:
            from specchat.library.gguf_import import gguf_summary

            summary = gguf_summary(src) or {}
            label = summary.get("name") or summary.get("general.name")
            if isinstance(label, str) and label.strip():
                return index.sanitize(label)
        except Exception:  # noqa: BLE001 - the file name is a fine fallback
            pass
        stem = src.stem if src.suffix.lower() == ".gguf" else src.name
        return index.sanitize(stem.removeprefix("sha256-")[:40])
    if src.parent.name == "snapshots":  # a Hugging Face cache snapshot
        return index.sanitize(src.parent.parent.name.split("--")[-1])
    return index.sanitize(src.name)


def wanted_files(folder: Path) -> list[Path]:
    """The files mlx-lm needs from a folder (same patterns as Hub pulls)."""
    from specchat.library.hub import ALLOW_PATTERNS

    out = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and any(fnmatch.fnmatch(f.name, pat) for pat in ALLOW_PATTERNS):
            out.append(f)
    return out


def _check_space_for_copy(src: Path, work: Path, where: Path) -> None:
    """Files on another disk are copied: refuse up front if they cannot fit
    (hard links on the same disk take no space)."""
    from specchat.library.disk import check_free_space

    files = wanted_files(src)
    if files and os.stat(os.path.realpath(files[0])).st_dev == os.stat(work).st_dev:
        return
    needed = sum(os.stat(os.path.realpath(f)).st_size for f in files)
    check_free_space(work, needed, f"importing {src}", shown=where)


def _copy_model_files(src: Path, dest: Path, say: Progress,
                      cancelled: threading.Event | None) -> None:
    files = wanted_files(src)
    total = sum(f.stat().st_size for f in files) or 1
    done = 0
    for f in files:
        _check(cancelled, src)
        say(f"Importing {src.name}: {f.name}", done / total)
        real = Path(os.path.realpath(f))
        target = dest / f.name
        try:
            os.link(real, target)
            done += real.stat().st_size
            continue
        except OSError:
            pass  # another disk, or links not allowed: copy
        with open(real, "rb") as fin, open(target, "wb") as fout:
            while chunk := fin.read(COPY_CHUNK):
                _check(cancelled, src)
                fout.write(chunk)
                done += len(chunk)
                say(f"Importing {src.name}: {f.name}", done / total)
    say(f"Imported the files of {src.name}", 1.0)


def _convert_gguf(src: Path, work: Path, say: Progress,
                  cancelled: threading.Event | None, where: Path) -> Path:
    from specchat.library.gguf_import import import_gguf

    out = import_gguf(src, work / "model", say, cancelled, shown_dir=where)
    _check(cancelled, src)
    return Path(out)


def _install(built: Path, name: str, source: str, kind: str, say: Progress,
             src: Path) -> InstalledModel:
    from specchat.library.facts import read_folder

    facts = read_folder(built, shown=src)
    dest = paths.models_dir(create=True) / name
    if dest.exists():  # left over from an import that never got listed
        shutil.rmtree(dest)
    os.replace(built, dest)
    model = InstalledModel.create(name, source, kind, dest, facts)
    try:
        index.add(model)
    except BaseException:  # e.g. the disk filled up writing index.json: unlisted, so gone
        shutil.rmtree(dest, ignore_errors=True)
        raise
    say(f"Imported {name}", 1.0)
    return model


def _check(cancelled: threading.Event | None, src: Path) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ImportCancelled(f"Import of {src.name} cancelled; nothing was added.")


# -- finding models the user already has ---------------------------------------


@dataclass(frozen=True)
class LocalCandidate:
    """A model found on this machine that could be imported."""

    path: str
    kind: str  # "mlx" or "gguf"
    app: str  # "LM Studio", "Ollama", "Hugging Face cache"
    name: str
    size_bytes: int


def discover(home: Path | None = None) -> list[LocalCandidate]:
    """MLX folders and GGUF files in the usual places of LM Studio, Ollama
    and the Hugging Face cache (read-only; nothing is imported)."""
    home = home or Path.home()
    found: list[LocalCandidate] = []
    for root in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"):
        found += _scan_tree(root, "LM Studio", depth=3)
    hf_cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME", "")
                    or home / ".cache" / "huggingface")
    if hf_cache.name != "hub":
        hf_cache = hf_cache / "hub"
    for repo in sorted(hf_cache.glob("models--*")):
        for snap in sorted((repo / "snapshots").glob("*")):
            if _is_mlx_folder(snap):
                found.append(LocalCandidate(str(snap), "mlx", "Hugging Face cache",
                                            repo.name.split("--", 1)[-1].replace("--", "/"),
                                            _size(snap)))
    found += _ollama(Path(os.environ.get("OLLAMA_MODELS") or home / ".ollama" / "models"))
    return found


def _is_mlx_folder(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("model*.safetensors"))


def _size(folder: Path) -> int:
    total = 0
    for f in folder.iterdir():
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:
            pass
    return total


def _scan_tree(root: Path, app: str, depth: int) -> list[LocalCandidate]:
    out: list[LocalCandidate] = []
    if not root.is_dir():
        return out
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        if len(here.relative_to(root).parts) >= depth:
            dirs[:] = []
        if _is_mlx_folder(here):
            out.append(LocalCandidate(str(here), "mlx", app, here.name, _size(here)))
            dirs[:] = []
            continue
        for name in sorted(files):
            if name.lower().endswith(".gguf") and "mmproj" not in name.lower():
                f = here / name
                out.append(LocalCandidate(str(f), "gguf", app, f.stem, f.stat().st_size))
    return out


def _ollama(models: Path) -> list[LocalCandidate]:
    import json

    out: list[LocalCandidate] = []
    manifests = models / "manifests"
    if not manifests.is_dir():
        return out
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for layer in data.get("layers", []) if isinstance(data, dict) else []:
            if layer.get("mediaType") == "application/vnd.ollama.image.model":
                blob = models / "blobs" / str(layer.get("digest", "")).replace(":", "-")
                if blob.is_file():
                    label = f"{manifest.parent.name}:{manifest.name}"
                    out.append(LocalCandidate(str(blob), "gguf", "Ollama", label,
                                              blob.stat().st_size))
    return out
