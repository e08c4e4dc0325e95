"""Choosing the target and the draft, with the compatibility verdict.

The lists come from the library (built-in, installed, catalog, clusters);
both boxes also take a typed reference (a folder, a .gguf file,
hf:org/repo). An incompatible pair cannot be loaded, and the reason stays
visible. This is only the widget: what the lists hold, which entries are
greyed out and why, and what stays chosen are pair_choices.py's rules;
what they are made of is read, probed and measured off the GUI thread by
the PairController (pair_controller.py), which the session owns; the
lines under the boxes (the verdict, "Find the best draft"'s progress and
outcome) are pair_lines.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import QComboBox, QFrame, QLabel

from specchat.ui import pair_choices
from specchat.ui.library_view import Verdict
from specchat.ui.pair_choices import Entry
from specchat.ui.pair_controller import PairController
from specchat.ui.pair_lines import FinderStrip, VerdictLabel
from specchat.ui.widgets import button, hbox, vbox

if TYPE_CHECKING:
    from specchat.library import recommendations as rec

MIN_CHARS = 22  # of a model box: a model's name with its size
HELP = {
    "target": "The model whose replies you get (a name, folder, .gguf or hf:org/repo)",
    "draft": "A small model with the same tokenizer that proposes tokens, or suffix matching "
             "(no second model)",
}
FIND_LABEL = "Find the best draft"
FIND_HELP = ("Measure every installed draft for this target on your recent prompts (acceptance, "
             "draft cost, speedup over plain decoding) and rank them")


class PairPicker(QFrame):
    """The boxes, the verdict, Load, Models… and the search's line: a view
    over a PairController (pair_controller.py), which reads and asks
    everything off the GUI thread; this draws the entries pair_choices.py
    makes of what it holds and hands it the person's clicks."""

    loadRequested = Signal(str, object)  # target, draft (None = suffix matching)
    manageRequested = Signal()

    def __init__(self, pairs: PairController, parent=None):
        super().__init__(parent)
        self.setObjectName("PairBar")
        self.pairs = pairs
        self.target = QComboBox()
        self.draft = QComboBox()
        self._entries: dict[QComboBox, list[Entry]] = {self.target: [], self.draft: []}
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
        self.finder_strip = FinderStrip(pairs.finder)
        # The verdict has a line of its own under the boxes: beside them it
        # took the width the models' names need.
        vbox(hbox(QLabel("Target"), (self.target, 1), QLabel("Draft"), (self.draft, 1),
                  self.load_button, self.manage_button),
             hbox((self.verdict_label, 1), self.find_button), self.finder_strip,
             parent=self, margins=(12, 6, 12, 6), spacing=4)
        self._busy = False
        self._refused = False  # the label shows the engine's refusal of the last load
        self._shown = pair_choices.Listing()  # what the lists were built from
        self._rebuild()
        self.target.currentTextChanged.connect(self._changed)
        self.draft.currentTextChanged.connect(self._changed)
        self.target.currentTextChanged.connect(self._target_changed)
        pairs.choicesChanged.connect(self._choices_changed)
        pairs.verdictChanged.connect(self._verdict_changed)
        pairs.measuredChanged.connect(self.show_measured)
        pairs.headsChanged.connect(self.show_measured)
        pairs.finder.finished.connect(self._found)
        pairs.finder.failed.connect(self._enable_find)

    # -- contents ----------------------------------------------------------
    def _choices_changed(self) -> None:
        """The lists again, if what they show changed, unless the person is
        choosing: a rebuilt list would take the half-typed text and the
        cursor (the next poll tries again)."""
        if self.pairs.listing() != self._shown and not self._in_use():
            self._rebuild()

    def _rebuild(self) -> None:
        """Both lists from what the controller holds, the pick kept."""
        target, draft = self.selection()
        self._shown = self.pairs.listing()
        self._entries[self.target] = self._shown.targets(target)
        self._entries[self.draft] = self._shown.drafts()  # labelled for the target by set_pair
        self.set_pair(target, draft, check=False)

    def _show(self, box: QComboBox, entries: list[Entry], index: int | None = None) -> None:
        """The entries as the box's items, set in place when they are the
        same choices (the list open stays as it is), else put in afresh;
        ``index`` is chosen (None: the one chosen stays)."""
        index = box.currentIndex() if index is None else index
        self._entries[box] = entries
        with QSignalBlocker(box):
            if [e.ref for e in entries] != [box.itemData(i) for i in range(box.count())]:
                box.clear()
                for entry in entries:
                    box.addItem(entry.text, entry.ref)
            for i, entry in enumerate(entries):
                box.setItemText(i, entry.text)
                box.setItemData(i, entry.tooltip or None, Qt.ItemDataRole.ToolTipRole)
                box.model().item(i).setEnabled(entry.enabled)
            box.setCurrentIndex(index)
            if index >= 0:
                box.setEditText(box.itemText(index))
        self._refresh(box)

    def _in_use(self) -> bool:
        """Whether the person has a list open or is typing in a box."""
        return any(box.view().isVisible() or box.lineEdit().hasFocus()
                   for box in (self.target, self.draft))

    def _ref(self, box: QComboBox) -> str | None:
        return pair_choices.picked(self._entries[box], box.currentText())

    def selection(self) -> tuple[str | None, str | None]:
        return self._ref(self.target), self._ref(self.draft)

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
        for box, ref in ((self.target, target), (self.draft, draft)):
            self._show(box, *pair_choices.place(self._entries[box], ref))
        self.show_measured()
        if check:
            self._changed()

    # -- verdict -----------------------------------------------------------
    def _changed(self, *_args) -> None:
        self._refused = False  # another pair, or a fresh look at this one
        if self.pairs.check(*self.selection()) is not None:
            self.verdict_label.show_verdict("Checking the pair…", "", "")  # not a refusal's red

    def _verdict_changed(self, verdict: Verdict) -> None:
        if self._refused:  # the engine's refusal came first: it stays up
            self._enable_load(verdict)
        else:
            self.show_verdict(verdict)

    def show_verdict(self, verdict: Verdict) -> None:
        self._refused = False
        self.verdict_label.set_verdict(verdict)
        self._enable_load(verdict)

    def show_refusal(self, message: str) -> None:
        """The engine refused to load the pair: show why, in the same place."""
        self._refused = True
        self.verdict_label.set_refusal(message)
        self.load_button.setEnabled(True)  # the person may fix files and retry

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

    def _enable_load(self, verdict: Verdict | None) -> None:
        """Load is off for a pair found incompatible, and while a reply,
        Compare or a search has the engine (set_busy turns it back on)."""
        self.load_button.setEnabled(not self._busy and self._loadable(verdict))

    @staticmethod
    def _loadable(verdict: Verdict | None) -> bool:
        return verdict is None or verdict.compatible is not False

    def set_busy(self, busy: bool) -> None:
        """While a reply streams or a conversation opens (or a search holds
        the engine), no load and no search starts."""
        self._busy = busy
        self._enable_load(self.pairs.verdict)
        self._enable_find()

    def _load_clicked(self) -> None:
        target, draft = self.selection()
        if target and self._loadable(self.pairs.verdict):
            self.loadRequested.emit(target, draft)

    # -- measured drafts ----------------------------------------------------------
    def show_measured(self) -> None:
        """The draft list for the chosen target again: which heads fit it,
        and each draft's measured speedup on this machine."""
        target = self._ref(self.target)
        fresh = self._shown.drafts(self.pairs.heads(target), self.pairs.measured(target))
        self._show(self.draft, pair_choices.relabelled(self._entries[self.draft], fresh))

    def _target_changed(self, *_args) -> None:
        """Another target: its own measurements, and no stale outcome."""
        self.show_measured()
        if not self.pairs.finder.running:
            self.finder_strip.hide()
        self._enable_find()

    def _enable_find(self, *_args) -> None:
        self.find_button.setEnabled(not self.pairs.finder.running and not self._busy
                                    and bool(self._ref(self.target)))

    def find_best_draft(self) -> None:
        """Measure the installed drafts for the chosen target and rank them."""
        target = self._ref(self.target)
        if target:
            self.finder_strip.start(target)
            self._enable_find()

    def _found(self, outcome: rec.Recommendation) -> None:
        """Choose the best draft (Load loads it); the strip shows the outcome."""
        if outcome.best is not None:
            self.set_pair(outcome.target, outcome.best.draft)
        self.show_measured()
        self._enable_find()
