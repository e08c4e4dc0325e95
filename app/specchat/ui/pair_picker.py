"""Choosing the target and the draft, with the compatibility verdict.

The lists come from the library (built-in, installed, catalog); both boxes
also take a typed reference (a folder, a .gguf file, hf:org/repo). An
incompatible pair cannot be loaded, and the reason stays visible. This is
only the widget: what it shows is read, probed and measured off the GUI
thread by its PairController (pair_controller.py), which the session owns.

The verdict is one short line ("✓ compatible · draft 2.8× smaller"); the
full reasoning is its tooltip, and a click unfolds it under the line. A
refusal keeps its reason in that line, cut to the width with "…".

A cluster (``specchat cluster``) is offered as a target, "<model> on
cluster <name>", once its other ranks answer; they are asked every few
seconds, and the entry is greyed out with the reason while they do not.

A draft head (EAGLE-3) is never a target: it is listed only as a draft,
"<head>  (draft head for <target>)" when it fits the chosen target, and
greyed out as "for another model", with why in its tooltip, when not.

"Find the best draft" measures the installed drafts for the chosen target
(ui/draft_finder.py) with a progress bar and Cancel; every draft measured
for this target on this machine, now or before, shows its speedup in the
draft list ("Qwen2.5 Coder 0.5B … — 1.6× measured").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QWidget,
)

from specchat.engine import modes
from specchat.errors import SpecChatError
from specchat.ui.library_view import (
    OWN_HEAD_LABEL,
    ModelChoice,
    Verdict,
    cluster_choice,
    head_label,
)
from specchat.ui.pair_controller import PairController
from specchat.ui.widgets import ElidedLabel, button, hbox, vbox

if TYPE_CHECKING:
    from specchat.library import recommendations as rec

LOOKUP_LABEL = "No draft: suffix matching"
MIN_CHARS = 22  # of a model box: a model's name with its size
HELP = {
    "target": "The model whose replies you get (a name, folder, .gguf or hf:org/repo)",
    "draft": "A small model with the same tokenizer that proposes tokens, or suffix matching "
             "(no second model)",
}


def _full_name(label: str, ref: str) -> str:
    return label if ref == label else f"{label}\n{ref}"


_SMALLER = re.compile(r"(\d+(?:\.\d+)?)x smaller")
_CATALOG = "judged from the catalog"
REFUSED = "✗ could not load: "


def verdict_headline(verdict: Verdict) -> str:
    """The verdict in a few words: what a person needs at a glance. A
    refusal leads with its first reason, the one to fix."""
    reasons = verdict.reasons
    if verdict.compatible is False:
        return "✗ incompatible: " + (reasons[0] if reasons else "the draft cannot speculate "
                                     "for this target")
    if verdict.compatible is None:
        return "? " + (reasons[0] if reasons else "checked when the pair loads")
    text = verdict.text
    if reasons and reasons[0].startswith("No draft"):
        return "✓ no draft model: suffix matching drafts from the conversation and your history"
    parts = ["✓ compatible"]
    smaller = _SMALLER.search(text)
    if smaller:
        parts.append(f"draft {smaller.group(1)}× smaller")
    if _CATALOG in text:
        parts.append("judged from the catalog")
    return " · ".join(parts)


def verdict_details(verdict: Verdict) -> str:
    """The full reasoning, one reason a line."""
    return "\n".join(r[:1].upper() + r[1:] for r in verdict.reasons) or verdict.text


class VerdictLabel(ElidedLabel):
    """One line, cut with "…" to the width it gets (it never widens the bar);
    the full reasoning is the tooltip, and a click unfolds it below."""

    def __init__(self, parent=None):
        self._details = ""
        self.expanded = False
        super().__init__(min_width=40, parent=parent)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def show_verdict(self, headline: str, details: str = "") -> None:
        self._details = details
        self.expanded = False
        self.setToolTip(f"{details}\n\n(click to show it here)" if details else "")
        self.set_full(headline)

    def headline(self) -> str:
        return self.full

    def full_text(self) -> str:
        return f"{self.full}\n{self._details}" if self._details else self.full

    def toggle(self) -> None:
        self.expanded = not self.expanded and bool(self._details)
        self._elide()

    def _elide(self) -> None:
        """Unfolded: the whole reasoning, wrapped; else the one cut line."""
        self.setWordWrap(self.expanded)
        if self.expanded:
            self.setText(self.full_text())
            self.updateGeometry()
        else:
            super()._elide()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(0, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(200, super().sizeHint().height())

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.button() == Qt.MouseButton.LeftButton:
            self.toggle()
        super().mouseReleaseEvent(event)


LABEL_ROLE = Qt.ItemDataRole.UserRole + 1  # an item's label without its measured speedup
DETAIL_ROLE = Qt.ItemDataRole.UserRole + 2  # what its tooltip names under the label
HEAD_ROLE = Qt.ItemDataRole.UserRole + 3  # a draft head's: where it came from (None: not a head)
FIND_LABEL = "Find the best draft"
FIND_HELP = ("Measure every installed draft for this target on your recent prompts (acceptance, "
             "draft cost, speedup over plain decoding) and rank them")


def measured_label(label: str, result: rec.DraftResult | None) -> str:
    """A draft's name in the list, with its measured speedup when it has one."""
    return f"{label} — {result.measured_speedup:.1f}× measured" if result else label


