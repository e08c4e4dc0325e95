"""The few shapes every widget builds: a row or a column of children, a
button, a caption, a line cut to its width.

Why here: each widget laid its children out by hand (a line per
``addWidget``, one per margin) and made each button in three or four lines;
written once, a constructor keeps only what is particular to it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QBoxLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

# A widget or a layout, with its stretch as ``(item, stretch)``; a bare int is
# an empty stretch of that factor.
Item = QWidget | QLayout | int | tuple[QWidget | QLayout, int]
Margins = int | tuple[int, int, int, int] | None


def hbox(*items: Item, parent: QWidget | None = None, margins: Margins = None,
         spacing: int | None = None) -> QHBoxLayout:
    """``items`` side by side (the layout of ``parent`` when given)."""
    return _fill(QHBoxLayout, items, parent, margins, spacing)


def vbox(*items: Item, parent: QWidget | None = None, margins: Margins = None,
         spacing: int | None = None) -> QVBoxLayout:
    """``items`` one under the other (the layout of ``parent`` when given)."""
    return _fill(QVBoxLayout, items, parent, margins, spacing)


def _fill(kind: type[QBoxLayout], items: tuple[Item, ...], parent: QWidget | None,
          margins: Margins, spacing: int | None):
    lay = kind(parent) if parent is not None else kind()
    if margins is not None:
        lay.setContentsMargins(*((margins,) * 4 if isinstance(margins, int) else margins))
    if spacing is not None:
        lay.setSpacing(spacing)
    for item in items:
        item, stretch = item if isinstance(item, tuple) else (item, 0)
        if isinstance(item, int):
            lay.addStretch(item)
        elif isinstance(item, QLayout):
            lay.addLayout(item, stretch)
        else:
            lay.addWidget(item, stretch)
    return lay


def button(text: str, tip: str = "", *, name: str = "", shortcut: str = "",
           clicked: Callable | None = None) -> QPushButton:
    """A push button with its tooltip, style name and shortcut, each if given."""
    b = QPushButton(text)
    if name:
        b.setObjectName(name)
    if tip:
        b.setToolTip(tip)
    if shortcut:
        b.setShortcut(shortcut)
    if clicked is not None:
        b.clicked.connect(clicked)
    return b


def label(text: str = "", *, name: str = "", wrap: bool = False,
          selectable: bool = False) -> QLabel:
    """A label with its style name (the theme's "GaugeLabel", ...), wrapping
    and mouse selection, each if asked for."""
    lab = QLabel(text)
    if name:
        lab.setObjectName(name)
    if wrap:
        lab.setWordWrap(True)
    if selectable:
        lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return lab


class ElidedLabel(QLabel):
    """One line cut with "…" to the width it is given, so a long text never
    pushes its neighbours about; the whole text stays in ``full``."""

    def __init__(self, text: str = "", min_width: int = 20, parent: QWidget | None = None):
        super().__init__(parent)
        self.full = ""
        self.min_width = min_width  # the width it cuts to, however narrow it is
        self.set_full(text)

    def set_full(self, text: str) -> None:
        self.full = text
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.full, Qt.TextElideMode.ElideRight,
                                                   max(self.min_width, self.width())))
        self.updateGeometry()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._elide()
