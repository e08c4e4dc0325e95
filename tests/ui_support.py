"""Fixtures and helpers for the UI tests: a temporary SPECCHAT_HOME, asyncio
running on the Qt loop (qasync) while the tests spin it, and a window.

Test modules import the fixtures they use from here (hence their
``ruff: noqa: F811``), so tests/conftest.py stays the engine's.
"""

from __future__ import annotations

import asyncio

import pytest


def wait_until(cond, timeout: float = 60_000) -> None:
    """Spin Qt (and so asyncio) until ``cond()``; ``timeout`` in ms.

    Not qtbot.waitUntil: PySide's QTest.qWait keeps the GIL while it waits,
    which starves the engine thread; here the GIL is released between
    rounds of event processing, as QApplication.exec does in the app.
    """
    import time

    from PySide6.QtCore import QCoreApplication, QEventLoop

    deadline = time.monotonic() + timeout / 1000
    while True:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        if cond():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} ms")
        time.sleep(0.002)


def make_window(qtbot, **kwargs):
    from specchat.ui.main_window import MainWindow

    w = MainWindow(**kwargs)
    qtbot.addWidget(w)
    w.resize(1100, 760)
    w.show()
    w.start()
    return w


def load(qtbot, w, target, draft=None, timeout=60_000):
    w.picker.set_pair(str(target), str(draft) if draft else None)
    w.load_pair(str(target), str(draft) if draft else None)
    wait_until(lambda: not w.engine.loading, timeout=timeout)
    assert w.engine.pair is not None, w.error_banner.label.text()
    return w.engine.pair


def send_and_wait(qtbot, w, text="Hello, world! How are you today?", timeout=60_000):
    w.composer.edit.setPlainText(text)
    w.composer.send_button.click()
    assert w.controller.busy
    wait_until(lambda: not w.controller.busy, timeout=timeout)
    return w.chat_model.messages[-1]


@pytest.fixture
def ui_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECCHAT_HOME", str(home))
    return home


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
def window(qtbot, aloop, ui_home):
    w = make_window(qtbot)
    # Short replies keep the suite fast; tests that need more set their own.
    from dataclasses import replace

    w.settings = replace(w.settings, max_tokens=48)
    yield w
    w.close()
