"""The app session and the values the window passes around: observable
settings that save themselves, modes from the engine's registry, and typed
reply summaries (reading old history files: tests/store/test_store.py)."""

from __future__ import annotations

from specchat.engine import modes
from specchat.engine.events import ComputeInfo, LoadedPair, ModelInfo, StepEvent
from specchat.store.summary import ReplySummary
from ui_support import wait_until


class _Client:
    """Stands in for EngineClient: the session only closes it here."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _pair(draft: bool, speculative_ok: bool = True) -> LoadedPair:
    info = ModelInfo("m", "/m", "llama", 1, 1, "float32", 10, True, None)
    return LoadedPair(info, info if draft else None, ComputeInfo("cpu", "float32", "openblas"),
                      speculative_ok, None if speculative_ok else "cannot")


def test_session_settings_are_observable_and_saved(qtbot, aloop, tmp_path):
    from specchat.ui.session import AppSession

    client = _Client()
    session = AppSession(client, tmp_path / "s.sqlite3")
    seen = []
    session.settingsChanged.connect(seen.append)
    session.update_settings(max_tokens=77, speculative=False)
    session.update_settings(max_tokens=77)  # no change: nothing to tell
    assert [s.max_tokens for s in seen] == [77] and session.settings.speculative is False
    saved = session.store.settings.load()
    wait_until(saved.done, timeout=5000)
    assert saved.result().max_tokens == 77
    session.close()
    assert client.closed


def test_next_mode_comes_from_the_registry(qtbot, aloop, tmp_path):
    from specchat.ui.session import AppSession

    session = AppSession(_Client(), tmp_path / "m.sqlite3")
    assert session.next_mode() == modes.for_pair(True, False, False)  # nothing loaded: plain
    session.engine.pair = _pair(draft=True)
    assert session.next_mode() == modes.for_pair(True, True, True)
    assert session.next_mode().needs_draft_model
    assert not session.next_mode(speculative=False).speculative
    session.engine.pair = _pair(draft=False)
    assert session.next_mode().speculative and not session.next_mode().needs_draft_model
    session.engine.pair = _pair(draft=True, speculative_ok=False)
    assert not session.next_mode().speculative
    session.close()


def test_plain_speeds_and_gauge_mode(qtbot):
    from specchat.ui.gauges import GaugeStrip
    from specchat.ui.stats import LiveStats, PlainSpeeds

    speeds = PlainSpeeds()
    speeds.note(("t", "d"), ReplySummary(mode="plain", new_tokens=3, tokens_per_s=5.0))
    assert speeds.get(("t", "d")) is None  # too short to judge the pair by
    speeds.note(("t", "d"), ReplySummary(mode="plain", new_tokens=40, tokens_per_s=10.0))
    speeds.note(("t", "d"), ReplySummary(mode="hybrid", new_tokens=40, tokens_per_s=30.0))
    assert speeds.get(("t", "d")) == 10.0

    mode = modes.for_pair(True, has_draft=True)
    live = LiveStats(mode)
    live.add(StepEvent(0, (1, 2, 3), "abc", ("draft", "draft", "target"), 3, 2, 3, "draft",
                       0.1, 0.5, 3))
    strip = GaugeStrip()
    qtbot.addWidget(strip)
    strip.show_values(live.values(speeds.get(("t", "d"))))
    assert strip.values.speedup is not None
    assert strip.mode.value.text() == f"{mode.name} (draft)"  # which drafter drafted last
    strip.clear()
    strip.preview(modes.for_pair(False, has_draft=True))
    assert strip.mode.value.text() == modes.for_pair(False, has_draft=True).name
