"""What makes a folder an MLX model folder SpecChat will load, a cluster, or
a draft head being trained here.

Pure file checks (no MLX), shared by the engine before loading and by the
model library before importing or listing, so both refuse the same folders
with the same words. The cluster check is here rather than in
``distributed/`` so that asking it imports none of that optional subsystem.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

from specchat import outputs, values
from specchat.engine.errors import EngineError
from specchat.engine.events import CHECKPOINT_FILES, TRAINING_STATE
from specchat.errors import SpecChatError
from specchat.home import home

HOSTFILE = "hostfile.json"  # distributed/hostfile.py: what makes a cluster folder one
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


TRAINING_HINT = "choose a new or empty folder, or the folder of a head being trained here"


def training_folder(path: str | os.PathLike, hint: str = TRAINING_HINT,
                    error: type[SpecChatError] = EngineError, make: bool = False) -> Path:
    """``path`` if head training may write into it (specchat/outputs.py's
    rule): a new or empty folder, or one a head is being trained in; made
    if ``make``. Else ``error``, in words ending in ``hint``. The engine
    checks before it reads anything and again at every checkpoint; the
    command line and the window before they start (library/trained_heads.py)."""
    check = outputs.make_folder if make else outputs.folder
    return check(path, "the head", is_training_folder, hint, error)


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


def head_weight_files(folder: Path) -> list[Path]:
    """The files a draft head's weights (and its d2t, t2d) are read from:
    a model's, or else any safetensors file but a training checkpoint's."""
    return weight_files(folder) or [p for p in sorted(folder.glob("*.safetensors"))
                                    if p.name not in CHECKPOINT_FILES]


HEADER_MAX = 100_000_000  # bytes of a safetensors header (its JSON) read at most


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"tensor {key!r} is listed twice")
        out[key] = value
    return out


def safetensors_header(path: Path, error: type[EngineError] = EngineError,
                       shown: Path | None = None) -> tuple[dict, int]:
    """(the JSON header of a safetensors file, the bytes of its data area):
    tensor name -> {"dtype", "shape", "data_offsets"}, ``__metadata__`` left
    out. The one reader of the format's header (the library checks the
    tensors against the data area, library/checks.py): its length is bounded
    before it is read, and a file cut short before its header ends is said
    to be. Messages name ``shown`` (the file as the person gave it)."""
    shown = shown or path
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise error(f"{shown} is not a safetensors file (only {len(raw)} bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > HEADER_MAX:
                raise error(f"{shown} is not a safetensors file (its header length {n:,} is "
                            "implausible)")
            if 8 + n > size:
                raise error(f"{shown} is truncated: its header needs {8 + n:,} bytes but the "
                            f"file has {size:,}. The download or copy was probably cut short; "
                            "get it again")
            blob = f.read(n)
    except OSError as exc:
        raise error(f"Cannot read {shown}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(blob, object_pairs_hook=_no_duplicates)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{shown} is not a valid safetensors file (its header is not valid JSON: "
                    f"{exc})") from None
    if not isinstance(header, dict):
        raise error(f"{shown} is not a valid safetensors file (its header is not a JSON "
                    "object)")
    header.pop("__metadata__", None)
    return header, size - 8 - n


MTP_PREFIX = "mtp."  # the weights of a model's own MTP head (Qwen3.5, Qwen3-Next: mtp.py)


def mtp_keys(folder: Path) -> list[str]:
    """The names of the MTP head's weights in a model folder (empty if it
    ships none), read from the safetensors headers."""
    return [k for f in weight_files(folder) for k in safetensors_header(f)[0]
            if k.startswith(MTP_PREFIX)]


def is_head(config: dict) -> bool:
    """Whether a folder's config.json is an EAGLE-3 draft head's (eagle3.py)
    rather than a model's: EAGLE-3's own layout or vLLM's ``speculators``."""
    archs = " ".join(str(a) for a in config.get("architectures") or [])
    return ("eagle3" in archs.lower() or config.get("speculators_model_type") == "eagle3"
            or config.get("model_type") == "eagle3")


def not_a_target(folder: str | os.PathLike, made_for: str = "") -> str:
    """Why a draft head's folder cannot be loaded as a target, in words: the
    one message wherever a target is checked (validate_folder, before the
    engine loads one, and the library's pair check). ``made_for``: the
    model its config says it drafts for ("" when it does not say)."""
    return (f"{model_name(folder)} is an EAGLE-3 draft head"
            + (f" made for {made_for}" if made_for else "")
            + ": a head drafts for a target and cannot be one. Use it as the draft "
              f"(--draft {folder} on the command line, the Draft list in the window), "
            + (f"with {made_for} as the target" if made_for
               else "with the target it was made for"))


