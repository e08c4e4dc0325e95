"""Fixtures for the UI tests (a private SPECCHAT_HOME and ``aloop``, asyncio on
the Qt loop, are tests/conftest.py's): a window on the tiny pair's
settings. Qt runs offscreen (tests/conftest.py)."""

from __future__ import annotations

import pytest
from ui_support import make_window


@pytest.fixture
def window(qtbot, aloop, home):
    w = make_window(qtbot)
    # Short replies keep the suite fast; tests that need more set their own.
    w.session.update_settings(max_tokens=48)
    yield w
    w.close()
