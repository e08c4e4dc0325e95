"""Where a reply's tokens come from: the target's own choice, or an accepted
draft token by the source that drafted it.

Every layer reads this table: the engine counts tokens per origin
(``StepEvent.origins``, ``Summary.tokens_by_origin``), the store names them
in a saved summary line, and the window tints them (Colour tokens) and
labels the gauges. A drafter kind names its origin when it registers
(``engine/drafter_kinds.py``), so a new drafter's tokens are counted,
named and tinted as its own, never as another's. It imports nothing, so
every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    name: str  # the key in StepEvent.origins and Summary.tokens_by_origin
    short: str  # in a summary line: "draft 41% · conversation 22%"
    label: str  # in a tooltip: "draft model: 41 tokens (41%)"
    tint: tuple[str, str] = ("", "")  # Colour tokens' background, (light, dark); "" = untinted


ORIGINS: dict[str, Origin] = {}


def register(origin: Origin) -> Origin:
    """Add an origin; registering the same one again is harmless (a module
    imported twice), another under the same name is a bug."""
    old = ORIGINS.setdefault(origin.name, origin)
    if old != origin:
        raise ValueError(f"origin {origin.name!r} is already registered as {old}")
    return origin


def get(name: str) -> Origin:
    """The origin named ``name``; one this version does not know (a reply
    saved by a newer version) is shown by its name, untinted."""
    return ORIGINS.get(name) or Origin(name, name, name)


TARGET = register(Origin("target", "target", "target")).name
DRAFT_MODEL = register(Origin("draft", "draft", "draft model", ("#c8f0cf", "#245c33"))).name
CONVERSATION = register(Origin("conversation", "conversation", "this conversation",
                               ("#cfe0ff", "#24406e"))).name
HISTORY = register(Origin("history", "history", "your history", ("#f7dcae", "#5e4216"))).name
MTP = register(Origin("mtp", "MTP", "the model's own MTP head", ("#f3d1ea", "#5c2a4f"))).name
HEAD = register(Origin("head", "head", "a draft head (EAGLE-3)", ("#d8f0ef", "#1f5552"))).name
ASSISTANT = register(Origin("assistant", "assistant", "a Gemma 4 assistant",
                           ("#e4dcf5", "#3e2f66"))).name


def drafted(tokens_by_origin: dict[str, int]) -> list[str]:
    """The origins other than the target in ``tokens_by_origin``, registered
    ones first in their order, then unknown ones by name."""
    known = [o for o in ORIGINS if o != TARGET and o in tokens_by_origin]
    other = sorted(o for o in tokens_by_origin if o != TARGET and o not in ORIGINS)
    return known + other
