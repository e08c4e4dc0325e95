"""The numbers behind the gauges and the charts, from the engine's step
events: plain values and tallies, no Qt.

Why a module of their own: the gauge strip (gauges.py) and the charts
(charts.py) both show them, and Compare (compare.py) and a reply
(reply.py) make them; kept here, each of those imports them and none
imports another for them. Accepted tokens arrive in bursts (a step can add
K+1 tokens at once), so a speed is a rate over the last seconds of engine
time, not the last step's; acceptance and tokens per step are cumulative
for the reply; "vs plain" compares with the last plain reply on the same
pair (PlainSpeeds).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from specchat.engine import modes
from specchat.engine.events import StepEvent
from specchat.engine.part_stats import PartCounter
from specchat.store.summary import PartNumbers, ReplySummary

SPEED_WINDOW_S = 2.0  # the gauge's window and the chart's: the number and the line agree
MIN_BASE_TOKENS = 8  # a shorter plain reply says little about the pair's speed


class SpeedTrace:
    """Tokens/s over a reply, one point per verify step: the rate over the
    last ``window_s`` seconds of engine time (a step can add K+1 tokens at
    once, so a per-step rate would jump about)."""

    def __init__(self, window_s: float = SPEED_WINDOW_S):
        self.window_s = window_s
        self._window: deque[tuple[float, int]] = deque([(0.0, 0)])  # (elapsed_s, total tokens)
        self.points: list[tuple[float, float]] = []  # (elapsed_s, tokens/s)

    def add(self, elapsed_s: float, total_tokens: int) -> None:
        self._window.append((elapsed_s, total_tokens))
        cutoff = elapsed_s - self.window_s
        while len(self._window) > 2 and self._window[1][0] <= cutoff:
            self._window.popleft()
        self.points.append((elapsed_s, self.rate))

    @property
    def rate(self) -> float:
        (t0, n0), (t1, n1) = self._window[0], self._window[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass(frozen=True)
class PositionRate:
    position: int  # 1 = the first drafted token of a step
    drafted: int  # steps that drafted this position
    accepted: int  # ... and had it accepted
    rejected: int  # ... and had it rejected (the first rejection of the step)

    @property
    def rate(self) -> float:
        """How often a drafted token at this position was kept."""
        return self.accepted / self.drafted if self.drafted else 0.0


class PositionTally:
    """Acceptance by draft position. A step that drafted k tokens and had n
    accepted kept positions 1..n, rejected position n+1 and never reached
    the ones after it; so position i's rate is the chance that a block gets
    at least i tokens in, which is what decides whether drafting i tokens
    pays (why K is what it is)."""

    def __init__(self):
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.rejected: list[int] = []

    def add(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        grow = drafted - len(self.drafted)
        if grow > 0:
            for counts in (self.drafted, self.accepted, self.rejected):
                counts.extend([0] * grow)
        for i in range(drafted):
            self.drafted[i] += 1
        for i in range(min(accepted, drafted)):
            self.accepted[i] += 1
        if accepted < drafted:
            self.rejected[accepted] += 1

    def rates(self) -> tuple[PositionRate, ...]:
        return tuple(PositionRate(i + 1, d, a, r) for i, (d, a, r)
                     in enumerate(zip(self.drafted, self.accepted, self.rejected, strict=True)))


def acceptance_by_position(steps: Iterable[tuple[int, int]]) -> tuple[PositionRate, ...]:
    """``PositionTally`` over (drafted, accepted) per step, at once."""
    tally = PositionTally()
    for drafted, accepted in steps:
        tally.add(drafted, accepted)
    return tally.rates()


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
    by_origin: tuple[tuple[str, int], ...] = ()  # tokens per origin ("target", "draft", ...)
    plain_tokens_per_s: float | None = None  # the last plain reply on this pair
    speed_points: tuple[tuple[float, float], ...] = ()  # (elapsed s, tokens/s) per step
    positions: tuple[PositionRate, ...] = ()  # acceptance by draft position
    paused: bool = False  # auto-off is decoding plainly: speculating was slower here
    # Each part of the reply (reasoning, answer, tool calls) so far, counted
    # by the engine's rule (engine/part_stats.py)
    by_part: tuple[tuple[str, PartNumbers], ...] = ()

    @property
    def parts(self) -> dict[str, PartNumbers]:
        return dict(self.by_part)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def origins(self) -> dict[str, int]:
        return dict(self.by_origin)


class PlainSpeeds:
    """The speed of the last plain reply on each pair: what "vs plain" divides by."""

    def __init__(self):
        self._tokens_per_s: dict[tuple, float] = {}

    def note(self, pair_key: tuple, summary: ReplySummary) -> None:
        if not modes.get(summary.mode).speculative and summary.new_tokens >= MIN_BASE_TOKENS:
            self._tokens_per_s[pair_key] = summary.tokens_per_s

    def get(self, pair_key: tuple) -> float | None:
        return self._tokens_per_s.get(pair_key)


def part_numbers(counter: PartCounter) -> dict[str, PartNumbers]:
    """What a reply's events counted per part so far, as a saved summary
    has it (engine/part_stats.py counts; the history reads PartNumbers)."""
    return {p: PartNumbers(**n) for p, n in counter.record().items()}


class LiveStats:
    def __init__(self, mode: modes.Mode | None = None, window_s: float = SPEED_WINDOW_S,
                 fixed_k: int | None = None):
        """``fixed_k``: the request's K (None: adaptive), so the gauge can say
        which K it shows; an adaptive K may exceed the menu's fixed choices."""
        self.mode = mode
        self.fixed_k = fixed_k
        self.speed = SpeedTrace(window_s)
        self.position_tally = PositionTally()
        self.by_origin: Counter[str] = Counter()
        self.tokens = self.steps = self.drafted = self.accepted = 0
        self.k = 0
        self.drafter: str | None = None
        self.paused = False
        self.by_part = PartCounter()

    def add(self, ev: StepEvent) -> None:
        self.by_part.add(ev)
        self.tokens = ev.total_tokens
        if not ev.token_ids:  # the end-of-reply text flush, not a verify step
            return
        self.steps += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        if ev.k:
            self.k = ev.k
        self.drafter = ev.drafter or self.drafter
        # A probe is a step of the pause (it ends it only if the next step speculates).
        self.paused = ev.paused or ev.probe
        self.speed.add(ev.elapsed_s, ev.total_tokens)
        self.position_tally.add(ev.drafted, ev.accepted)
        self.by_origin = Counter(dict(ev.origin_totals))  # counted once, in the engine

    @property
    def tokens_per_s(self) -> float:
        return self.speed.rate

    def part_numbers(self) -> dict[str, PartNumbers]:
        """Each part's numbers so far, as a saved summary has them."""
        return part_numbers(self.by_part)

    def values(self, speedup_base: float | None = None, live: bool = True) -> GaugeValues:
        tps = self.tokens_per_s
        speculative = self.mode is None or self.mode.speculative
        speedup = tps / speedup_base if speedup_base and speculative else None
        return GaugeValues(self.tokens, self.steps, self.drafted, self.accepted, tps, self.k,
                           self.fixed_k is None, self.drafter, self.mode, speedup, live,
                           tuple(sorted(self.by_origin.items())), speedup_base,
                           tuple(self.speed.points), self.position_tally.rates(),
                           self.paused, tuple(self.part_numbers().items()))
