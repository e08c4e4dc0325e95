"""Live numbers for the reply in progress, and the strip that shows them.

Accepted tokens arrive in bursts (a step can add K+1 tokens at once), so the
speed shown is a rate over the last two seconds of engine time, not the
last step's; acceptance and tokens per step are cumulative for the reply.
"vs plain" compares with the last plain reply on the same pair (PlainSpeeds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QVBoxLayout, QWidget

from specchat.engine import modes
from specchat.engine.events import StepEvent
from specchat.store.summary import ReplySummary

MIN_BASE_TOKENS = 8  # a shorter plain reply says little about the pair's speed


@dataclass(frozen=True)
class GaugeValues:
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens_per_s: float = 0.0
    k: int = 0
    k_auto: bool = True  # K chosen per step by the policy (K auto), not fixed in the menu
    drafter: str | None = None
    mode: modes.Mode | None = None
    speedup: float | None = None  # vs the last plain reply on this pair
    live: bool = False

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


class PlainSpeeds:
    """The speed of the last plain reply on each pair: what "vs plain" divides by."""

    def __init__(self):
        self._tokens_per_s: dict[tuple, float] = {}

    def note(self, pair_key: tuple, summary: ReplySummary) -> None:
        if not modes.get(summary.mode).speculative and summary.new_tokens >= MIN_BASE_TOKENS:
            self._tokens_per_s[pair_key] = summary.tokens_per_s

    def get(self, pair_key: tuple) -> float | None:
        return self._tokens_per_s.get(pair_key)


class LiveStats:
    def __init__(self, mode: modes.Mode | None = None, window_s: float = 2.0,
                 fixed_k: int | None = None):
        """``fixed_k``: the request's K (None: adaptive), so the gauge can say
        which K it shows; an adaptive K may exceed the menu's fixed choices."""
        self.mode = mode
        self.fixed_k = fixed_k
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque([(0.0, 0)])  # (elapsed_s, total tokens)
        self.tokens = self.steps = self.drafted = self.accepted = 0
        self.k = 0
        self.drafter: str | None = None

    def add(self, ev: StepEvent) -> None:
        self.tokens = ev.total_tokens
        if not ev.token_ids:  # the end-of-reply text flush, not a verify step
            return
        self.steps += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        if ev.k:
            self.k = ev.k
        self.drafter = ev.drafter or self.drafter
        self._points.append((ev.elapsed_s, ev.total_tokens))
        cutoff = ev.elapsed_s - self.window_s
        while len(self._points) > 2 and self._points[1][0] <= cutoff:
            self._points.popleft()

    @property
    def tokens_per_s(self) -> float:
        (t0, n0), (t1, n1) = self._points[0], self._points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def values(self, speedup_base: float | None = None, live: bool = True) -> GaugeValues:
        tps = self.tokens_per_s
        speculative = self.mode is None or self.mode.speculative
        speedup = tps / speedup_base if speedup_base and speculative else None
        return GaugeValues(self.tokens, self.steps, self.drafted, self.accepted, tps, self.k,
                           self.fixed_k is None, self.drafter, self.mode, speedup, live)


class _Gauge(QWidget):
    def __init__(self, label: str, tooltip: str, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 2, 8, 2)
        lay.setSpacing(0)
        self.value = QLabel("–")
        self.value.setObjectName("GaugeValue")
        self.caption = QLabel(label)
        self.caption.setObjectName("GaugeLabel")
        lay.addWidget(self.value)
        lay.addWidget(self.caption)
        self.setToolTip(tooltip)


class GaugeStrip(QFrame):
    """Acceptance, speed, tokens per step, K and the speedup, side by side."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Gauges")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.setSpacing(4)
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
        self.mode = _Gauge("mode", "How this reply is decoded")
        lay.addWidget(self.acceptance)
        lay.addWidget(self.acceptance_bar, 0, Qt.AlignmentFlag.AlignVCenter)
        for g in (self.speed, self.per_step, self.k, self.speedup, self.mode):
            lay.addWidget(g)
        lay.addStretch(1)
        self.values = GaugeValues()
        self.show_values(GaugeValues())

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
        self.mode.value.setText(text)

    def clear(self) -> None:
        self.show_values(GaugeValues())

    def preview(self, mode: modes.Mode) -> None:
        """Before a reply, say how the next one will be decoded."""
        if not self.values.steps:
            self.mode.value.setText(mode.name)
