"""Spinning Qt until something holds, for any test with a window or dialog."""

from __future__ import annotations


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
