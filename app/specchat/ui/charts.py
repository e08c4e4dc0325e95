"""Pictures of the speed: tokens/s over a reply, acceptance by draft position.

The numbers come from the engine's StepEvents, turned into plain series by
stats.py (``SpeedTrace``, ``PositionTally``: no Qt, tested on their own);
the widgets here only draw what they are given, with pyqtgraph. Drawing is
throttled: a chart takes new data at every flush of the reply (about 30 a
second) but redraws at most every ``REDRAW_S``, so a long reply never costs
the window more than a few short redraws a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QVBoxLayout, QWidget

from specchat.ui import theme
from specchat.ui.stats import GaugeValues, PositionRate
from specchat.ui.widgets import hbox, label, vbox

REDRAW_S = 0.25


# -- widgets ------------------------------------------------------------------------


class _Chart(pg.PlotWidget):
    """A small, still plot (no mouse panning or menu) in the window's colours,
    redrawn at most every REDRAW_S: ``changed()`` asks for a redraw,
    ``redraw()`` does it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(90)
        self.setMouseEnabled(x=False, y=False)
        self.setMenuEnabled(False)
        self.hideButtons()
        self.getPlotItem().setContentsMargins(2, 2, 6, 2)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(int(REDRAW_S * 1000))
        self._timer.timeout.connect(self.redraw)
        self.redraws = 0  # for tests: work done
        self.restyle()
        self._ready = False  # set by the subclass once its items exist

    def changed(self, now: bool = False) -> None:
        if now:
            self._timer.stop()
            self.redraw()
        elif not self._timer.isActive():
            self._timer.start()

    @property
    def pending(self) -> bool:
        """Whether a redraw was asked for and waits on the timer (read-only:
        tests check that steps coming faster than REDRAW_S draw nothing yet)."""
        return self._timer.isActive()

    def redraw(self) -> None:
        self.redraws += 1
        self.draw()

    def draw(self) -> None:
        raise NotImplementedError

    def restyle(self) -> None:
        c = theme.current()
        self.colors = c
        self.setBackground(c.surface)
        for name in ("left", "bottom"):
            axis = self.getAxis(name)
            axis.enableAutoSIPrefix(False)  # "seconds", never "seconds (x0.001)"
            axis.setPen(pg.mkPen(c.border))
            axis.setTextPen(pg.mkPen(c.muted))

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.PaletteChange and self.__dict__.get("_ready"):
            self.restyle()
            self.changed()
        super().changeEvent(event)


class SpeedChart(_Chart):
    """Tokens/s over time, one line per series, and an optional dashed
    reference level (the last plain reply on this pair)."""

    def __init__(self, parent=None, legend: bool = False):
        super().__init__(parent)
        if legend:
            self.addLegend(offset=(-8, 4), labelTextColor=self.colors.muted)
        self.series: dict[str, Sequence[tuple[float, float]]] = {}
        self.reference: float | None = None
        self._lines: dict[str, pg.PlotDataItem] = {}
        self.getPlotItem().setClipToView(True)
        self.getPlotItem().setDownsampling(auto=True, mode="peak")
        self.setLabel("bottom", "seconds")
        self._ref = pg.InfiniteLine(angle=0, movable=False)
        self._ref.hide()
        self.addItem(self._ref)
        self._ref_label = pg.TextItem(anchor=(0, 1))
        self._ref_label.hide()
        self.addItem(self._ref_label)
        self._ready = True

    def set_series(self, name: str, points: Sequence[tuple[float, float]],
                   now: bool = False) -> None:
        self.series[name] = points
        self.changed(now)

    def set_reference(self, tokens_per_s: float | None) -> None:
        if tokens_per_s != self.reference:
            self.reference = tokens_per_s
            self.changed()

    def clear_series(self) -> None:
        self.series = {}
        self.reference = None
        self.changed(now=True)

    def _pen(self, name: str):
        c = self.colors
        return pg.mkPen(c.muted if name == "plain" else c.accent, width=2)

    def draw(self) -> None:
        for name in list(self._lines):
            if name not in self.series:
                self.removeItem(self._lines.pop(name))
        top = self.reference or 0.0
        for name, points in self.series.items():
            line = self._lines.get(name)
            if line is None:
                line = self._lines[name] = self.plot([], [], antialias=True, name=name)
            line.setPen(self._pen(name))
            line.setData([t for t, _ in points], [r for _, r in points])
            top = max(top, max((r for _, r in points), default=0.0))
        ref = self.reference
        self._ref.setVisible(bool(ref))
        self._ref_label.setVisible(bool(ref))
        if ref:
            self._ref.setPen(pg.mkPen(self.colors.muted, width=1, style=Qt.PenStyle.DashLine))
            self._ref.setValue(ref)
            self._ref_label.setText(f"plain {ref:.1f}", color=self.colors.muted)
            self._ref_label.setPos(0, ref)
        self.setYRange(0, max(1.0, top * 1.15), padding=0)


class AcceptanceChart(_Chart):
    """One bar per draft position: how often a token drafted there was kept."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rates: tuple[PositionRate, ...] = ()
        self.setLabel("bottom", "draft position")
        self._bars = pg.BarGraphItem(x=[], height=[], width=0.7)
        self.addItem(self._bars)
        self.setYRange(0, 100, padding=0)
        self.getAxis("left").setTicks([[(0, "0%"), (50, "50%"), (100, "100%")]])
        self._ready = True

    def set_rates(self, rates: tuple[PositionRate, ...], now: bool = False) -> None:
        if rates != self.rates:
            self.rates = rates
            self.changed(now)

    def draw(self) -> None:
        c = self.colors
        fill = QColor(c.accent)
        fill.setAlpha(200)
        xs = [r.position for r in self.rates]
        self._bars.setOpts(x=xs, height=[100 * r.rate for r in self.rates], width=0.7,
                           brush=fill, pen=pg.mkPen(c.accent))
        last = max(4, max(xs, default=1))
        self.setXRange(0.4, last + 0.6, padding=0)
        every = 1 if last <= 10 else 2 if last <= 20 else 5
        self.getAxis("bottom").setTicks([[(x, str(x)) for x in range(1, last + 1)
                                          if x == 1 or x % every == 0]])


class ChartsPanel(QWidget):
    """The two charts under the gauges: the reply's speed (with the last
    plain reply on this pair as a dashed line) and acceptance by position."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Charts")
        self.speed = SpeedChart()
        self.acceptance = AcceptanceChart()
        self.speed.setToolTip("Tokens per second over this reply (the last 2 seconds at each "
                              "step); the dashed line is the last plain reply on this pair")
        self.acceptance.setToolTip(
            "How often a token drafted at each position of a step was kept. The first "
            "positions are kept most; where the bars get low, drafting more tokens stops "
            "paying, which is why K auto stops there")
        def captioned(title: str, chart: QWidget) -> QVBoxLayout:
            return vbox(label(title, name="GaugeLabel"), (chart, 1), spacing=0)

        hbox((captioned("tokens/s over this reply", self.speed), 3),
             (captioned("acceptance by draft position", self.acceptance), 2),
             parent=self, margins=(8, 0, 8, 4), spacing=8)
        self.setFixedHeight(130)

    def show_values(self, v: GaugeValues) -> None:
        now = not v.live  # the reply's end: draw its last state at once
        self.speed.set_reference(v.plain_tokens_per_s)
        self.speed.set_series("reply", v.speed_points, now)
        self.acceptance.set_rates(v.positions, now)

    def clear(self) -> None:
        self.speed.clear_series()
        self.acceptance.set_rates((), now=True)
