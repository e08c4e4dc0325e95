"""The pair picker's "Find the best draft": progress and Cancel while it
measures the installed drafts, the outcome after, the measured speedup in
the draft list, and the loaded pair put back."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from specchat.library import importing
from specchat.library import recommendations as rec
from specchat.ui.draft_finder import HOLDER, DraftFinder
from ui_support import load, wait_until


@pytest.fixture
def drafts(home, tiny_draft, mismatched_draft) -> dict[str, str]:
    """Two installed drafts for the tiny target: one that agrees with it
    often, one with another tokenizer."""
    return {key: importing.import_path(path, name=key).name
            for key, path in (("noisy", tiny_draft), ("other", mismatched_draft))}


def _draft_text(picker, ref: str) -> str:
    return picker.draft.itemText(picker.draft.findData(ref))


def test_find_the_best_draft(qtbot, window, monkeypatch, drafts, tiny_target, tiny_draft):
    monkeypatch.setattr(DraftFinder, "prompts", 1)
    monkeypatch.setattr(DraftFinder, "max_tokens", 8)
    picker, pairs = window.picker, window.session.pairs
    wait_until(pairs.reload_choices().done)  # the drafts just installed
    wait_until(lambda: picker.draft.findData(drafts["noisy"]) >= 0)
    before = load(qtbot, window, tiny_target, tiny_draft)  # the pair in use: put back after
    target = str(tiny_target)
    picker.set_pair(target, None)
    assert _draft_text(picker, drafts["noisy"]).endswith(")")  # nothing measured yet
    assert picker.find_button.isEnabled()

    # Cancel at once: the engine is held meanwhile, nothing is measured, the pair stays.
    picker.find_button.click()
    assert window.session.engine.held_by == HOLDER
    assert picker.finder_strip.isVisible() and picker.finder_strip.bar.isVisible()
    assert not picker.find_button.isEnabled()
    picker.finder_strip.cancel_button.click()
    wait_until(lambda: not pairs.finder.running, timeout=60_000)
    assert picker.finder_strip.text().startswith("Cancelled")
    assert not picker.finder_strip.cancel_button.isVisible()
    assert rec.remembered(target) == {}
    assert window.session.engine.held_by is None and picker.find_button.isEnabled()
    assert window.session.engine.pair.draft.name == before.draft.name

    # The whole search: progress through the plain run and the draft, then the ranking.
    seen: list[tuple[str, float]] = []
    pairs.finder.progressed.connect(lambda message, fraction: seen.append((message, fraction)))
    picker.set_pair(target, None)
    picker.find_button.click()
    wait_until(lambda: not pairs.finder.running, timeout=60_000)
    messages = [m for m, _ in seen]
    assert "Plain decoding: prompt 1 of 1" in messages and "noisy: prompt 1 of 1" in messages
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0

    measured = rec.remembered(target)
    assert list(measured) == [drafts["noisy"]]
    result = measured[drafts["noisy"]]
    # The list shows the measured speedup next to the draft ...
    assert _draft_text(picker, drafts["noisy"]).endswith(
        f" — {result.measured_speedup:.1f}× measured")
    assert "measured" not in _draft_text(picker, drafts["other"])
    row = picker.draft.findData(drafts["noisy"])
    assert picker.draft.itemData(row, Qt.ItemDataRole.ToolTipRole).endswith(
        f"Measured for this target here: {result.summary()}")
    # ... the line under the verdict the outcome, with every draft in its tooltip.
    strip = picker.finder_strip
    assert not strip.bar.isVisible() and not strip.cancel_button.isVisible()
    tip = strip.status.toolTip()
    assert f"1. noisy: {result.summary()}" in tip
    assert "✗ other: vocabulary size differs" in tip
    assert "1 built-in prompt" in tip  # this home has no history yet
    if result.measured_speedup > 1.0:  # the best draft is chosen, ready to load
        assert strip.text().startswith("Best draft: noisy")
        assert picker.selection() == (target, drafts["noisy"])
    # The pair that was loaded is loaded again, and the engine is free.
    assert window.session.engine.pair.draft.name == before.draft.name
    assert window.session.engine.held_by is None and picker.find_button.isEnabled()

    # Another target has measurements of its own (none here).
    picker.set_pair(str(tiny_draft), None)
    assert "measured" not in _draft_text(picker, drafts["noisy"])
    picker.set_pair(target, None)
    assert _draft_text(picker, drafts["noisy"]).endswith("× measured")
