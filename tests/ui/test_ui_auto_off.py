"""Break-even auto-off in the window: the mode gauge says when speculation is
paused, the saved summary counts paused steps, and the setting (on by
default) reaches the request."""

from __future__ import annotations

from dataclasses import asdict

from specchat.engine import modes
from specchat.engine.events import Message, StepEvent, Summary
from specchat.store.settings import AppSettings, from_stored
from specchat.ui.gauges import PAUSED_TEXT, GaugeStrip
from specchat.ui.requests import build_request, reply_summary
from specchat.ui.settings import SettingsDialog
from specchat.ui.stats import LiveStats


def _event(i: int, drafted: int = 0, accepted: int = 0, paused: bool = False,
           probe: bool = False) -> StepEvent:
    n = accepted + 1
    origins = ("draft",) * accepted + ("target",)
    return StepEvent(i, tuple(range(n)), "x" * n, origins, drafted, accepted, drafted,
                     "draft" if drafted else None, 0.05, 0.1 * (i + 1), i + n,
                     ("x",) * n, paused=paused, probe=probe)


def test_the_mode_label_says_when_speculation_is_paused(qtbot):
    mode = modes.get("draft")
    strip = GaugeStrip()
    qtbot.addWidget(strip)
    live = LiveStats(mode)

    def label_after(ev: StepEvent) -> str:
        live.add(ev)
        strip.show_values(live.values())
        return strip.mode.value.text()

    assert label_after(_event(0, drafted=3, accepted=1)) == mode.name
    assert label_after(_event(1, paused=True)) == PAUSED_TEXT
    assert PAUSED_TEXT == "speculation paused: slower than plain here"
    assert "plain" in strip.mode.toolTip()
    assert label_after(_event(2, drafted=1, probe=True)) == PAUSED_TEXT  # a probe: still paused
    assert label_after(_event(3, paused=True)) == PAUSED_TEXT
    # The end-of-reply text flush is not a step: the label stays.
    live.add(StepEvent(4, (), "!", (), 0, 0, 0, None, 0.0, 0.5, 4))
    strip.show_values(live.values(live=False))
    assert strip.mode.value.text() == PAUSED_TEXT
    assert label_after(_event(5, drafted=4, accepted=4)) == mode.name  # resumed
    assert strip.mode.toolTip() == "How this reply is decoded"


def test_the_saved_summary_counts_paused_steps():
    summary = Summary(mode="hybrid", finish_reason="stop", new_tokens=40, steps=30, drafted=12,
                      accepted=3, acceptance_rate=0.25, tokens_per_step=1.3, tokens_per_s=9.0,
                      ttft_s=0.1, wall_s=4.0, prompt_tokens=20, reused_prompt_tokens=0,
                      prefill_s=0.1, forward_s=3.5, overhead_s=0.5, paused_steps=17,
                      auto_off={"pauses": 1, "probes": 2, "ratio": 0.8})
    saved = reply_summary(summary)
    assert saved.paused_steps == 17
    assert saved.extra["auto_off"]["pauses"] == 1  # kept as it came
    again = type(saved).from_json(saved.to_json())
    assert again == saved and again.paused_steps == 17
    assert type(saved).from_json({"mode": "plain"}).paused_steps == 0  # older histories


def test_the_setting_is_on_by_default_and_reaches_the_request(qtbot):
    assert AppSettings().auto_off
    hybrid = modes.get("hybrid")
    ask = [Message("user", "hi")]
    assert build_request(AppSettings(), ask, hybrid).draft.auto_off
    assert not build_request(AppSettings(auto_off=False), ask, hybrid).draft.auto_off

    dlg = SettingsDialog(AppSettings())
    qtbot.addWidget(dlg)
    assert dlg.auto_off.isChecked()
    dlg.auto_off.setChecked(False)
    assert dlg.edited()["auto_off"] is False and dlg.values().auto_off is False
    dlg = SettingsDialog(AppSettings(auto_off=False))
    qtbot.addWidget(dlg)
    assert not dlg.auto_off.isChecked()


def test_a_stored_auto_off_is_checked():
    settings, bad = from_stored({**asdict(AppSettings()), "auto_off": "no", "top_k": 3})
    assert settings.auto_off is True and settings.top_k == 3
    assert bad == ["auto off"]
    settings, bad = from_stored({"auto_off": False})
    assert settings.auto_off is False and bad == []
