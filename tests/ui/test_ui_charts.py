"""Pictures of the speed and words for it: the charts' numbers from real
step events, the share of tokens from each source (gauges and the saved
summary line), the charts in the real window and in Compare, and the words
Compare says when speculation is slower than plain."""

from __future__ import annotations

from collections import Counter

import pyqtgraph as pg
import pytest
from specchat.engine import modes
from specchat.engine.events import StepEvent, Summary
from specchat.store.summary import ReplySummary, origin_shares, shares_text
from specchat.ui.charts import ChartsPanel
from specchat.ui.compare import speed_explanation
from specchat.ui.gauges import GaugeStrip
from specchat.ui.stats import LiveStats, PositionTally, SpeedTrace, acceptance_by_position
from ui_support import load, run_compare, send_and_wait


def _step(i, n_tokens, drafted, accepted, elapsed, total, origins=None, before=None):
    """A step event as the engine makes it; ``before``: the origins of the
    reply's earlier steps, for the running totals the engine reports."""
    origins = origins or ("draft",) * (n_tokens - 1) + ("target",)
    totals = Counter(before or ()) + Counter(origins)
    return StepEvent(i, tuple(range(n_tokens)), "x" * n_tokens, origins, drafted, accepted,
                     drafted, "draft" if drafted else None, 0.05, elapsed, total,
                     ("x",) * n_tokens, origin_totals=tuple(totals.items()))


# -- view models -------------------------------------------------------------------


def test_no_ui_module_imports_one_that_imports_it_back():
    """The gauges and the charts show the same numbers; those live in
    stats.py, which both import, instead of the charts importing the gauges
    (for their type) while the gauges imported the charts. Every import
    counts, those for type checking too: a cycle is a cycle to a reader."""
    import ast
    from pathlib import Path

    import specchat.ui

    folder = Path(specchat.ui.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specchat.ui."):
                deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.ImportFrom) and node.module == "specchat.ui":
                deps |= {a.name for a in node.names}
        graph[path.stem] = deps

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d}))
                   for d in graph.get(start, ()))

    assert [m for m in sorted(graph) if reaches(m, m, {m})] == []


def test_acceptance_by_position_counts_what_each_step_kept():
    # drafted=k, accepted=n: positions 1..n kept, n+1 rejected, the rest never reached.
    rates = acceptance_by_position([(4, 2), (4, 4), (3, 0), (0, 0), (2, 1)])
    assert [(r.position, r.drafted, r.accepted, r.rejected) for r in rates] == [
        (1, 4, 3, 1),  # rejected by the (3, 0) step
        (2, 4, 2, 1),  # kept by (4, 2) and (4, 4); rejected by (2, 1)
        (3, 3, 1, 1),  # the (4, 2) step's first rejection
        (4, 2, 1, 0),
    ]
    assert [round(r.rate, 2) for r in rates] == [0.75, 0.5, 0.33, 0.5]
    tally = PositionTally()
    tally.add(2, 2)
    tally.add(5, 1)  # grows to the longest block seen
    assert [r.drafted for r in tally.rates()] == [2, 2, 1, 1, 1]


def test_speed_trace_is_the_rate_over_the_last_two_seconds():
    trace = SpeedTrace(window_s=2.0)
    for i in range(1, 11):  # 10 tokens a second, in steps of 0.5 s
        trace.add(0.5 * i, 5 * i)
    assert [t for t, _ in trace.points] == [0.5 * i for i in range(1, 11)]
    assert trace.points[-1][1] == pytest.approx(10.0)
    trace.add(5.5, 50)  # a stall: the rate falls over the window, not to zero at once
    assert 0 < trace.rate < 10


def test_live_stats_carry_the_sources_the_chart_points_and_the_plain_reference():
    live = LiveStats(modes.for_pair(True, has_draft=True))
    live.add(_step(0, 3, 3, 2, 0.5, 3, ("draft", "conversation", "target")))
    live.add(_step(1, 4, 4, 3, 1.0, 7, ("history", "history", "draft", "target"),
                   before=("draft", "conversation", "target")))
    live.add(StepEvent(2, (), "tail", (), 0, 0, 0, None, 0.0, 1.1, 7))  # the text flush
    v = live.values(speedup_base=5.0)
    assert v.origins == {"draft": 2, "conversation": 1, "history": 2, "target": 2}
    assert [(r.position, r.accepted) for r in v.positions] == [(1, 2), (2, 2), (3, 1), (4, 0)]
    assert len(v.speed_points) == 2 and v.plain_tokens_per_s == 5.0
    assert v.speedup == pytest.approx(7.0 / 5.0)


