"""A line across the chat for loading progress or an error."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QToolButton


class Banner(QFrame):
    def __init__(self, object_name: str, closable: bool, parent=None):
        """``closable``: its button dismisses it (an error); otherwise the
        button is Cancel and the owner connects ``button.clicked``."""
        super().__init__(parent)
        self.setObjectName(object_name)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bar = QProgressBar()
        self.bar.setFixedWidth(180)
        self.bar.setTextVisible(False)
        self.bar.hide()
        self.button = QToolButton()
        self.button.setText("Dismiss" if closable else "Cancel")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.button)
        if closable:
            self.button.clicked.connect(self.hide)
        self.hide()

    def show_message(self, text: str, fraction: float | None = None, progress: bool = False):
        self.label.setText(text)
        self.bar.setVisible(progress)
        if progress:
            if fraction is None:
                self.bar.setRange(0, 0)
            else:
                self.bar.setRange(0, 1000)
                self.bar.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.show()
