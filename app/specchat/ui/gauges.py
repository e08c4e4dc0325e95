"""The strip of live numbers for the reply in progress (made by
stats.py's LiveStats from the engine's steps).

"from" says where the reply's tokens came from (the draft model, this
conversation, the user's history; the rest is the target's own), in the
Colour-tokens colours. For a reply that reasons, a line under them says
how its thinking and its answer were decoded apart (tokens, speed,
acceptance, sources). Under the numbers, the charts (ui/charts.py) draw
the speed over the reply and the acceptance by draft position.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QFrame,
    QProgressBar,
    QToolButton,
    QWidget,
)

from specchat import origins
from specchat.engine import modes
from specchat.store.summary import REASONING, origin_shares, parts_text, shares_text
from specchat.ui import theme, widgets
from specchat.ui.charts import ChartsPanel
from specchat.ui.stats import GaugeValues

# The mode label while break-even auto-off decodes plainly (engine/auto_off.py).
PAUSED_TEXT = "speculation paused: slower than plain here"
PAUSED_TIP = ("Speculating was measured slower than plain decoding on this machine just now, "
              "so this reply decodes plainly and tries speculation again now and then "
              "(Settings: speculation auto-off). Only the speed changes: at temperature 0 "
              "the reply is token for token the same.")
MODE_TIP = "How this reply is decoded"


class _Gauge(QWidget):
    def __init__(self, label: str, tooltip: str, parent=None):
        super().__init__(parent)
        self.value = widgets.label("–", name="GaugeValue")
        self.caption = widgets.label(label, name="GaugeLabel")
        widgets.vbox(self.value, self.caption, parent=self, margins=(8, 2, 8, 2), spacing=0)
        self.setToolTip(tooltip)


class SourceBar(QWidget):
    """A thin stacked bar: the share of the reply's tokens from each source,
    in the Colour-tokens tints (the target's own share in the border colour)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFixedSize(120, 8)
        self.counts: dict[str, int] = {}

    def set_counts(self, counts: dict[str, int]) -> None:
        if counts != self.counts:
            self.counts = counts
            self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        c = theme.current()
        p = QPainter(self)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(c.border)
        p.drawRect(self.rect())
        x = 0.0
        for origin, share in origin_shares(self.counts):
            w = share * self.width()
            p.setBrush(theme.origin_color(c, origin))
            p.drawRect(QRectF(x, 0, w, self.height()))
            x += w
        p.end()


class _ElidedLabel(widgets.ElidedLabel):
    """A share line that asks for its whole width and takes what it is given."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(60, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(self.fontMetrics().horizontalAdvance(self.full) + 4,
                     super().sizeHint().height())


class _SourcesGauge(QWidget):
    """Where the reply's tokens came from: the bar, and the shares in words."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.bar = SourceBar()
        self.value = _ElidedLabel("–")
        self.value.setObjectName("GaugeLabel")
        widgets.vbox(self.bar, self.value, parent=self, margins=(8, 4, 8, 2), spacing=3)
        self.setToolTip("Where this reply's tokens came from: the draft model, this "
                        "conversation or your history (the rest the target wrote itself); "
                        "the colours are Colour tokens'")

    def show_counts(self, counts: dict[str, int]) -> None:
        self.bar.set_counts(counts)
        self.value.set_full(shares_text(counts) or "from the target only" if counts else "–")
        total = sum(counts.values())
        if total:
            self.setToolTip("\n".join(f"{origins.get(o).label}: {n} tokens ({n / total:.0%})"
                                      for o, n in sorted(counts.items(), key=lambda x: -x[1])))


class GaugeStrip(QFrame):
    """Acceptance, speed, tokens per step, K, the speedup and where the tokens
    came from, side by side; the charts under them (hidden with "Charts")."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Gauges")
        lay = widgets.hbox(margins=(8, 4, 8, 4), spacing=4)
        self.acceptance = _Gauge("acceptance", "Share of drafted tokens the target accepted")
        self.acceptance_bar = QProgressBar()
        self.acceptance_bar.setRange(0, 100)
        self.acceptance_bar.setTextVisible(False)
        self.acceptance_bar.setFixedWidth(70)
        self.acceptance_bar.setFixedHeight(6)
        self.speed = _Gauge("tokens/s", "Generation speed over the last 2 seconds")
        self.per_step = _Gauge("tokens/step",
                               "Tokens kept per target forward pass (1.0 = plain decoding)")
        self.k = _Gauge("draft length K", "Tokens drafted in the last step: \"(auto)\" when "
                        "K auto chooses it each step, else the K fixed in the menu")
        self.speedup = _Gauge("vs plain", "Speed compared with the last plain reply on this pair")
        self.mode = _Gauge("mode", MODE_TIP)
        self.sources = _SourcesGauge()
        # A reply that reasons: its reasoning's and its answer's numbers, on a
        # line of their own under the gauges (the summary's second line, live).
        self.parts = _ElidedLabel("")
        self.parts.setObjectName("GaugeLabel")
        self.parts.setToolTip("How each part of the reply was decoded: its tokens, tokens/s, "
                              "the share of its drafted tokens accepted, where they came from")
        self.parts.hide()
        self.charts_button = QToolButton()
        self.charts_button.setText("Charts")
        self.charts_button.setCheckable(True)
        self.charts_button.setChecked(True)
        self.charts_button.setToolTip("Show or hide the speed and acceptance charts")
        lay.addWidget(self.acceptance)
        lay.addWidget(self.acceptance_bar, 0, Qt.AlignmentFlag.AlignVCenter)
        for g in (self.speed, self.per_step, self.k, self.speedup, self.mode):
            lay.addWidget(g)
        lay.addWidget(self.sources, 1, Qt.AlignmentFlag.AlignVCenter)  # the room left over
        lay.addWidget(self.charts_button, 0, Qt.AlignmentFlag.AlignVCenter)
        self.charts = ChartsPanel()
        parts_row = widgets.hbox(self.parts, margins=(16, 0, 16, 2))
        widgets.vbox(lay, parts_row, self.charts, parent=self, margins=0, spacing=0)
        self.charts_button.toggled.connect(self.show_charts)
        self.values = GaugeValues()
        self.show_values(GaugeValues())

    def show_charts(self, on: bool) -> None:
        self.charts_button.setChecked(on)
        self.charts.setVisible(on)
        if on:
            self.charts.show_values(self.values)

    def show_values(self, v: GaugeValues) -> None:
        self.values = v
        acc = v.acceptance
        self.acceptance.value.setText("–" if acc is None else f"{acc:.0%}")
        self.acceptance_bar.setValue(0 if acc is None else round(acc * 100))
        self.speed.value.setText(f"{v.tokens_per_s:.1f}" if v.steps else "–")
        self.per_step.value.setText(f"{v.tokens_per_step:.2f}" if v.steps else "–")
        self.k.value.setText("–" if not v.k else f"{v.k} (auto)" if v.k_auto else str(v.k))
        self.speedup.value.setText(f"×{v.speedup:.2f}" if v.speedup else "–")
        text = v.mode.name if v.mode else "–"
        if v.drafter and v.mode and len(v.mode.drafters) > 1:  # say which one drafted last
            text = f"{v.mode.name} ({v.drafter})"
        if v.paused:
            text = PAUSED_TEXT
        self.mode.value.setText(text)
        self.mode.setToolTip(PAUSED_TIP if v.paused else MODE_TIP)
        self.sources.show_counts(v.origins)
        parts = v.parts
        self.parts.set_full(parts_text(parts) if REASONING in parts else "")
        self.parts.setVisible(REASONING in parts)
        if self.charts.isVisibleTo(self):  # hidden charts cost nothing
            self.charts.show_values(v)

    def clear(self) -> None:
        self.show_values(GaugeValues())
        self.charts.clear()

    def preview(self, mode: modes.Mode) -> None:
        """Before a reply, say how the next one will be decoded."""
        if not self.values.steps:
            self.mode.value.setText(mode.name)