def outcome_text(outcome: rec.Recommendation) -> tuple[str, str]:
    """A search's outcome as one line and, for its tooltip, every draft: the
    ranking with the numbers behind it, then the refused ones with why."""
    lines = [f"Measured on {outcome.sample.describe()}, {outcome.machine}:"]
    lines += [f"{i}. {r.name}: {r.summary()}" for i, r in enumerate(outcome.ranked, 1)]
    lines += [f"✗ {x.name}: {x.reason}" for x in outcome.refused]
    best = outcome.best
    if best is not None:
        head = f"Best draft: {best.name} — {best.summary()}"
    elif outcome.ranked:
        head = "No draft beats plain decoding here; suffix matching needs none"
    else:
        head = "No installed draft could be measured for this target"
    if outcome.refused:
        head += f" · {len(outcome.refused)} not measured (hover for why)"
    if outcome.cancelled:
        head = "Cancelled · " + head
    return head, "\n".join(lines)


class FinderStrip(QWidget):
    """The search's line under the verdict: a progress bar and Cancel while
    it runs, then its outcome in one line (everything in the tooltip)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        self.status = VerdictLabel()  # one line cut with "…"; the rest on hover or a click
        self.status.setObjectName("FinderStatus")
        self.cancel_button = button("Cancel", "Stop measuring; drafts measured so far are kept")
        hbox((self.status, 3), (self.bar, 2), self.cancel_button, parent=self, margins=0)
        self.hide()

    def running(self, message: str, fraction: float) -> None:
        self.bar.show()
        self.cancel_button.show()
        self.cancel_button.setEnabled(True)
        self.bar.setValue(int(fraction * 1000))
        self.status.show_verdict(message)
        self.show()

    def cancelling(self) -> None:
        self.cancel_button.setEnabled(False)
        self.status.show_verdict("Cancelling after this step…")

    def done(self, text: str, details: str = "") -> None:
        self.bar.hide()
        self.cancel_button.hide()
        self.status.show_verdict(text, details)
        self.show()

    def text(self) -> str:
        """The whole line (the label may show it cut)."""
        return self.status.headline()


class PairPicker(QFrame):
    """The boxes, the verdict, Load, Models… and the search's line: a view
    over a PairController (pair_controller.py), which reads and asks
    everything off the GUI thread; this draws what it holds and hands it
    the person's clicks."""

    loadRequested = Signal(str, object)  # target, draft (None = suffix matching)
    manageRequested = Signal()

    def __init__(self, pairs: PairController, parent=None):
        super().__init__(parent)
        self.setObjectName("PairBar")
        self.pairs = pairs
        self.target = QComboBox()
        self.draft = QComboBox()
        for box in (self.target, self.draft):
            box.setEditable(True)
            box.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
            # Wide enough for a name and its size ("Qwen2.5 Coder 1.5B Ins"):
            # two models of one family differ there, not in their first words.
            box.setMinimumContentsLength(MIN_CHARS)
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            # Qt's popup elides in the middle, which cuts exactly the size out
            # of "Qwen2.5 Coder 1.5B Instruct (built in)"; cut the tail instead.
            box.view().setTextElideMode(Qt.TextElideMode.ElideRight)
            box.activated.connect(lambda _i, b=box: self._show_start(b))
            box.currentTextChanged.connect(lambda _t, b=box: self._show_full_name(b))
        self.verdict_label = VerdictLabel()
        self.verdict_label.setObjectName("Verdict")
        self.load_button = button("Load", "Load this pair", clicked=self._load_clicked)
        self.manage_button = button("Models…", "Download, import and delete models",
                                    clicked=self.manageRequested)
        self.find_button = button(FIND_LABEL, FIND_HELP, clicked=self.find_best_draft)
        self.finder_strip = FinderStrip()
        # The verdict has a line of its own under the boxes: beside them it
        # took the width the models' names need.
        vbox(hbox(QLabel("Target"), (self.target, 1), QLabel("Draft"), (self.draft, 1),
                  self.load_button, self.manage_button),
             hbox((self.verdict_label, 1), self.find_button), self.finder_strip,
             parent=self, margins=(12, 6, 12, 6), spacing=4)
        self._busy = False
        self._refused = False  # the label shows the engine's refusal of the last load
        self._shown: tuple | None = None  # what the lists were built from
        self._rebuild()
        self.target.currentTextChanged.connect(self._changed)
        self.draft.currentTextChanged.connect(self._changed)
        self.target.currentTextChanged.connect(self._target_changed)
        self.finder_strip.cancel_button.clicked.connect(self.cancel_finding)
        pairs.choicesChanged.connect(self._choices_changed)
        pairs.verdictChanged.connect(self._verdict_changed)
        pairs.measuredChanged.connect(self.show_measured)
        pairs.headsChanged.connect(self.show_measured)
        pairs.finder.progressed.connect(self._finder_progress)
        pairs.finder.finished.connect(self._found)
        pairs.finder.failed.connect(self._find_failed)

    # -- contents ----------------------------------------------------------
    def _choices_changed(self) -> None:
        """The lists again, if what they show changed, unless the person is
        choosing: a rebuilt list would take the half-typed text and the
        cursor (the next poll tries again)."""
        pairs = self.pairs
        if self._shown != (pairs.choices, pairs.clusters, pairs.loaded_target) \
                and not self._in_use():
            self._rebuild()

    def _rebuild(self) -> None:
        keep = self.selection() if self.target.count() else None
        pairs = self.pairs
        loaded = pairs.loaded_target
        self._shown = (pairs.choices, pairs.clusters, loaded)
        with QSignalBlocker(self.target), QSignalBlocker(self.draft):
            self.target.clear()
            self.draft.clear()
            self.draft.addItem(LOOKUP_LABEL, None)
            self.draft.addItem(OWN_HEAD_LABEL, modes.OWN_HEAD)
            heads = [c for c in pairs.choices if c.head_for is not None]
            models = [c for c in pairs.choices if c.head_for is None]
            for c in heads:  # drafts only: a head drafts for its target, never replies
                self._add(self.draft, c)
                self.draft.setItemData(self.draft.count() - 1, c.detail or c.ref, HEAD_ROLE)
            for c in models:
                self._add(self.target, c)
                self._add(self.draft, c)
            for state in pairs.clusters:  # targets only: the draft runs here
                self._add(self.target, cluster_choice(state, state.ref == loaded))
                if state.waiting is not None and state.ref not in (keep and keep[0], loaded):
                    # The chosen entry stays usable, and so does the loaded one
                    # (its ranks serve this app, so they do not answer probes).
                    self.target.model().item(self.target.count() - 1).setEnabled(False)
        if keep:
            self.set_pair(*keep, check=False)
        self.show_measured()  # refreshes the draft box
        self._refresh(self.target)

    @staticmethod
    def _add(box: QComboBox, c: ModelChoice) -> None:
        box.addItem(c.label, c.ref)
        i = box.count() - 1
        box.setItemData(i, c.label, LABEL_ROLE)
        box.setItemData(i, c.detail or c.ref, DETAIL_ROLE)
        box.setItemData(i, _full_name(c.label, c.detail or c.ref), Qt.ItemDataRole.ToolTipRole)

    def _in_use(self) -> bool:
        """Whether the person has a list open or is typing in a box."""
        return any(box.view().isVisible() or box.lineEdit().hasFocus()
                   for box in (self.target, self.draft))

    def _ref(self, box: QComboBox) -> str | None:
        text = box.currentText().strip()
        i = box.findText(text)
        if i >= 0:
            return box.itemData(i)
        return text or None

    def selection(self) -> tuple[str | None, str | None]:
        return self._ref(self.target), self._ref(self.draft)

    def _select(self, box: QComboBox, ref: str | None) -> None:
        i = box.findData(ref)
        if i < 0 and ref is not None:
            box.addItem(ref, ref)
            i = box.count() - 1
        box.setCurrentIndex(max(i, 0))
        self._show_start(box)

    def _refresh(self, box: QComboBox) -> None:
        """After its items changed: the list opens as wide as its longest
        name, however narrow the box; the name shows from its start; the
        tooltip names the whole choice."""
        view = box.view()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 2 * view.frameWidth()
                             + view.verticalScrollBar().sizeHint().width())
        self._show_start(box)
        self._show_full_name(box)

    def _show_full_name(self, box: QComboBox) -> None:
        """The box's tooltip names the whole choice, then says what the box is for."""
        which = "target" if box is self.target else "draft"
        i = box.findText(box.currentText())
        full = box.itemData(i, Qt.ItemDataRole.ToolTipRole) if i >= 0 else box.currentText()
        box.setToolTip(f"{full}\n\n{HELP[which]}" if full else HELP[which])

    @staticmethod
    def _show_start(box: QComboBox) -> None:
        """An editable combo leaves its cursor at the end of a chosen item,
        which scrolls a long name so that only its tail ("... Instruct") shows."""
        box.lineEdit().setCursorPosition(0)

    def set_pair(self, target: str | None, draft: str | None, check: bool = True) -> None:
        with QSignalBlocker(self.target), QSignalBlocker(self.draft):
            self._select(self.target, target)
            self._select(self.draft, draft)
        self.show_measured()
        if check:
            self._changed()

    # -- verdict -----------------------------------------------------------
    def _changed(self, *_args) -> None:
        self._refused = False  # another pair, or a fresh look at this one
        if self.pairs.check(*self.selection()) is not None:
            self._show_line("Checking the pair…", "", "")  # restyled: not a refusal's red

    def _verdict_changed(self, verdict: Verdict) -> None:
        if self._refused:  # the engine's refusal came first: it stays up
            self.load_button.setEnabled(not self._busy and verdict.compatible is not False)
        else:
            self.show_verdict(verdict)

    def show_verdict(self, verdict: Verdict) -> None:
        self._refused = False
        self._show_line(verdict_headline(verdict), verdict_details(verdict),
                        {True: "true", False: "false", None: "unknown"}[verdict.compatible])
        # A verdict that comes in while a reply or Compare has the engine
        # leaves Load off (set_busy turns it back on).
        self.load_button.setEnabled(not self._busy and verdict.compatible is not False)

    def show_refusal(self, message: str) -> None:
        """The engine refused to load the pair: show why, in the same place."""
        self._refused = True
        self._show_line(REFUSED + " ".join(message.split()), message, "false")
        self.load_button.setEnabled(True)  # the person may fix files and retry

    def _show_line(self, headline: str, details: str, ok: str) -> None:
        self.verdict_label.show_verdict(headline, details)
        self.verdict_label.setProperty("ok", ok)
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)

    def load_started(self) -> None:
        """A new load makes the last refusal stale (the person may have fixed
        the files): show the pair's verdict again while it loads."""
        if not self._refused:
            return
        self._refused = False
        if self.pairs.verdict is not None:
            self.show_verdict(self.pairs.verdict)
        else:
            self.verdict_label.show_verdict("")

    def _loadable(self) -> bool:
        verdict = self.pairs.verdict
        return verdict is None or verdict.compatible is not False

    def set_busy(self, busy: bool) -> None:
        """While a reply streams or a conversation opens (or a search holds
        the engine), no load and no search starts."""
        self.load_button.setEnabled(not busy and self._loadable())
        self._busy = busy
        self._enable_find()

    def _load_clicked(self) -> None:
        target, draft = self.selection()
        if target and self._loadable():
            self.loadRequested.emit(target, draft)

    # -- measured drafts ----------------------------------------------------------
    def show_measured(self) -> None:
        """Put each draft's measured speedup for the chosen target on this
        machine (remembered in the library) next to its name in the list."""
        target = self._ref(self.target)
        results = self.pairs.measured(target)
        self._label_heads(target)
        box = self.draft
        current = box.currentIndex()
        with QSignalBlocker(box):
            for i in range(box.count()):
                label = box.itemData(i, LABEL_ROLE)
                if label is None:
                    continue
                result = results.get(box.itemData(i))
                text = measured_label(label, result)
                box.setItemText(i, text)
                tip = _full_name(text, box.itemData(i, DETAIL_ROLE))
                if result is not None:
                    tip += f"\nMeasured for this target here: {result.summary()}"
                box.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
            if current >= 0:
                box.setEditText(box.itemText(current))
        self._refresh(box)

    def _label_heads(self, target: str | None) -> None:
        """Each draft head in the list: for the chosen target when it fits
        it, else greyed out as for another model, with the check's reasons
        in its tooltip (the controller works them out off this thread)."""
        fits = self.pairs.heads(target)  # the answer for this target, or None yet
        box = self.draft
        for i in range(box.count()):
            source = box.itemData(i, HEAD_ROLE)
            if source is None:
                continue
            ref = box.itemData(i)
            verdict = fits.verdicts.get(ref) if fits is not None else None
            ok = verdict.compatible if verdict is not None else None
            box.setItemData(i, head_label(ref, fits.name if fits else None, ok), LABEL_ROLE)
            why = "\n".join(verdict.reasons) if verdict is not None else ""
            box.setItemData(i, f"{source}\n{why}" if why else source, DETAIL_ROLE)
            box.model().item(i).setEnabled(ok is not False)

    def _target_changed(self, *_args) -> None:
        """Another target: its own measurements, and no stale outcome."""
        self.show_measured()
        if not self.pairs.finder.running:
            self.finder_strip.hide()
        self._enable_find()

    def _enable_find(self) -> None:
        self.find_button.setEnabled(not self.pairs.finder.running and not self._busy
                                    and bool(self._ref(self.target)))

    def find_best_draft(self) -> None:
        """Measure the installed drafts for the chosen target and rank them."""
        target = self._ref(self.target)
        if not target:
            return
        try:
            self.pairs.finder.start(target)  # or SpecChatError: why not now
        except SpecChatError as exc:
            self.finder_strip.done(str(exc))
            return
        self.finder_strip.running("Checking which drafts fit…", 0.0)
        self._enable_find()

    def _finder_progress(self, message: str, fraction: float) -> None:
        self.finder_strip.running(message, fraction)
        if self.pairs.finder.cancelling:
            self.finder_strip.cancelling()

    def cancel_finding(self) -> None:
        if self.pairs.finder.running:
            self.pairs.finder.cancel()
            self.finder_strip.cancelling()

    def _found(self, outcome: rec.Recommendation) -> None:
        """Show the outcome, and choose the best draft (Load loads it)."""
        if outcome.best is not None:
            self.set_pair(outcome.target, outcome.best.draft)
        self.show_measured()
        self.finder_strip.done(*outcome_text(outcome))
        self._enable_find()

    def _find_failed(self, message: str) -> None:
        self.finder_strip.done("✗ " + " ".join(message.split()), message)
        self._enable_find()