def _sources_gauge(qtbot, origins: tuple[str, ...]) -> GaugeStrip:
    """The gauge strip after one step whose tokens came from ``origins``."""
    strip = GaugeStrip()
    qtbot.addWidget(strip)
    live = LiveStats(modes.for_pair(True, has_draft=True))
    live.add(_step(0, len(origins), len(origins), len(origins) - 1, 0.5, len(origins), origins))
    strip.show_values(live.values())
    return strip


@pytest.mark.parametrize("counts, shown, origins, gauge, tip", [
    ({"target": 28, "draft": 41, "conversation": 22, "history": 9},
     "draft 41% · conversation 22% · history 9%",
     ("draft", "history", "history", "target"), "draft 25% · history 50%",
     "your history: 2 tokens (50%)"),
    # An EAGLE-3 head's tokens are the head's, by name.
    ({"target": 6, "head": 3, "conversation": 1}, "conversation 10% · head 30%",
     ("head", "head", "head", "target"), "head 75%", "a draft head (EAGLE-3): 3 tokens (75%)"),
])
def test_shares_in_the_gauges_and_the_summary_line(qtbot, counts, shown, origins, gauge, tip):
    assert shares_text(counts) == shown
    assert shares_text({"target": 5}) == ""
    assert origin_shares({"target": 1, "lookup": 1}) == [("lookup", 0.5)]  # unknown: its name

    s = ReplySummary(mode="hybrid", new_tokens=100, drafted=80, accepted=72,
                     acceptance_rate=0.9, tokens_per_step=3.2, tokens_per_s=40.0, ttft_s=0.1,
                     tokens_by_origin=counts)
    assert f"acceptance 90% · 3.20 tokens/step · {shown}" in s.line()
    assert "%" not in ReplySummary(mode="plain", new_tokens=9, tokens_by_origin={"target": 9}
                                   ).line()

    strip = _sources_gauge(qtbot, origins)
    assert strip.sources.value.text() == gauge
    assert strip.sources.bar.counts == dict(Counter(origins))
    assert tip in strip.sources.toolTip()


def _lines(chart) -> dict:
    """The lines a chart has drawn, by name, as pyqtgraph holds them."""
    return {item.name(): item for item in chart.listDataItems()}


def _item(chart, kind: type):
    """A chart's one item of a pyqtgraph type (its reference line, its bars)."""
    [item] = [i for i in chart.getPlotItem().items if isinstance(i, kind)]
    return item


def test_charts_redraw_a_few_times_a_second_however_often_steps_come(qtbot):
    panel = ChartsPanel()
    qtbot.addWidget(panel)
    panel.show()
    live = LiveStats(modes.for_pair(True, has_draft=True))
    before = panel.speed.redraws
    for i in range(200):  # 200 flushes at once: far more than the charts draw
        live.add(_step(i, 3, 3, 2, 0.02 * (i + 1), 3 * (i + 1)))
        panel.show_values(live.values(speedup_base=40.0))
    # Nothing is drawn per flush: one redraw waits on the timer (fired here
    # by hand, so the count does not depend on how fast this machine is).
    assert panel.speed.pending
    assert panel.speed.redraws - before <= 1
    for chart in (panel.speed, panel.acceptance):
        chart.changed(now=True)
    assert panel.speed.redraws - before in (1, 2)
    drawn = panel.speed.redraws
    xs, ys = _lines(panel.speed)["reply"].getData()
    assert len(xs) == 200 and ys[-1] == pytest.approx(live.tokens_per_s)
    ref = _item(panel.speed, pg.InfiniteLine)
    assert ref.isVisible() and ref.value() == 40.0
    heights = _item(panel.acceptance, pg.BarGraphItem).opts["height"]
    assert list(heights) == pytest.approx([100.0, 100.0, 0.0])
    panel.show_values(live.values(live=False))  # the reply ended: drawn at once
    assert panel.speed.redraws == drawn + 1
    panel.clear()
    assert _lines(panel.speed) == {} and panel.acceptance.rates == ()


