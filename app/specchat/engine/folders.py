"""What makes a folder an MLX model folder SpecChat will load, a cluster, or
a draft head being trained here.

Pure file checks (no MLX), shared by the engine before loading and by the
model library before importing or listing, so both refuse the same folders
with the same words. The cluster check is here rather than in
``distributed/`` so that asking it imports none of that optional subsystem.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import functools
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from specchat import outputs, records, values
from specchat.engine.compat import tokenizer_vocab
from specchat.engine.errors import EngineError
from specchat.engine.events import CHECKPOINT_FILES, TRAINING_STATE
from specchat.errors import SpecChatError
from specchat.home import home

HOSTFILE = "hostfile.json"  # distributed/hostfile.py: what makes a cluster folder one
# A cluster folder's own files (the hostfile; distributed/secret.py's SECRET):
# read by the cluster's code, which says what to do about a damaged one.
CLUSTER_FILES = frozenset({HOSTFILE, "secret"})
NAME = values.NAMES["a cluster name"].pattern  # a cluster's name (fullmatch)


def clusters_dir() -> Path:
    """Where ``specchat cluster create`` writes clusters: the only place a
    folder is taken for one."""
    return home() / "clusters"


def is_cluster_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a cluster ``specchat cluster create`` made: a
    folder of ``clusters_dir()`` with a hostfile. Never because some other
    folder holds a hostfile (a model folder or a Hub download that happens
    to hold one is a model like any other, so loading it never connects
    anywhere)."""
    try:
        folder = Path(path).expanduser().resolve()
        root = clusters_dir().resolve()
    except (OSError, RuntimeError):
        return False
    return (folder.parent == root and bool(NAME.fullmatch(folder.name))
            and (folder / HOSTFILE).is_file())


def is_training_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder SpecChat trains a draft head in: it
    holds the training state, a regular file (head_training.py writes it
    first of all into a folder it trains in). The one test of "a head
    folder of its own training", the only folder holding files that head
    training writes into (specchat/outputs.py); a downloaded head or a
    model never holds one."""
    try:
        return stat.S_ISREG(os.lstat(Path(path) / TRAINING_STATE).st_mode)
    except OSError:
        return False


MODELS = "models"  # the home's folder of models (library/paths.py), where a head may be trained
TRAINING_HINT = "choose a new or empty folder, or the folder of a head being trained here"


def training_folder(path: str | os.PathLike, hint: str = TRAINING_HINT,
                    error: type[SpecChatError] = EngineError, make: bool = False) -> Path:
    """``path`` if head training may write into it (specchat/outputs.py's
    rule): a new or empty folder, or one a head is being trained in; made
    if ``make``. Else ``error``, in words ending in ``hint``. The engine
    checks before it reads anything and again at every checkpoint; the
    command line and the window before they start (library/trained_heads.py)."""
    check = outputs.make_folder if make else outputs.folder
    return check(path, "the head", is_training_folder, hint, error, home_place=MODELS)


PART = ".part-"  # the start of a checkpoint file's name while it is written (head_training.py)


def hold_training_folder(path: Path, error: type[SpecChatError] = EngineError) -> int:
    """An open descriptor of the training folder ``path`` (a folder, not a
    link), holding its ``flock`` for as long as it is open: the one run
    that trains there. A second run into the same folder, in this process
    or another (two ``heads train --out`` at once, the window beside a
    terminal), is refused in words instead of each writing its checkpoints
    over the other's. The kernel drops the lock when its process dies,
    however it dies. Checkpoint files a killed run was writing
    (``.part-*``) are removed (never followed: a link is removed as one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"Cannot train a head in {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise error(f"Another run is training a head in {path} now; nothing was changed. "
                    "Wait for it to end (or stop it), or train into another folder.") from None
    for entry in os.scandir(path):
        if entry.name.startswith(PART):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return fd


def still_held(path: Path, fd: int, error: type[SpecChatError] = EngineError) -> None:
    """``error`` unless ``path`` is still the folder ``fd`` holds: a folder
    removed, or replaced (by a link to another, a file) while a head was
    being trained there is said to be, and nothing is written through it."""
    held = os.fstat(fd)
    try:
        now = os.lstat(path)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        raise error(f"The head's folder {path} was removed or replaced while the head was being "
                    "trained; the checkpoint was not written there. Train again into a new "
                    "folder.")


def model_name(folder: str | os.PathLike) -> str:
    """A model folder's name as people know it: a Hub snapshot
    (``models--org--name/snapshots/<commit>``) by its repository."""
    path = Path(folder)
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name


def weight_files(folder: Path) -> list[Path]:
    """The files mlx-lm loads weights from (same glob as mlx_lm.utils)."""
    return sorted(folder.glob("model*.safetensors"))


def head_weight_files(folder: Path, error: type[SpecChatError] = EngineError,
                      shown: Path | None = None) -> list[Path]:
    """The files a draft head's weights are read from (an EAGLE-3 head's, a
    Gemma 4 assistant's): a model's, or else any safetensors file but a
    training checkpoint's; refused in words where there are none."""
    files = weight_files(folder) or [p for p in sorted(folder.glob("*.safetensors"))
                                     if p.name not in CHECKPOINT_FILES]
    if not files:
        pickled = [p.name for p in folder.glob("*.bin")]
        raise error(f"{shown or folder} has no safetensors weights"
                    + (f" (only pickled {pickled[0]}, which SpecChat does not open: "
                       "pickled files can run code)" if pickled else ""))
    return files


