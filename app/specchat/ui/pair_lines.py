"""The two lines under the pair picker's boxes: the pair's verdict, and
"Find the best draft"'s progress and outcome, with what they say.

The verdict is one short line ("✓ compatible · draft 2.8× smaller"); the
full reasoning is its tooltip, and a click unfolds it under the line. A
refusal keeps its reason in that line, cut to the width with "…". The
search's line is a progress bar and Cancel while it runs, then its outcome
in one line, every draft's numbers and every refusal in its tooltip.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QProgressBar, QSizePolicy, QWidget

from specchat.errors import SpecChatError
from specchat.ui.library_view import NO_DRAFT, Verdict
from specchat.ui.widgets import ElidedLabel, button, hbox

if TYPE_CHECKING:
    from specchat.library import recommendations as rec
    from specchat.ui.draft_finder import DraftFinder

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
    if reasons and reasons[0] == NO_DRAFT:
        return "✓ " + NO_DRAFT[:1].lower() + NO_DRAFT[1:-1]
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

    def show_verdict(self, headline: str, details: str = "", ok: str | None = None) -> None:
        """``ok``: "true", "false", "unknown" or "" (no verdict), which the
        style sheet colours by; None leaves it as it is."""
        self._details = details
        self.expanded = False
        self.setToolTip(f"{details}\n\n(click to show it here)" if details else "")
        self.set_full(headline)
        if ok is not None:
            self.setProperty("ok", ok)
            self.style().unpolish(self)
            self.style().polish(self)

    def set_verdict(self, verdict: Verdict) -> None:
        """The pair's verdict: a headline, the reasoning under it, coloured by it."""
        self.show_verdict(verdict_headline(verdict), verdict_details(verdict),
                          {True: "true", False: "false", None: "unknown"}[verdict.compatible])

    def set_refusal(self, message: str) -> None:
        """The engine refused to load the pair: why, in the same place."""
        self.show_verdict(REFUSED + " ".join(message.split()), message, "false")

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
    """The search's line under the verdict, a view over the DraftFinder: a
    progress bar and Cancel while it runs, then its outcome in one line
    (everything in the tooltip)."""

    def __init__(self, finder: DraftFinder, parent=None):
        super().__init__(parent)
        self.finder = finder
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        self.status = VerdictLabel()  # one line cut with "…"; the rest on hover or a click
        self.status.setObjectName("FinderStatus")
        self.cancel_button = button("Cancel", "Stop measuring; drafts measured so far are kept",
                                    clicked=self.cancel)
        hbox((self.status, 3), (self.bar, 2), self.cancel_button, parent=self, margins=0)
        self.hide()
        finder.progressed.connect(self._progressed)  # bound methods: dropped with the strip
        finder.finished.connect(self._finished)
        finder.failed.connect(self._failed)

    def start(self, target: str) -> None:
        """Measure the installed drafts for ``target``, or say why not now."""
        try:
            self.finder.start(target)
        except SpecChatError as exc:
            self.done(str(exc))
            return
        self.running("Checking which drafts fit…", 0.0)

    def cancel(self) -> None:
        if self.finder.running:
            self.finder.cancel()
            self.cancelling()

    def _progressed(self, message: str, fraction: float) -> None:
        self.running(message, fraction)
        if self.finder.cancelling:
            self.cancelling()

    def _finished(self, outcome: rec.Recommendation) -> None:
        self.done(*outcome_text(outcome))

    def _failed(self, message: str) -> None:
        self.done("✗ " + " ".join(message.split()), message)

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

