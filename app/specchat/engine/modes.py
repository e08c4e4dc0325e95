"""Decoding modes: the one registry that the CLI, the app, the session and the
bench read. A mode is its name, the words for it, and the drafters it uses
(by drafter kind, see drafter_kinds.py); nothing outside this module compares
mode strings.

This module imports no MLX, so the window may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine import drafter_kinds, registry


@dataclass(frozen=True)
class Mode:
    name: str
    label: str  # for people: gauges, menus, reports
    # Drafter kinds; empty for plain decoding. Two share a step as
    # hybrid.py decides: per step the suffix draft, the other drafter's,
    # or both chained, by measured tokens per unit of cost.
    drafters: tuple[str, ...] = ()
    # A sentence for where there is room (a menu's tooltip, docs).
    description: str = ""

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    @property
    def needs(self) -> set[str]:
        """What its drafters need loaded besides the target ("draft", "mtp")."""
        return {drafter_kinds.get(d).needs for d in self.drafters} - {""}

    @property
    def needs_draft_model(self) -> bool:
        return "draft" in self.needs

    def runs_with(self, have: set[str]) -> Mode | None:
        """What this mode runs as when only ``have`` is loaded: the drafters
        whose needs are met (hybrid without a draft model runs as suffix
        matching), or None when none are."""
        rest = tuple(d for d in self.drafters if drafter_kinds.get(d).needs in {"", *have})
        if rest == self.drafters:
            return self
        if not rest:
            return None
        return next((m for m in MODES.values() if m.drafters == rest),
                    Mode(self.name, self.label, rest))

    def without_draft_model(self) -> Mode | None:
        return self.runs_with({"mtp"})


PLAIN = Mode("plain", "plain decoding")
DRAFT = Mode("draft", "draft model", ("draft",))
SUFFIX = Mode("suffix", "suffix match (conversation + history)", ("suffix",))
HYBRID = Mode("hybrid", "draft model + suffix match", ("suffix", "draft"))

MODES: dict[str, Mode] = {m.name: m for m in (PLAIN, DRAFT, SUFFIX, HYBRID)}


def register(mode: Mode) -> Mode:
    """Add a mode (its drafters registered in drafter_kinds.py)."""
    for d in mode.drafters:
        drafter_kinds.get(d)
    return registry.add(MODES, mode)


def get(name: str) -> Mode:
    return registry.lookup(MODES, name, "decoding mode")


# The draft reference that means the target's own MTP head (``--draft mtp``,
# the pair picker's "the model's own MTP head"): no draft model is loaded.
OWN_HEAD = "mtp"


def for_pair(speculative: bool, has_draft: bool, speculative_ok: bool = True,
             lookup: bool = True, mtp: bool = False) -> Mode:
    """The mode a reply runs in: plain when speculation is off or cannot run
    on this pair; the draft model (with suffix matching unless ``lookup`` is
    False) with one; without one the target's own MTP head where it was
    chosen (``mtp``), else suffix matching."""
    if not speculative or not speculative_ok:
        return PLAIN
    if has_draft:
        return HYBRID if lookup else DRAFT
    if mtp:
        return MTP_HYBRID if lookup else MTP
    return SUFFIX


MTP = register(Mode("mtp", "the model's own MTP head", ("mtp",),
                    description="The target's own multi-token-prediction head (Qwen3.5, "
                    "Qwen3.6, Qwen3-Next) drafts: one layer, no second model."))
MTP_HYBRID = register(Mode("mtp+suffix", "the model's own MTP head + suffix match",
                           ("suffix", "mtp")))

HEAD = register(Mode("head", "draft head", ("eagle3",),
                     description="An EAGLE-3 head drafts: one layer reading the target's own "
                     "hidden states, a few percent of a target forward per token."))
HEAD_HYBRID = register(Mode("head+suffix", "draft head + suffix match", ("suffix", "eagle3")))

SSD = register(Mode(
    "ssd", "draft model, drafting ahead while the target verifies (SSD)", ("ssd",),
    description="Speculative speculative decoding: while the target verifies a block, the draft "
    "model drafts the next one on its own core for the outcomes it expects, so a correct guess "
    "makes the next block free. It pays when the draft has hardware of its own (on Apple "
    "Silicon: the draft on the CPU cores while the target runs on the GPU); on a CPU-only "
    "machine the two models share the cores and the memory bandwidth, and it can be slower "
    "than the draft model mode."))
