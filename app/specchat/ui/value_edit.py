"""A text field for one of ``specchat.values``' numbers.

A spin box cannot say why it refuses a keystroke, and its 32-bit range
cannot hold every seed a person may type; this field takes any text, checks
it with ``values.check`` on every edit and offers the same one line the CLI
and the engine give ("temperature must be a number from 0 to 5 ...; got
nan"), which the settings dialog shows under the form.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLineEdit

from specchat import values


class ValueEdit(QLineEdit):
    valueChanged = Signal()  # the text changed (to a valid value or not)

    def __init__(self, name: str, blank: str = "", parent=None):
        """``name``: a key of ``values.LIMITS``; ``blank``: what an empty
        field means, for optional values ("random" for the seed)."""
        super().__init__(parent)
        self.name = name
        self.limit = values.LIMITS[name]
        self.setToolTip(self.limit.describe())
        if blank:
            self.setPlaceholderText(blank)
        self.textChanged.connect(self._edited)

    def value(self) -> int | float | None:
        """The checked value; ``values.BadValue`` if the text is not one."""
        return values.check(self.name, self.text())

    def problem(self) -> str:
        """The one line that says what is wrong, or "" when the value is good."""
        try:
            self.value()
        except values.BadValue as exc:
            return str(exc)
        return ""

    def setValue(self, value: int | float | None) -> None:  # noqa: N802 - spin-box name
        self.setText("" if value is None else f"{value:g}" if isinstance(value, float)
                     else str(value))

    def _edited(self, _text: str) -> None:
        bad = bool(self.problem())
        if self.property("invalid") != bad:
            self.setProperty("invalid", bad)
            self.style().unpolish(self)
            self.style().polish(self)
        self.valueChanged.emit()
