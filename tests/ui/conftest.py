"""Fixtures for the UI tests (a private SPECCHAT_HOME is tests/conftest.py's
``home``): asyncio running on the Qt loop (qasync) while the tests spin it, and a window on the tiny pair's
settings. Qt runs offscreen (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
from ui_support import make_window


@pytest.fixture
def aloop(qapp):
    """A qasync loop marked as running, so tasks advance whenever Qt
    processes events (qtbot.waitUntil, qtbot.wait)."""
    import qasync
    from specchat.ui import theme

    theme.apply(qapp)
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    for task in asyncio.all_tasks(loop):
        task.cancel()
    for _ in range(5):
        qapp.processEvents()
    asyncio.events._set_running_loop(None)
    loop.stop()
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def window(qtbot, aloop, home):
    w = make_window(qtbot)
    # Short replies keep the suite fast; tests that need more set their own.
    w.session.update_settings(max_tokens=48)
    yield w
    w.close()