# The JSON files loading reads: mlx-lm's load_config (config, generation and
# ModelOpt quantization configs), its sharded loading (the weight index), and
# transformers' tokenizer (its files, special and added tokens, a BPE
# vocabulary, a chat template kept as JSON). Named one by one rather than
# "*.json": a repo's other JSON files are the author's, not the model's (a
# hostfile.json in a model folder once made loading it connect to the hosts
# it named), and nothing else reads them.
MODEL_JSON = ["config.json", "generation_config.json", "hf_quant_config.json",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "vocab.json", "chat_template.json"]


def text_config(config: dict) -> dict:
    """Multimodal configs keep the language model's numbers in text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return {**config, **inner}
    return config


def read_json_object(path: Path, error: type[SpecChatError] = EngineError,
                     shown: Path | None = None) -> dict:
    """A small JSON object of a model folder, read as ``specchat.records``
    reads every file: only a regular file (a FIFO in its place would block
    the reader forever), bounded, and JSON nested too deep to parse is
    broken like any other. ``shown`` names it in the message."""
    where = shown or path
    try:
        raw = records.read_file(path, records.MAX_JSON_BYTES)
        if raw.startswith(codecs.BOM_UTF8):  # Python's json takes it; mlx-lm's loading does not
            raise records.BadRecord("it starts with a byte order mark (BOM), which mlx-lm "
                                    "does not read; save it as UTF-8 without one")
        data = records.parse_json(raw)
    except (OSError, records.BadRecord) as exc:
        raise error(f"{where} is broken: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict):
        raise error(f"{where} is broken: it is not a JSON object")
    return data


def check_files(folder: Path, error: type[SpecChatError] = EngineError,
                shown: Path | None = None) -> None:
    """Every file of a model or head folder can be read, before the folder
    is handed to what opens its files itself (mlx-lm's loader, mx.load,
    transformers' tokenizer): each is a regular file (or a link to one; a
    FIFO would block them forever, a device never end), and each JSON file
    they read (MODEL_JSON) is a JSON object that parses (nesting too deep
    to parse is a RecursionError in Python's json, an internal error in
    theirs); tokenizer.json also holds a vocabulary. The one check of a
    folder's files, called by the engine's loader and the library's checks
    alike, so both refuse the same files in the same words; remembered
    (when it passes) until a file changes."""
    shown = shown or folder
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise error(f"Cannot read {shown}: {exc.strerror or exc}") from exc
    own = CLUSTER_FILES if any(e.name == HOSTFILE for e in entries) else frozenset()
    for entry in entries:
        if entry.name in own:
            continue
        where = shown / entry.name
        try:
            st = os.stat(entry.path)
        except OSError as exc:
            if entry.is_symlink():
                raise error(f"{where} is broken: it is a link to {os.readlink(entry.path)}, "
                            "which is not there") from None
            raise error(f"Cannot read {where}: {exc.strerror or exc}") from exc
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{where} is broken: it is {records.file_kind(st.st_mode)}, not a "
                        "regular file")
        if entry.name in MODEL_JSON:
            _json_passed(Path(entry.path), (st.st_mtime_ns, st.st_size, st.st_ino), error,
                         where)


@functools.lru_cache(maxsize=256)
def _json_passed(path: Path, _stamp: tuple, error: type[SpecChatError], where: Path) -> None:
    data = read_json_object(path, error, where)
    if path.name == "tokenizer.json":
        try:
            tokenizer_vocab(data)
        except records.BadRecord as exc:
            raise error(f"{where} is broken: {exc}") from None


def read_config(folder: Path, error: type[SpecChatError] = EngineError,
                shown: Path | None = None) -> dict:
    """A model's or a head's config.json (read_json_object)."""
    path = folder / "config.json"
    if not path.exists() and not path.is_symlink():
        raise error(f"{shown or folder} is not an MLX model folder (config.json is missing)")
    return read_json_object(path, error, (shown or folder) / "config.json")


def validate_folder(folder: Path, error: type[SpecChatError] = EngineError,
                    shown: Path | None = None,
                    refuse: Callable[[Path, dict], str | None] | None = None) -> dict:
    """Config, weights and tokenizer are all there and every file can be
    read (check_files); returns config.json. ``refuse(folder, config)``:
    why a folder whose config reads this way is not a model's, or None
    (the engine refuses a draft head's: loading.py)."""
    if not folder.exists():
        raise error(f"Model folder not found: {shown or folder}")
    if not folder.is_dir():
        raise error(f"Not a model folder: {shown or folder}")
    check_files(folder, error, shown)
    config = read_config(folder, error, shown)
    why = refuse(folder, config) if refuse is not None else None
    if why is not None:
        raise error(why)
    shown = shown or folder
    if not weight_files(folder):
        pickled = [p.name for pat in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in folder.glob(pat)]
        if pickled:
            raise error(
                f"{shown} has only pickled PyTorch weights ({pickled[0]}); SpecChat loads "
                "safetensors only, because pickled files can run code when opened")
        raise error(f"{shown} has no weights (no model*.safetensors files)")
    if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer.model").exists():
        raise error(f"{shown} has no tokenizer (tokenizer.json is missing)")
    return config
