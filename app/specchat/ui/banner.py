"""A line across the chat for loading progress or an error."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QProgressBar, QToolButton

from specchat.ui.widgets import hbox, label


class Banner(QFrame):
    def __init__(self, object_name: str, closable: bool, parent=None):
        """``closable``: its button dismisses it (an error); otherwise the
        button is Cancel and the owner connects ``button.clicked``."""
        super().__init__(parent)
        self.setObjectName(object_name)
        self.label = label(wrap=True, selectable=True)
        self.bar = QProgressBar()
        self.bar.setFixedWidth(180)
        self.bar.setTextVisible(False)
        self.bar.hide()
        self.button = QToolButton()
        self.button.setText("Dismiss" if closable else "Cancel")
        hbox((self.label, 1), self.bar, self.button, parent=self, margins=(10, 4, 6, 4))
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
