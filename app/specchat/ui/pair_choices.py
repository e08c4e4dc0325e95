"""What the pair picker offers, worked out with no widget: which targets
are listed, which drafts are offered for the chosen target, which entries
are greyed out and why, and what is chosen by default and after the lists
are built again.

Why apart from the widget: these are the picker's rules, and a rule is
tested by calling it, not by opening a window (tests/ui/test_ui_pair_choices.py).
The widget (pair_picker.py) turns the entries into combo-box items and
reports the person's pick; what they are made of (the choices, the
clusters' answers, which heads fit a target, the drafts measured for it)
is read off the GUI thread by the PairController (pair_controller.py). No
Qt here, and nothing that reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specchat.engine import modes
from specchat.library.sources.cluster import ClusterState
from specchat.ui.library_view import HeadFits, ModelChoice

if TYPE_CHECKING:
    from specchat.library.recommendations import DraftResult

LOOKUP_LABEL = "No draft: suffix matching"
OWN_HEAD_LABEL = "The model's own MTP head"


@dataclass(frozen=True)
class Entry:
    """One item of a list: what choosing it picks, its line, its tooltip
    (the whole name, where it comes from, the check's reasons, what was
    measured) and whether it can be chosen (the tooltip says why not)."""

    ref: str | None  # None: no draft model (suffix matching)
    text: str
    tooltip: str = ""
    enabled: bool = True


def full_name(label: str, detail: str) -> str:
    """A choice's tooltip: its label, and under it what it is, where that
    says more (a folder, a repository, a head's source)."""
    return label if detail == label else f"{label}\n{detail}"


def head_label(name: str, target: str | None = None, fits: bool | None = None) -> str:
    """A draft head's entry in the draft list: for the chosen target when it
    fits it, for another model when it does not, plain while unknown."""
    if fits is True and target:
        return f"{name}  (draft head for {target})"
    if fits is False:
        return f"{name}  (draft head for another model)"
    return f"{name}  (draft head)"


def heads(choices: tuple[ModelChoice, ...] | list[ModelChoice]) -> tuple[tuple[str, str], ...]:
    """The draft heads among the choices, each with the model its files say
    it was made for: which of them fit a target is worked out once per
    target and this tuple (PairController.heads)."""
    return tuple((c.ref, c.head_for) for c in choices if c.head_for is not None)


def _entry(ref: str, label: str, detail: str, enabled: bool = True) -> Entry:
    return Entry(ref, label, full_name(label, detail), enabled)


def _cluster(state: ClusterState, chosen: str | None, loaded: str | None) -> Entry:
    """A cluster as a target: pickable once its ranks answer, else greyed
    out with why not, unless it is the one chosen (it stays usable) or the
    one loaded (its ranks serve this app, so they stop answering probes:
    it says so instead)."""
    where = f"{state.model} on cluster {state.name}"
    if state.waiting is None:
        return _entry(state.ref, f"{where}  ({state.ranks} ranks)",
                      f"{state.ref}: every rank answers")
    if state.ref == loaded:
        return _entry(state.ref, f"{where}  (loaded)",
                      f"{state.ref}: its ranks are serving this window's engine")
    return _entry(state.ref, f"{where}  (not answering)", state.waiting, state.ref == chosen)


def _draft(ref: str, label: str, detail: str, result: DraftResult | None,
           enabled: bool = True) -> Entry:
    """A draft's entry, with its speedup when it was measured for the
    chosen target on this machine."""
    if result is None:
        return _entry(ref, label, detail, enabled)
    text = f"{label} — {result.measured_speedup:.1f}× measured"
    return Entry(ref, text, f"{full_name(text, detail)}\nMeasured for this target here: "
                            f"{result.summary()}", enabled)


@dataclass(frozen=True)
class Listing:
    """What the lists are built from, as the controller last read it: the
    picker builds them again only when this changes."""

    choices: tuple[ModelChoice, ...] = ()  # built in, installed, catalog
    clusters: tuple[ClusterState, ...] = ()  # as last polled
    loaded: str | None = None  # the target the engine serves

    def targets(self, chosen: str | None = None) -> list[Entry]:
        """The target list, ``chosen`` being the target picked now: every
        model, never a draft head (it drafts, it never replies), then every
        cluster (a target only: its draft runs on this machine)."""
        return [*(_entry(c.ref, c.label, c.detail or c.ref) for c in self.choices
                  if c.head_for is None),
                *(_cluster(state, chosen, self.loaded) for state in self.clusters)]

    def drafts(self, fits: HeadFits | None = None,
               measured: dict[str, DraftResult] | None = None) -> list[Entry]:
        """The draft list for a target: suffix matching (no draft model),
        its own MTP head, the draft heads, the models. ``fits`` says which
        heads fit it (None while not known): one made for another model is
        greyed out, the check's reasons in its tooltip. ``measured``: the
        drafts measured for it on this machine."""
        measured = measured or {}
        out = [Entry(None, LOOKUP_LABEL), Entry(modes.OWN_HEAD, OWN_HEAD_LABEL)]
        for c in self.choices:
            if c.head_for is None:
                continue
            verdict = fits.verdicts.get(c.ref) if fits is not None else None
            fit = verdict.compatible if verdict is not None else None
            source, why = c.detail or c.ref, "\n".join(verdict.reasons) if verdict else ""
            out.append(_draft(c.ref, head_label(c.label, fits.name if fits else None, fit),
                              f"{source}\n{why}" if why else source, measured.get(c.ref),
                              fit is not False))
        out += [_draft(c.ref, c.label, c.detail or c.ref, measured.get(c.ref))
                for c in self.choices if c.head_for is None]
        return out


def place(entries: list[Entry], ref: str | None) -> tuple[list[Entry], int]:
    """(the list, the index chosen) to show ``ref`` chosen: its entry; a
    reference not listed is added as itself, so the pick stays; None is
    the entry that picks nothing (suffix matching), else the first (-1 in
    an empty list)."""
    for i, entry in enumerate(entries):
        if entry.ref == ref:
            return entries, i
    if ref is None:
        return entries, 0 if entries else -1
    return [*entries, Entry(ref, ref, ref)], len(entries)


def relabelled(shown: list[Entry], fresh: list[Entry]) -> list[Entry]:
    """The list shown, each entry as worked out again (for another target,
    heads that fit it, drafts measured since); one added as itself stays."""
    by_ref = {entry.ref: entry for entry in fresh}
    return [by_ref.get(entry.ref, entry) for entry in shown]


def picked(entries: list[Entry], text: str) -> str | None:
    """What the text in a box picks: the entry it reads, else the reference
    typed (None: nothing, or suffix matching)."""
    text = text.strip()
    return next((e.ref for e in entries if e.text == text), text or None)
