"""A head training's checkpoint read back, every field checked before use.

A run that was stopped or killed goes on from the checkpoint in the head's
folder (head_training.py): the training state (``specchat-training.json``),
the head's weights and the optimizer's state. They are files on disk that a
crash, another version or a hand edit may have damaged, and used as they
are, a damaged one ends a run on a segmentation fault (a draft id past the
vocabulary, written into MLX's arrays) or trains nothing quietly (a draft id
equal to the vocabulary size: "loss 0.000"). So each is checked here before
the trainer uses it, and any damage is a ``DamagedCheckpoint`` that names the
file, says what is wrong with it and how to start over (in the caller's
words: ``TrainPlan.restart_how``). Imports no MLX: the trainer hands in the
shapes it expects and the ones it found.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specchat import records, values
from specchat.engine import folders
from specchat.engine.errors import EngineError
from specchat.engine.events import TRAINING_STATE

# The state holds a draft vocabulary (up to 262,144 ids) and a point per
# checkpoint: a few megabytes at most.
MAX_STATE_BYTES = records.MAX_RECORD_BYTES
MAX_CONFIG_BYTES = 1 << 20  # the head's config.json: a few hundred bytes
MAX_WIDTH = 16  # the head's MLP, at most this many times the target's hidden size

# A tensor as the checks see it: its shape and its kind ("float", "int", "bool").
Tensor = tuple[tuple[int, ...], str]


class DamagedCheckpoint(EngineError):
    """A checkpoint that cannot be gone on from; ``str()`` names the file,
    what is wrong and how to start over."""


@dataclass
class TrainingState:
    """``specchat-training.json``: where a run is, for the next to go on."""

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    cursor: int = 0  # next training sample (in the seeded order)
    target: str = ""  # the target's fingerprint: a run resumes only for the same one
    draft_ids: list[int] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)  # (tokens, acceptance) as it went


def damaged(path: Path, why: str, restart_how: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(f"The training checkpoint in {path.parent} is damaged: {path.name} "
                             f"{why}. Nothing was changed; to start over, {restart_how}.")


def read_state(folder: Path, vocab: int, restart_how: str) -> TrainingState:
    """The training state in ``folder``, checked field by field against a
    target of ``vocab`` ids."""
    path = folder / TRAINING_STATE
    try:
        state = TrainingState(**records.fields_of(
            TrainingState, records.read_json(path, MAX_STATE_BYTES)))
    except records.BadRecord as exc:
        raise damaged(path, f"cannot be read: {exc}", restart_how) from None
    except OSError as exc:
        raise damaged(path, f"cannot be read ({exc.strerror or exc})", restart_how) from None
    problem = _state_problem(state, vocab)
    if problem:
        raise damaged(path, problem, restart_how)
    return state


def _state_problem(state: TrainingState, vocab: int) -> str:
    """What is wrong with a state read back, in words ("" when nothing)."""
    for name in ("step", "tokens", "cursor"):
        if getattr(state, name) < 0:
            return f"says {name} {getattr(state, name)}, below 0"
    if not (math.isfinite(state.elapsed_s) and state.elapsed_s >= 0):
        return f"says it trained for {state.elapsed_s} seconds"
    if not state.target:
        return "names no target"
    ids, bound = state.draft_ids, min(vocab, int(values.LIMITS["draft vocabulary"].high))
    if not 1 <= len(ids) <= bound:
        return f"lists {len(ids):,} draft ids, where a head for this target drafts from 1 to {bound:,}"
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        return "lists its draft ids out of order or twice"
    if ids[0] < 0:
        return f"lists the draft id {ids[0]:,}, below 0"
    if ids[-1] >= vocab:
        return (f"lists the draft id {ids[-1]:,}, past the target's {vocab:,} ids (0 to "
                f"{vocab - 1:,})")
    for i, point in enumerate(state.curve, start=1):
        tokens, accept = point.get("tokens"), point.get("accept")
        if not (records.conforms(tokens, int) and tokens >= 0 and isinstance(accept, list)
                and all(records.conforms(a, float) and 0 <= a <= 1 for a in accept)):
            return (f"has a point {i} on its curve that is not a count of tokens with "
                    "acceptances from 0 to 1")
    return ""


def check_map(path: Path, d2t: Sequence[int], state: TrainingState, restart_how: str) -> None:
    """The head's d2t maps its draft ids to the state's, so weights and
    state are of the same run (a kill between writing one and the other, or
    files copied from two runs, would train rows for other tokens)."""
    if [i + int(d) for i, d in enumerate(d2t)] != state.draft_ids:
        raise damaged(path, f"drafts other ids than {TRAINING_STATE} lists (the two are not of "
                            "the same run)", restart_how)


def check_tensors(path: Path, found: Mapping[str, Tensor], expected: Mapping[str, Tensor],
                  restart_how: str) -> None:
    """``found`` (what a safetensors file holds) is exactly ``expected``:
    the same names, each of the same shape and kind."""
    missing = sorted(set(expected) - set(found))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise damaged(path, f"lacks {missing[0]}{more}", restart_how)
    extra = sorted(set(found) - set(expected))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise damaged(path, f"holds {extra[0]}{more}, which this head has no use for",
                      restart_how)
    for name, (shape, kind) in expected.items():
        if found[name] != (shape, kind):
            have_shape, have_kind = found[name]
            raise damaged(path, f"holds {name} as {have_kind} of shape {list(have_shape)}, where "
                                f"the head needs {kind} of shape {list(shape)}", restart_how)


def read_intermediate(folder: Path, hidden: int, restart_how: str) -> int | None:
    """The MLP width a resumed head was made with, from its config.json
    (None when it does not say: the plan's then); at most ``MAX_WIDTH``
    times the target's hidden size, so a damaged number cannot ask for
    terabytes before the weights are compared."""
    path = folder / "config.json"
    try:
        config = records.read_json(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except records.BadRecord as exc:
        raise damaged(path, f"cannot be read: {exc}", restart_how) from None
    except OSError as exc:
        raise damaged(path, f"cannot be read ({exc.strerror or exc})", restart_how) from None
    layer = config.get("transformer_layer_config") if isinstance(config, dict) else None
    width = layer.get("intermediate_size") if isinstance(layer, dict) else None
    if width is None or width == 0:
        return None
    if not (records.conforms(width, int) and 1 <= width <= MAX_WIDTH * hidden):
        raise damaged(path, f"says intermediate_size {records.described(width)}, where a head "
                            f"for this target is 1 to {MAX_WIDTH * hidden:,} wide", restart_how)
    return width


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a checkpoint file beside ``path`` under a new name, then
    rename it into place: a kill leaves the old file whole. The name is
    made anew (``mkstemp``), so a link left under a name it might take
    is never written through; ``.part-`` files a killed run left are
    removed when the folder is taken (folders.hold_training_folder)."""
    fd, tmp = tempfile.mkstemp(prefix=f"{folders.PART}{path.stem}.", suffix=path.suffix,
                               dir=path.parent)  # same suffix: mx.save_safetensors keeps it
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def present(path: Path, restart_how: str) -> bool:
    """Whether the checkpoint file ``path`` is there: a regular file (True),
    nothing (False), or anything else, said to be damaged (a FIFO would
    block the reader, a folder the writer)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise damaged(path, f"is a link to {os.readlink(path)}, which is not "
                                     "there", restart_how) from None
        return False
    except OSError as exc:
        raise damaged(path, f"cannot be read ({exc.strerror or exc})",
                                 restart_how) from None
    if not stat.S_ISREG(st.st_mode):
        raise damaged(path, f"is {records.file_kind(st.st_mode)}, not a regular "
                                 "file", restart_how)
    return True