# -- words for the speedup -----------------------------------------------------------


def _summary(mode, new_tokens, steps, tokens_per_s, drafted=0, accepted=0):
    return Summary(mode=mode, finish_reason="length", new_tokens=new_tokens, steps=steps,
                   drafted=drafted, accepted=accepted,
                   acceptance_rate=accepted / drafted if drafted else 0.0,
                   tokens_per_step=new_tokens / steps, tokens_per_s=tokens_per_s, ttft_s=0.1,
                   wall_s=new_tokens / max(tokens_per_s, 1e-9) + 0.1, prompt_tokens=20,
                   reused_prompt_tokens=0, prefill_s=0.1, forward_s=1.0, overhead_s=0.0)


def test_slower_than_plain_is_said_in_words_from_the_measured_costs():
    plain = _summary("plain", 128, 128, 50.0)  # 20 ms a token
    # 85% acceptance, 2.5 tokens a step, yet 34 tok/s: each step took ~74 ms.
    spec = _summary("hybrid", 128, 51, 34.0, drafted=100, accepted=85)
    words = speed_explanation(plain, spec)
    assert words.startswith("The draft costs more than it saves here: each speculative step "
                            "took 74 ms for 2.51 tokens (29 ms a token) vs 20 ms per plain "
                            "token. A step would have to take under 50 ms to break even;")
    assert "acceptance was high (85%)" in words
    low = speed_explanation(plain, _summary("hybrid", 128, 100, 40.0, drafted=300,
                                            accepted=28))
    assert "only 9% of drafted tokens were accepted" in low
    fast = speed_explanation(plain, _summary("hybrid", 128, 40, 90.0, drafted=120,
                                             accepted=88))
    assert fast.startswith("Speculation pays here: each speculative step took 36 ms for 3.20 "
                           "tokens (11 ms a token) vs 20 ms per plain token")
    assert speed_explanation(plain, _summary("lookup", 10, 10, 49.5)).startswith(
        "Nothing was drafted")
    assert speed_explanation(_summary("plain", 1, 1, 0.0), spec) == ""


# -- in the real window ----------------------------------------------------------------


def test_the_window_draws_the_reply_speed_and_acceptance(qtbot, window, tiny_target,
                                                         tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=64, speculative=False)
    send_and_wait(qtbot, window)  # a plain reply: the reference for the next one
    window.session.update_settings(speculative=True)
    msg = send_and_wait(qtbot, window, "def fibonacci(n): def fibonacci(n):")
    charts = window.gauges.charts
    assert charts.isVisible()
    xs, ys = _lines(charts.speed)["reply"].getData()
    assert len(xs) == window.gauges.values.steps and max(ys) > 0
    plain = window.session.plain_speeds.get(window.session.engine.pair_key)
    assert plain and _item(charts.speed, pg.InfiniteLine).value() == pytest.approx(plain)
    assert charts.acceptance.rates and charts.acceptance.rates[0].drafted > 0
    assert window.gauges.sources.value.text() != "–"
    assert "%" in msg.summary.line()  # the saved line says where the tokens came from
    window.gauges.charts_button.click()  # hidden: and no longer drawn
    assert not charts.isVisible()


def test_compare_draws_both_speeds_and_explains_the_speedup(qtbot, window, tiny_target,
                                                            tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=64)
    dlg = run_compare(qtbot, window)
    o = dlg.outcome
    lines = _lines(dlg.chart)
    assert set(lines) == {"plain", "speculative"}
    assert len(lines["plain"].getData()[0]) == o.plain.summary.steps
    assert len(lines["speculative"].getData()[0]) == o.speculative.summary.steps
    assert dlg.explanation.text() == speed_explanation(o.plain.summary, o.speculative.summary)
    assert "ms per plain token" in dlg.explanation.text()
