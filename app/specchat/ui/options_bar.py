"""The speculative options under the pair bar: the switch (and its
shortcut), the draft length K, colouring by token origin, Compare and
Settings.

A view over the session's settings: a change here goes to
``AppSession.update_settings`` (which saves it), and a change from anywhere
shows here through ``settingsChanged``.
"""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QLabel,
    QWidget,
)

from specchat import origins
from specchat.engine import drafter_kinds, modes
from specchat.engine.events import LoadedPair
from specchat.store.settings import AppSettings
from specchat.ui.session import AppSession
from specchat.ui.widgets import button, hbox, label

SPEC_SHORTCUT = "Ctrl+Shift+S"
# The menu reaches as far as K auto can go (the longest block any drafter
# kind may propose), so every K the gauge shows can also be fixed.
MAX_K = max(kind.cap for kind in drafter_kinds.KINDS.values())


class OriginLegend(QWidget):
    """What Colour tokens' tints mean: one tinted word per source; the
    target's own tokens are not tinted."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = hbox(parent=self, margins=0, spacing=4)
        for origin in origins.ORIGINS.values():
            if not any(origin.tint):
                continue  # the target's own tokens are not tinted
            swatch = QLabel(origin.short)  # the gauges' words for them
            swatch.setObjectName("OriginSwatch")  # theme.origin_swatches tints it
            swatch.setProperty("origin", origin.name)
            swatch.setAlignment(Qt.AlignmentFlag.AlignCenter)
            # The stylesheet's padding is not in a label's size hint: room for it here.
            swatch.setMinimumWidth(swatch.fontMetrics().horizontalAdvance(swatch.text()) + 14)
            lay.addWidget(swatch)
        self.setToolTip("Where each token came from: "
                        + ", ".join(o.label for o in origins.ORIGINS.values() if any(o.tint))
                        + ". Untinted text the target wrote itself.")


class OptionsBar(QFrame):
    compareRequested = Signal()
    settingsRequested = Signal()
    notice = Signal(str)  # a short message for the status bar

    def __init__(self, session: AppSession, parent=None):
        super().__init__(parent)
        self.setObjectName("PairBar")
        self.session = session
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
        self.spec_reason = label(name="ErrorBanner", wrap=True)
        self.spec_reason.hide()
        self.compare_button = button("Compare…", "Run one prompt plain and speculative, side by "
                                     "side", clicked=self.compareRequested)
        self.settings_button = button("Settings…", clicked=self.settingsRequested)
        hbox(self.spec_box, self.mode_box, self.k_box, self.color_box, self.legend,
             (self.spec_reason, 1), 1, self.compare_button, self.settings_button, parent=self,
             margins=(12, 4, 12, 4))

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
        self.legend.setVisible(s.color_tokens)

    def show_pair(self, pair: LoadedPair | None) -> None:
        """A pair that cannot speculate disables the options and says why."""
        can = pair is None or pair.speculative_ok
        for w in (self.spec_box, self.spec_action, self.mode_box, self.k_box):
            w.setEnabled(can)
        if not can:
            self.spec_reason.setText("Speculative decoding is off for this pair: "
                                     + (pair.reason or "the pair cannot speculate."))
        self.spec_reason.setVisible(not can)

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

    def _k_changed(self, _index: int) -> None:
        self.session.update_settings(k=self.k_box.currentData())

    def _color_changed(self, on: bool) -> None:
        self.session.update_settings(color_tokens=on)
