"""Starting the desktop app: Qt, asyncio on the Qt loop (qasync), the window.

MLX is never imported on this thread: the engine thread imports it when the
first model loads. Everything asyncio is started from ``window.start``,
which runs once the loop is running (qasync must not see tasks before).
"""

from __future__ import annotations

import asyncio
import sys
from importlib import resources

import qasync
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from specchat import applog, startup
from specchat.ui import library_view, theme


def initial_pair(target: str | None, draft: str | None, lookup: bool,
                 settings=None) -> tuple[str, str | None]:
    """The pair to select and load at start: the command line's, else the
    one used last, else the bundled default."""
    if target:
        return target, None if lookup else draft
    if settings is not None and settings.last_target:
        return settings.last_target, settings.last_draft
    return library_view.default_pair()


def create_app():
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("SpecChat")
    app.setApplicationDisplayName("SpecChat")
    app.setOrganizationName("SpecChat")
    app.setDesktopFileName("dev.specchat.specchat")
    icon = resources.files("specchat").joinpath("resources/icon/specchat-256.png")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    theme.apply(app)
    return app


def run(target: str | None = None, draft: str | None = None, lookup: bool = False) -> int:
    startup.prepare()  # the system BLAS before anything imports MLX
    applog.setup()  # before the session opens the history: what it reports is logged
    from specchat.ui.main_window import MainWindow
    from specchat.ui.session import AppSession

    app = create_app()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    session = AppSession()
    window = MainWindow(session=session,
                        initial_pair=initial_pair(target, draft, lookup, session.settings))
    window.show()
    with loop:
        # Tasks may only be created once the loop runs: start from inside it.
        loop.call_soon(window.start)
        loop.run_forever()  # until the last window closes
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    return 0
