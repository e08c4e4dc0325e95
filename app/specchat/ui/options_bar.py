"""The speculative options under the pair bar: the switch (and its
shortcut), the draft length K, colouring by token origin, the thinking
switch, Compare and Settings.

A view over the session's settings: a change here goes to
``AppSession.update_settings`` (which saves it), and a change from anywhere
shows here through ``settingsChanged``. The thinking switch is the open
conversation's, not a setting: it shows what the window gives it
(``show_effort``) and says what is chosen (``thinkingChosen``); what it
offers is the loaded model's (ui/thinking.py).
"""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QLabel,
    QSizePolicy,
    QWidget,
)

from specchat import origins
from specchat.engine import drafter_kinds, modes
from specchat.engine.events import LoadedPair
from specchat.store.settings import AppSettings
from specchat.ui import thinking
from specchat.ui.session import AppSession
from specchat.ui.widgets import button, hbox, label

SPEC_SHORTCUT = "Ctrl+Shift+S"
# The menu reaches as far as K auto can go (the longest block any drafter
# kind may propose), so every K the gauge shows can also be fixed.
MAX_K = max(kind.cap for kind in drafter_kinds.KINDS.values())


class OriginLegend(QWidget):
    """What Colour tokens' tints mean: one tinted word per source; the
    target's own tokens are not tinted. Where the bar has no room for the
    words, a tinted square each (``set_compact``), the words on hover."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = hbox(parent=self, margins=0, spacing=4)
        self.swatches: list[tuple[QLabel, origins.Origin]] = []
        for origin in origins.ORIGINS.values():
            if not any(origin.tint):
                continue  # the target's own tokens are not tinted
            swatch = QLabel()
            swatch.setObjectName("OriginSwatch")  # theme.origin_swatches tints it
            swatch.setProperty("origin", origin.name)
            swatch.setAlignment(Qt.AlignmentFlag.AlignCenter)
            swatch.setToolTip(origin.label)
            lay.addWidget(swatch)
            self.swatches.append((swatch, origin))
        self.compact = None
        self.set_compact(False)
        self.setToolTip("Where each token came from: "
                        + ", ".join(o.label for o in origins.ORIGINS.values() if any(o.tint))
                        + ". Untinted text the target wrote itself.")

    def set_compact(self, on: bool) -> None:
        if on == self.compact:
            return
        self.compact = on
        for swatch, origin in self.swatches:
            swatch.setText("" if on else origin.short)  # the gauges' words for them
            # The stylesheet's padding is not in a label's size hint: room for it here.
            width = 14 if on else swatch.fontMetrics().horizontalAdvance(origin.short) + 14
            swatch.setMinimumWidth(width)
            swatch.setMaximumWidth(width if on else 16777215)
        self.updateGeometry()

    def words_width(self) -> int:
        """Its width with the words."""
        lay = self.layout()
        return (sum(s.fontMetrics().horizontalAdvance(o.short) + 14 for s, o in self.swatches)
                + lay.spacing() * (len(self.swatches) - 1))


class OptionsBar(QFrame):
    compareRequested = Signal()
    settingsRequested = Signal()
    notice = Signal(str)  # a short message for the status bar
    thinkingChosen = Signal(str)  # the person chose a reasoning effort for this conversation

    def __init__(self, session: AppSession, parent=None):
        super().__init__(parent)
        self.setObjectName("PairBar")
        self.session = session
        self._format = None  # the loaded model's ChatFormat: what the thinking switch offers
        self._effort = ""  # the open conversation's
        self._build()
        self.show_settings(session.settings)
        session.settingsChanged.connect(self.show_settings)

    def _build(self) -> None:
        # The shortcut works anywhere in the window (WindowShortcut).
        self.spec_action = QAction("Speculative decoding", self)
        self.spec_action.setCheckable(True)
        self.spec_action.setShortcut(QKeySequence(SPEC_SHORTCUT))
        self.spec_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.addAction(self.spec_action)
        self.spec_action.triggered.connect(self._toggle_speculative)
        self.spec_box = QCheckBox("Speculative decoding")
        self.spec_box.setToolTip(f"Draft tokens and verify them in one pass ({SPEC_SHORTCUT}). "
                                 "Takes effect on the next reply.")
        self.spec_box.toggled.connect(self._speculative_changed)
        self.mode_box = QComboBox()
        self.mode_box.addItem("Mode: auto", None)
        self.mode_box.setItemData(0, "Chosen for the pair: the draft model with suffix matches, "
                                     "or suffix matches alone without a draft model",
                                  Qt.ItemDataRole.ToolTipRole)
        for m in modes.MODES.values():
            if m.speculative:
                self.mode_box.addItem(f"Mode: {m.name}", m.name)
                self.mode_box.setItemData(self.mode_box.count() - 1,
                                          getattr(m, "description", "") or m.label,
                                          Qt.ItemDataRole.ToolTipRole)
        self.mode_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.mode_box.setToolTip("How tokens are drafted when speculative decoding is on "
                                 "(hover over a mode for what it does)")
        self.mode_box.currentIndexChanged.connect(self._mode_changed)
        self.k_box = QComboBox()
        self.k_box.addItem("K auto", None)
        for k in range(1, MAX_K + 1):
            self.k_box.addItem(f"K = {k}", k)
        self.k_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.k_box.setToolTip(f"Draft length: K auto chooses it each step (up to {MAX_K}), "
                              "or fix the number of tokens drafted per step")
        self.k_box.currentIndexChanged.connect(self._k_changed)
        self.color_box = QCheckBox("Colour tokens")
        self.color_box.setToolTip("Tint each accepted draft token by where it came from")
        self.color_box.toggled.connect(self._color_changed)
        self.legend = OriginLegend()
        self.legend.hide()
        self.thinking_box = QComboBox()
        self.thinking_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        # Its words say what the next reply does: kept whole (the legend gives way first).
        self.thinking_box.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.thinking_box.setAccessibleName("Thinking")
        self.thinking_box.activated.connect(self._thinking_chosen)
        self._show_thinking()
        self.spec_reason = label(name="ErrorBanner", wrap=True)
        self.spec_reason.hide()
        self.compare_button = button("Compare…", "Run one prompt plain and speculative, side by "
                                     "side", clicked=self.compareRequested)
        self.settings_button = button("Settings…", clicked=self.settingsRequested)
        hbox(self.spec_box, self.mode_box, self.k_box, self.color_box, self.legend,
             self.thinking_box, (self.spec_reason, 1), 1, self.compare_button,
             self.settings_button, parent=self, margins=(12, 4, 12, 4))

    # -- from the session and the window ---------------------------------------
    def show_settings(self, s: AppSettings) -> None:
        with (QSignalBlocker(self.spec_box), QSignalBlocker(self.color_box),
              QSignalBlocker(self.mode_box), QSignalBlocker(self.k_box)):
            self.spec_box.setChecked(s.speculative)
            self.color_box.setChecked(s.color_tokens)
            self.mode_box.setCurrentIndex(max(0, self.mode_box.findData(s.spec_mode)))
            # The session's K is valid (from_stored and update_settings check
            # it): any K from 1 to 32 is shown, listed or not.
            if s.k is not None and self.k_box.findData(s.k) < 0:
                self.k_box.addItem(f"K = {s.k}", s.k)
            self.k_box.setCurrentIndex(max(0, self.k_box.findData(s.k)))
        self._fit_legend()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_legend()

    def _fit_legend(self) -> None:
        """Colour tokens' legend: its words where the bar has room for them
        beside every control at its full width, else its tinted squares
        (the words on hover), so no control's words are cut for it."""
        self.legend.setVisible(self.session.settings.color_tokens)
        lay = self.layout()
        if lay is None:  # still being built
            return
        shown = [lay.itemAt(i).widget() for i in range(lay.count())]
        shown = [w for w in shown if w is not None and w is not self.legend
                 and not w.isHidden()]
        margins = lay.contentsMargins()
        needed = (sum(w.sizeHint().width() for w in shown) + self.legend.words_width()
                  + lay.spacing() * len(shown) + margins.left() + margins.right())
        self.legend.set_compact(needed > self.width())

    def show_pair(self, pair: LoadedPair | None) -> None:
        """A pair that cannot speculate disables the options and says why."""
        can = pair is None or pair.speculative_ok
        for w in (self.spec_box, self.spec_action, self.mode_box, self.k_box):
            w.setEnabled(can)
        if not can:
            self.spec_reason.setText("Speculative decoding is off for this pair: "
                                     + (pair.reason or "the pair cannot speculate."))
        self.spec_reason.setVisible(not can)
        fmt = pair.chat if pair is not None else None
        if fmt != self._format:
            self._format = fmt
            self._show_thinking()

    def show_effort(self, effort: str) -> None:
        """The open conversation's thinking switch."""
        self._effort = effort
        self._show_thinking()

    def _show_thinking(self) -> None:
        """The switch as the loaded model has it (off, with the reason,
        where it has none), showing what the conversation asks for."""
        box, offered = self.thinking_box, thinking.choices(self._format)
        with QSignalBlocker(box):
            box.clear()
            for choice in offered:
                box.addItem(choice.label, choice.effort)
                box.setItemData(box.count() - 1, choice.tip, Qt.ItemDataRole.ToolTipRole)
            if not offered:
                box.addItem("Thinking", "")
            box.setCurrentIndex(thinking.chosen(self._format, self._effort))
        box.updateGeometry()
        self._fit_legend()
        why = thinking.unavailable(self._format)
        box.setEnabled(not why)
        box.setToolTip(why or "Whether the model reasons before it answers, for this "
                              "conversation (its chat template's own switch). Takes effect on "
                              "the next reply.")

    def set_can_compare(self, on: bool) -> None:
        self.compare_button.setEnabled(on)

    # -- to the session --------------------------------------------------------
    def _toggle_speculative(self) -> None:
        if self.spec_box.isEnabled():
            self.spec_box.setChecked(not self.spec_box.isChecked())

    def _speculative_changed(self, on: bool) -> None:
        self.session.update_settings(speculative=on)
        self.notice.emit(f"Speculative decoding {'on' if on else 'off'}: applies to the next reply")

    def _mode_changed(self, _index: int) -> None:
        name = self.mode_box.currentData()
        self.session.update_settings(spec_mode=name)
        self.notice.emit(f"Decoding mode {name or 'auto'}: applies to the next reply")

    def _thinking_chosen(self, _index: int) -> None:
        effort = self.thinking_box.currentData() or ""
        self._effort = effort
        self.thinkingChosen.emit(effort)
        self.notice.emit(f"{self.thinking_box.currentText()}: applies to the next reply in this "
                         "conversation")

    def _k_changed(self, _index: int) -> None:
        self.session.update_settings(k=self.k_box.currentData())

    def _color_changed(self, on: bool) -> None:
        self.session.update_settings(color_tokens=on)
