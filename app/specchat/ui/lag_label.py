"""The status bar's lag readout: the last 5 s of the lag monitor, once a second."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel

from specchat.ui.lag import LagMonitor

SHOWN_S = 5
EVERY_MS = 1000


class LagLabel(QLabel):
    def __init__(self, lag: LagMonitor, parent=None):
        super().__init__("", parent)
        self._lag = lag
        self._timer = QTimer(self, interval=EVERY_MS)
        self._timer.timeout.connect(self._show)

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _show(self) -> None:
        self.setText(self._lag.stats(last_s=SHOWN_S).line())
