"""Choosing the target and the draft, with the compatibility verdict.

The lists come from the library (built-in, installed, catalog); both boxes
also take a typed reference (a folder, a .gguf file, hf:org/repo). The
verdict is computed off the GUI thread, since it reads tokenizer files; an
incompatible pair cannot be loaded, and the reason stays visible.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
)

from specchat.ui import library_view
from specchat.ui.library_view import ModelChoice, Verdict

LOOKUP_LABEL = "No draft: prompt lookup"
MIN_CHARS = 22  # of a model box: a model's name with its size
HELP = {
    "target": "The model whose replies you get (a name, folder, .gguf or hf:org/repo)",
    "draft": "A small model with the same tokenizer that proposes tokens, or prompt lookup "
             "(no second model)",
}


def _full_name(label: str, ref: str) -> str:
    return label if ref == label else f"{label}\n{ref}"


class PairPicker(QFrame):
    loadRequested = Signal(str, object)  # target, draft (None = prompt lookup)
    manageRequested = Signal()
    verdictChanged = Signal(object)  # Verdict

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("PairBar")
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
        self.verdict_label = QLabel()
        self.verdict_label.setObjectName("Verdict")
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setSizePolicy(QSizePolicy.Policy.Expanding,
                                         QSizePolicy.Policy.Preferred)
        self.verdict_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load this pair")
        self.manage_button = QPushButton("Models…")
        self.manage_button.setToolTip("Download, import and delete models")
        # The verdict has a line of its own under the boxes: beside them it
        # took the width the models' names need.
        row = QHBoxLayout()
        row.addWidget(QLabel("Target"))
        row.addWidget(self.target, 1)
        row.addWidget(QLabel("Draft"))
        row.addWidget(self.draft, 1)
        row.addWidget(self.load_button)
        row.addWidget(self.manage_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 6, 12, 6)
        lay.setSpacing(4)
        lay.addLayout(row)
        lay.addWidget(self.verdict_label)
        self.verdict: Verdict | None = None
        self._refused = False  # the label shows the engine's refusal of the last load
        self._check_task: asyncio.Future | None = None
        self._generation = 0
        self.reload_choices()
        self.target.currentTextChanged.connect(self._changed)
        self.draft.currentTextChanged.connect(self._changed)
        self.load_button.clicked.connect(self._load_clicked)
        self.manage_button.clicked.connect(self.manageRequested)

    # -- contents ----------------------------------------------------------
    def reload_choices(self, choices: list[ModelChoice] | None = None) -> None:
        keep = self.selection() if self.target.count() else None
        choices = choices if choices is not None else library_view.model_choices()
        for box in (self.target, self.draft):
            box.blockSignals(True)
            box.clear()
        self.draft.addItem(LOOKUP_LABEL, None)
        for c in choices:
            for box in (self.target, self.draft):
                box.addItem(c.label, c.ref)
                box.setItemData(box.count() - 1, _full_name(c.label, c.detail or c.ref),
                                Qt.ItemDataRole.ToolTipRole)
        for box in (self.target, self.draft):
            box.blockSignals(False)
            self._fit_popup(box)
            self._show_start(box)
            self._show_full_name(box)
        if keep:
            self.set_pair(*keep, check=False)

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

    @staticmethod
    def _fit_popup(box: QComboBox) -> None:
        """The list opens as wide as its longest name, however narrow the box."""
        view = box.view()
        width = view.sizeHintForColumn(0) + view.verticalScrollBar().sizeHint().width() \
            + 2 * view.frameWidth()
        view.setMinimumWidth(width)

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
        for box in (self.target, self.draft):
            box.blockSignals(True)
        self._select(self.target, target)
        self._select(self.draft, draft)
        for box in (self.target, self.draft):
            box.blockSignals(False)
        if check:
            self._changed()

    # -- verdict -----------------------------------------------------------
    def _changed(self, *_args) -> None:
        target, draft = self.selection()
        self._generation += 1
        self._refused = False  # another pair, or a fresh look at this one
        if not target:
            self.show_verdict(Verdict(False, ("Choose a target model.",)))
            return
        self.verdict_label.setText("Checking the pair…")
        self.verdict_label.setProperty("ok", "")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._check_task = asyncio.ensure_future(self._check(self._generation, target, draft))

    async def _check(self, generation: int, target: str, draft: str | None) -> None:
        loop = asyncio.get_running_loop()
        verdict = await loop.run_in_executor(None, library_view.check_pair, target, draft)
        if verdict.compatible is False:
            # Refusing is not enough: say what would work with this target.
            names = await loop.run_in_executor(None, library_view.suggest_drafts, target)
            names = [n for n in names if n != draft][:3]
            if names:
                verdict = Verdict(False, (*verdict.reasons,
                                          "drafts that fit this target: " + ", ".join(names)))
        if generation != self._generation:
            return
        if self._refused:  # the engine's refusal came first: it stays up
            self.verdict = verdict
            self.load_button.setEnabled(verdict.compatible is not False)
        else:
            self.show_verdict(verdict)

    async def wait_checked(self) -> Verdict | None:
        if self._check_task is not None:
            await self._check_task
        return self.verdict

    def show_verdict(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self._refused = False
        if verdict.compatible is False:
            text = "✗ Incompatible: " + verdict.text
        elif verdict.compatible:
            text = "✓ " + verdict.text
        else:
            text = verdict.text
        self.verdict_label.setText(text)
        self.verdict_label.setToolTip(verdict.text)
        self.verdict_label.setProperty(
            "ok", {True: "true", False: "false", None: "unknown"}[verdict.compatible])
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)
        self.load_button.setEnabled(verdict.compatible is not False)
        self.verdictChanged.emit(verdict)

    def show_refusal(self, message: str) -> None:
        """The engine refused to load the pair: show why, in the same place."""
        self._refused = True
        self.verdict_label.setText("✗ Could not load: " + message)
        self.verdict_label.setToolTip(message)
        self.verdict_label.setProperty("ok", "false")
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)
        self.load_button.setEnabled(True)  # the person may fix files and retry

    def load_started(self) -> None:
        """A new load makes the last refusal stale (the person may have fixed
        the files): show the pair's verdict again while it loads."""
        if not self._refused:
            return
        self._refused = False
        if self.verdict is not None:
            self.show_verdict(self.verdict)
        else:
            self.verdict_label.setText("")
            self.verdict_label.setToolTip("")

    def set_busy(self, busy: bool) -> None:
        """While a reply streams or a conversation opens, no load starts."""
        self.load_button.setEnabled(not busy and (
            self.verdict is None or self.verdict.compatible is not False))

    def _load_clicked(self) -> None:
        target, draft = self.selection()
        if target and (self.verdict is None or self.verdict.compatible is not False):
            self.loadRequested.emit(target, draft)