def _made_for(config: dict) -> str:
    """The model a head's config says it drafts for, or ""."""
    try:
        return head_facts(config)["for"]
    except (KeyError, TypeError, ValueError, AttributeError):
        return ""


def head_facts(config: dict) -> dict:
    """What a head's config says it needs of a target, for the check that
    it fits one before anything loads: the hidden width it reads, the
    target's hidden states it reads (the published ids: None means 2, n/2
    and n - 3 of the target's n layers), the vocabulary it maps into, its
    own draft vocabulary, and the model it was made for, where it says."""
    layer = config.get("transformer_layer_config") or config
    ids = config.get("eagle_aux_hidden_state_layer_ids") or config.get("target_layer_ids")
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {})
    return {"reads_width": int(config.get("target_hidden_size") or layer["hidden_size"]),
            "reads_layers": [int(i) for i in ids] if ids else None,
            "vocab": int(layer.get("vocab_size", config.get("vocab_size", 0))),
            "draft_vocab": int(config.get("draft_vocab_size") or layer.get("vocab_size", 0)),
            "for": str(verifier.get("name_or_path") or "")}


def vocab_map_problems(d2t: Sequence[int], t2d: Sequence[int] | bytes | None,
                       draft_vocab: int, target_vocab: int, target: str) -> list[str]:
    """What is wrong, in words, with an EAGLE-3 head's map from its draft
    vocabulary to a target's ids (eagle3.py: draft id i is target id
    i + d2t[i]; ``t2d``, where shipped, marks the target ids it drafts):
    d2t must have one entry per draft id, every id either names must be one
    of the target's ``target_vocab``, and both must name the same ids. Empty when the map fits. Shared by
    the engine at load and the library's check, so both say the same."""
    problems = []
    if len(d2t) != draft_vocab:
        problems.append(f"its d2t maps {len(d2t):,} draft ids, but it drafts over "
                        f"{draft_vocab:,} (its draft_vocab_size)")
    mapped = [i + int(offset) for i, offset in enumerate(d2t)]
    outside = [(i, t) for i, t in enumerate(mapped) if not 0 <= t < target_vocab]
    if outside:
        i, t = max(outside, key=lambda it: abs(it[1]))
        problems.append(f"its d2t maps {len(outside):,} draft ids outside {target}'s "
                        f"{target_vocab:,} ids (draft id {i:,} to target id {t:,})")
    if t2d is not None:
        marked = [j for j, v in enumerate(t2d) if v]
        past = [j for j in marked if j >= target_vocab]
        if past:
            problems.append(f"its t2d marks {len(past):,} target ids past {target}'s "
                            f"{target_vocab:,} (up to {past[-1]:,})")
        if set(marked) != set(mapped):
            problems.append(f"its t2d marks {len(marked):,} target ids and its d2t maps to "
                            f"{len(set(mapped)):,}, not the same ones")
    return problems


def read_config(folder: Path, error: type[EngineError] = EngineError,
                shown: Path | None = None) -> dict:
    """config.json of ``folder``; messages name ``shown`` (default
    ``folder``): the folder the user gave, when ``folder`` is a copy."""
    shown = shown or folder
    path = folder / "config.json"
    if not path.exists():
        raise error(f"{shown} is not an MLX model folder (config.json is missing)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(f"{shown / path.name} is not valid JSON ({exc}); the model folder is "
                    "damaged") from exc
    if not isinstance(config, dict):
        raise error(f"{shown / path.name} is not a model config (expected a JSON object)")
    return config


def validate_folder(folder: Path, error: type[EngineError] = EngineError,
                    shown: Path | None = None) -> dict:
    """Config, weights and tokenizer are all there; returns config.json.
    Messages name ``shown`` (default ``folder``), as ``read_config``'s."""
    shown = shown or folder
    if not folder.exists():
        raise error(f"Model folder not found: {shown}")
    if not folder.is_dir():
        raise error(f"Not a model folder: {shown}")
    config = read_config(folder, error, shown)
    if is_head(config):  # no tokenizer of its own: it cannot be loaded as a model
        raise error(not_a_target(shown, _made_for(config)))
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
