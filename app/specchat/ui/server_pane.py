"""Settings' "Local server" pane: the endpoints the server serves, and how
the engine's prompt cache stands.

The endpoints are the server's own route table (``server/endpoints.py``,
which its routes are built from), so this list cannot drift from what it
answers. The cache line asks the engine (``EngineController.prompt_cache``,
a job awaited on the Qt loop) when the dialog opens, when an API request
ends and when a pair loads; a request still running delays the answer,
never the window.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
)

from specchat import values
from specchat.engine.errors import EngineError
from specchat.server.endpoints import ENDPOINTS


class EndpointTable(QTableWidget):
    """One row per endpoint (method, path, what it is); Copy (Ctrl+C, the
    context menu) puts the selected endpoints' full URLs on the clipboard."""

    COLUMNS = ("Method", "Path", "What it is")

    def __init__(self, parent=None):
        super().__init__(len(ENDPOINTS), len(self.COLUMNS), parent)
        self.setObjectName("EndpointTable")
        self.base = ""
        self.setHorizontalHeaderLabels(self.COLUMNS)
        self.verticalHeader().hide()
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setWordWrap(False)
        for row, e in enumerate(ENDPOINTS):
            for col, text in enumerate((e.method, e.path, e.what)):
                self.setItem(row, col, QTableWidgetItem(text))
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.resizeRowsToContents()
        rows = sum(self.rowHeight(r) for r in range(self.rowCount()))
        self.setFixedHeight(rows + header.sizeHint().height() + 2 * self.frameWidth())
        copy = QAction("Copy URL", self)
        copy.setShortcut(QKeySequence.StandardKey.Copy)
        copy.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        copy.triggered.connect(self.copy)
        self.addAction(copy)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)

    def rows(self) -> list[tuple[str, str, str]]:
        """What the table shows: (method, path, what it is) per row."""
        return [tuple(self.item(r, c).text() for c in range(self.columnCount()))
                for r in range(self.rowCount())]

    def set_base(self, base: str) -> None:
        """The base URL the endpoints' URLs are copied under."""
        self.base = base
        for row, e in enumerate(ENDPOINTS):
            self.item(row, 1).setToolTip(e.url(base))

    def urls(self) -> list[str]:
        """The selected endpoints' full URLs (all of them when none is selected)."""
        rows = sorted({i.row() for i in self.selectedIndexes()}) or range(len(ENDPOINTS))
        return [ENDPOINTS[r].url(self.base) for r in rows]

    def copy(self) -> None:
        QGuiApplication.clipboard().setText("\n".join(self.urls()))


def cache_use_text(use) -> str:
    """``prompt_cache.CacheUse`` in a line: "holds 2 conversations aside,
    41.5 MB of 2 GB" (MB and GB of the same base as the setting's GB)."""
    n = use.conversations
    mb = use.held / (values.GB / 1024)
    return (f"holds {n} conversation{'' if n == 1 else 's'} aside, "
            f"{mb:.1f} MB of {use.budget / values.GB:g} GB")


class CacheUseLabel(QLabel):
    """The "holds N conversations aside" line of a session's engine, asked
    again when an API request ends and when a pair loads."""

    NO_MODEL = "nothing held: no model is loaded"

    def __init__(self, session, parent=None):
        super().__init__(self.NO_MODEL, parent)
        self.setObjectName("CacheUse")
        self.setWordWrap(True)
        self.session = session
        self._task: asyncio.Future | None = None
        self._again = False
        session.api.requestEnded.connect(self.refresh)
        session.engine.loaded.connect(self.refresh)

    def refresh(self, *_args) -> asyncio.Future | None:
        """Ask the engine (once more after the answer when asked while a
        question is out); the future is done once the line shows it. None
        when no pair is loaded (nothing to ask)."""
        if self.session.engine.pair is None:
            self.setText(self.NO_MODEL)
            return None
        if self._task is not None and not self._task.done():
            self._again = True
        else:
            if self.text() == self.NO_MODEL:
                self.setText("asking the engine…")
            self._task = asyncio.ensure_future(self._ask())
        return self._task

    async def _ask(self) -> None:
        while True:
            self._again = False
            try:
                text = cache_use_text(await self.session.engine.prompt_cache())
            except EngineError as exc:
                text = f"not known: {exc}"
            try:
                self.setText(text)
            except RuntimeError:  # the dialog closed meanwhile: its label is gone
                return
            if not self._again:
                return
