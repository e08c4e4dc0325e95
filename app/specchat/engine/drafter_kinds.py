"""Drafter kinds: what the engine and the draft-length policy need to know
about each kind of drafter, declared once, by the drafter's author.

A kind says how to build its drafter, what one drafted token costs (in
one-token target forwards), the per-token acceptance to assume before any is
measured, the longest block it may propose, and whether its confidences are
probabilities worth calibrating (then the policy stops a block token by
token; otherwise the block is as long as Leviathan's formula allows). The
policy reads these instead of testing drafter names, so a new drafter is one
module plus one ``register`` line; a mode (modes.py) then names it.

This module imports no MLX (drafters are imported when first built), so
modes.py, and through it the window, may read it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specchat import origins
from specchat.engine import assistant_format, eagle3_format, registry
from specchat.engine.folders import model_name


@dataclass(frozen=True)
class DrafterKind:
    name: str
    # Builds a new drafter from a drafters.Build: a kind that ``fills`` its
    # need from the folder chosen for it, as it loads; any other on what
    # holds its need, when first used (session.Slot keeps them).
    make: Callable[[Any], Any]
    prior: float  # per-token acceptance before any is measured
    cap: int  # longest block
    calibrated: bool = False  # confidences are probabilities: stop blocks by them
    # Per drafted token, in target forwards. A kind that needs a draft model
    # or a head costs what the engine measures for the pair.
    cost: float = 0.0
    # What it needs loaded besides the target (events.LoadedPair.loaded):
    # "" nothing, "draft" the pair's draft (a draft model, or a head chosen
    # as the draft), "head" a draft head, "mtp" the target's own MTP head.
    needs: str = ""
    fills: bool = False  # its drafter holds its need (the draft model, a head, the MTP head)
    # For a drafter that comes as a folder of its own (a draft head): its
    # format module, no MLX (eagle3_format; docs/architecture.md says what
    # it answers).
    folder: Any = None
    # It reads the target's hidden states, which the target has not computed
    # for a suffix draft's tokens: chained after one (hybrid.py), it reads
    # them from its own output, one forward a token, and its acceptance there
    # is kept under ``after_key``.
    reads_target: bool = False
    # The prior for a finer statistics key (e.g. the suffix drafter's match
    # length), when it differs from ``prior``.
    key_prior: Callable[[str], float] | None = None
    # Where its accepted tokens come from (specchat/origins.py): counted,
    # named and tinted under this origin unless a proposal says otherwise
    # per token (the suffix drafter: this conversation or the history).
    # Defaults to the kind's own name, which must then be a registered origin.
    origin: str = ""

    def __post_init__(self) -> None:
        if not self.origin:
            object.__setattr__(self, "origin", self.name)
        if self.origin not in origins.ORIGINS:
            raise ValueError(f"drafter kind {self.name!r}: register its origin "
                             f"{self.origin!r} in specchat/origins.py first")

    def prior_for(self, key: str) -> float:
        if self.reads_target and key == after_key(self.name):
            # Drafting on past another drafter's unverified tokens, a head
            # reads them from its own output (head_drafter.propose_after), so
            # its first draft there is at least as deep in its own chain as
            # the second of a block of its own: it starts at its prior squared.
            return self.prior ** 2
        return self.key_prior(key) if self.key_prior is not None and key != self.name \
            else self.prior

    @property
    def uses_draft_model(self) -> bool:
        return self.needs == "draft"


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """A constructor imported when first called, so the registry imports no MLX."""
    return lambda *args: getattr(importlib.import_module(module), name)(*args)


# The draft model's block length is the early stop's call, up to 12.
DRAFT_MODEL = DrafterKind("draft", _lazy("specchat.engine.draft_model", "build"), prior=0.7,
                          cap=12, calibrated=True, needs="draft", fills=True,
                          origin=origins.DRAFT_MODEL)
# Suffix matches over the conversation and the history: free too, and
# scored by how many occurrences agree (suffix.py).
# Longer matches continue correctly far more often: the prior of a statistics
# key "suffix:<source>:<shortest match of its bucket>" grows with the match.
# The priors sit above the per-token rates measured on the multi-turn bench
# (accepted/drafted: 21%, 33%, 56%, 73%, 71% for 2, 3, 4-7, 8-15, 16+ tokens
# matched in the conversation) on purpose: a copy is a run, right until the
# edit point and then wrong, not independent tokens, so priors at those
# rates cut copies into short blocks. With hybrid.TRUST_MATCH they measured
# 7-21% faster on the multi-turn code follow-ups, across two tuning runs
# (docs/bench/journal.md, "Tuning the suffix hybrid"). A request's own
# measurements replace them quickly.
SUFFIX_PRIORS = {2: 0.5, 3: 0.7, 4: 0.85, 8: 0.93, 16: 0.97}
# History matches (4+ tokens) are not copies in progress but coincidences
# with another conversation, unless the user repeats an earlier request:
# two whole bench runs measured 23% (4-7 tokens, 30/133) and 0% (8-15,
# 0/27), so they start there and must earn longer drafts in the request.
HISTORY_PRIORS = {4: 0.25, 8: 0.25, 16: 0.5}


def after_key(name: str) -> str:
    """The statistics key of a drafter kind's drafts chained after another's."""
    return f"{name}:after"


def key_parts(key: str | None) -> tuple[str, int] | None:
    """(source, bucket) of a suffix statistics key (suffix.stats_key makes
    them: "suffix:<source>:<bucket>"), else None."""
    parts = (key or "").split(":")
    if len(parts) != 3 or parts[0] != SUFFIX.name or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def _suffix_prior(key: str) -> float:
    parts = key_parts(key)
    if parts is None:
        return 0.6
    source, bucket = parts
    priors = HISTORY_PRIORS if source == origins.HISTORY else SUFFIX_PRIORS
    return priors.get(bucket, 0.6)


SUFFIX = DrafterKind("suffix", _lazy("specchat.engine.suffix", "build"), prior=0.6, cap=24,
                     key_prior=_suffix_prior, origin=origins.CONVERSATION)

KINDS: dict[str, DrafterKind] = {k.name: k for k in (DRAFT_MODEL, SUFFIX)}


def register(kind: DrafterKind) -> DrafterKind:
    return registry.add(KINDS, kind)


def get(name: str) -> DrafterKind:
    return registry.lookup(KINDS, name, "drafter")


def of_folder(config: dict) -> DrafterKind | None:
    """The kind whose drafters come as folders like the one whose
    config.json is ``config`` (a head's), or None (a model's)."""
    return next((k for k in KINDS.values() if k.folder is not None
                 and k.folder.recognizes(config)), None)


def head_words(name: str) -> str:
    """A draft head of the kind ``name`` (a head's model type), in words:
    "EAGLE-3 head"; "draft head" for a kind no head format is known by."""
    kind = KINDS.get(name)
    return f"{kind.folder.LABEL} head" if kind is not None and kind.folder else "draft head"


def not_a_target(folder: str | os.PathLike, kind: DrafterKind, made_for: str = "") -> str:
    """Why a draft head's folder cannot be a target, in words, wherever a
    target is checked; ``made_for``: the model its config names, if any."""
    label = kind.folder.LABEL
    return (f"{model_name(folder)} is {'an' if label[0] in 'AEIOU' else 'a'} {label} draft head"
            + (f" made for {made_for}" if made_for else "")
            + ": a head drafts for a target and cannot be one. Use it as the draft "
              f"(--draft {folder} on the command line, the Draft list in the window), "
            + (f"with {made_for} as the target" if made_for
               else "with the target it was made for"))


# Speculative speculative decoding: the draft model drafts the next block on
# its own thread while the target verifies this one (ssd/).
SSD = register(DrafterKind("ssd", _lazy("specchat.engine.ssd.drafter", "build"), prior=0.7, cap=12,
                           calibrated=True, needs="draft", origin=origins.DRAFT_MODEL))

# The target's own multi-token-prediction head (mtp.py): one layer and the
# target's output layer per drafted token; its acceptance measured elsewhere
# runs 0.6 to 0.8 per token, and the policy learns the pair's quickly.
MTP = register(DrafterKind("mtp", _lazy("specchat.engine.mtp", "build"), prior=0.7, cap=8,
                           calibrated=True, needs="mtp", fills=True, reads_target=True,
                           origin=origins.MTP))

# An EAGLE-3 head (eagle3.py, its folder's format eagle3_format.py): chosen as
# the pair's draft it stands where a draft model would (the modes that use
# "the draft" run it); loaded beside a draft model (``specchat bench --head``)
# the head modes run it. It reads the target's hidden states and costs what
# its bytes say against the target's.
EAGLE3 = register(DrafterKind("eagle3", _lazy("specchat.engine.eagle3", "build"), prior=0.7,
                              cap=10, calibrated=True, needs="head", fills=True,
                              folder=eagle3_format, reads_target=True, origin=origins.HEAD))

# A Gemma 4 assistant (assistant.py, its folder's format assistant_format.py):
# a few layers that read the target's final hidden state and the keys and
# values of its last full-attention and sliding-window layers, drafting
# from one constant position. Chosen as the pair's draft, it stands where a
# draft model would. Google's blocks are short (mlx-vlm's default: three
# drafts), so its longest block is 6.
ASSISTANT = register(DrafterKind("assistant", _lazy("specchat.engine.assistant", "build"),
                                 prior=0.6, cap=6, calibrated=True, needs="head", fills=True,
                                 folder=assistant_format, reads_target=True,
                                 origin=origins.ASSISTANT))
