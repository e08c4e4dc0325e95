"""The conversation list: new, rename, delete, search, export.

Reads and writes go through the store's thread: the list fills when its
query returns, and a rename or delete shows at once while its write runs.
While the history cannot be written (read-only or unavailable) rename and
delete are disabled and their tooltips say why: shown at once, they would
change the list on screen and then fail.
"""

from __future__ import annotations

import asyncio
import sqlite3

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QWidget,
)

from specchat import outputs
from specchat.store.conversations import Conversation, ConversationStore
from specchat.store.worker import Remote, report_failure
from specchat.ui.widgets import button, hbox, vbox


class ConversationListModel(QAbstractListModel):
    failed = Signal(str)

    def __init__(self, store: Remote[ConversationStore], parent=None):
        super().__init__(parent)
        self.store = store
        self.items: list[Conversation] = []
        self.search = ""
        self._asked = 0  # the latest query; an older one that returns late is dropped
        self.writable = True

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.items)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        conv = self.items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return conv.title
        if role == Qt.ItemDataRole.UserRole:
            return conv.id
        if role == Qt.ItemDataRole.ToolTipRole:
            return conv.title + (f"\n{conv.target}" if conv.target else "")
        return None

    def flags(self, index):
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        return flags | Qt.ItemFlag.ItemIsEditable if self.writable else flags

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if role != Qt.ItemDataRole.EditRole or not str(value).strip() or not self.writable:
            return False
        self.rename(self.items[index.row()].id, str(value))
        return True

    def rename(self, conversation_id: str, title: str) -> None:
        if not self.writable:
            return
        report_failure(self.store.rename(conversation_id, title), self.failed.emit,
                       "rename the conversation")
        row = self.row_of(conversation_id)
        if row >= 0:
            self.items[row].title = title.strip() or "Untitled"
            self.dataChanged.emit(self.index(row), self.index(row))

    def reload(self) -> asyncio.Future:
        self._asked += 1
        asked = self._asked
        query = self.store.list(self.search)

        def show(f: asyncio.Future) -> None:
            if asked != self._asked or f.cancelled():
                return
            if f.exception() is not None:
                self.failed.emit(f"Could not read the conversations: {f.exception()}")
                return
            self.beginResetModel()
            self.items = f.result()
            self.endResetModel()

        query.add_done_callback(show)
        return query

    def row_of(self, conversation_id: str) -> int:
        return next((i for i, c in enumerate(self.items) if c.id == conversation_id), -1)


class Sidebar(QWidget):
    openRequested = Signal(object)  # conversation id, or None for a new chat
    deleted = Signal(str)
    failed = Signal(str)

    def __init__(self, store: Remote[ConversationStore], parent=None):
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.store = store
        self.model = ConversationListModel(store, self)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.list = QListView()
        self.list.setModel(self.model)
        self.list.setEditTriggers(QListView.EditTrigger.EditKeyPressed)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.new_button = button("New chat", "Start a new conversation (Ctrl+N)",
                                 shortcut="Ctrl+N")
        self.rename_button = button("Rename", clicked=self.rename_current)
        self.delete_button = button("Delete", clicked=self.delete_current)
        self.export_button = button("Export", "Save the conversation as a Markdown file",
                                    clicked=lambda: self.export_current())
        vbox(self.new_button, self.search, (self.list, 1),
             hbox(self.rename_button, self.delete_button, self.export_button),
             parent=self, margins=8)
        self._debounce = QTimer(self, singleShot=True, interval=200)
        self._debounce.timeout.connect(self._apply_search)
        self.search.textChanged.connect(self._debounce.start)
        self.new_button.clicked.connect(lambda: self.openRequested.emit(None))
        self.list.clicked.connect(self._open_index)
        self.list.activated.connect(self._open_index)
        self.list.customContextMenuRequested.connect(self._menu)
        self.model.failed.connect(self.failed)
        # A reset (a query returned) keeps the open conversation selected.
        self.model.modelReset.connect(lambda: self.select(self.current_id))
        self.current_id: str | None = None
        self._current: Conversation | None = None  # the open conversation, once listed
        self._read_only: str | None = None  # why the history cannot be written, if so
        self.model.reload()

    def _apply_search(self) -> None:
        self.model.search = self.search.text()
        self.refresh()

    def set_read_only(self, why: str | None) -> None:
        """``why`` the history cannot be written now (None: it can)."""
        self._read_only = why
        self.model.writable = why is None
        self._enable()

    def _enable(self) -> None:
        listed = self._current is not None
        self.export_button.setEnabled(listed)
        for b, tip in ((self.rename_button, "Rename the conversation"),
                       (self.delete_button, "Delete the conversation")):
            b.setEnabled(listed and self._read_only is None)
            b.setToolTip(tip if self._read_only is None
                         else f"Not available: nothing can be changed now. {self._read_only}")

    def refresh(self) -> asyncio.Future:
        return self.model.reload()

    def relist(self, current_id: str | None) -> asyncio.Future:
        """The conversations changed (one was created, or a reply was saved):
        list them again, with ``current_id`` selected once they are in."""
        self.current_id = current_id
        return self.refresh()

    def select(self, conversation_id: str | None) -> None:
        self.current_id = conversation_id
        row = self.model.row_of(conversation_id) if conversation_id else -1
        if row >= 0:
            self.list.setCurrentIndex(self.model.index(row))
            self._current = self.model.items[row]
        else:
            self.list.clearSelection()
            if self._current is not None and self._current.id != conversation_id:
                self._current = None  # (a search may hide the open one: keep it then)
        self._enable()

    def _open_index(self, index: QModelIndex) -> None:
        cid = index.data(Qt.ItemDataRole.UserRole)
        if cid != self.current_id:
            self.openRequested.emit(cid)

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        self._open_index(index)
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        rename = menu.addAction("Rename", self.rename_current)
        menu.addAction("Export as Markdown…", lambda: self.export_current())
        delete = menu.addAction("Delete", self.delete_current)
        for action in (rename, delete):
            action.setEnabled(self._read_only is None)
            action.setToolTip(self.rename_button.toolTip() if self._read_only else "")
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def rename_current(self) -> None:
        conv = self._current
        if conv is None or self._read_only is not None:
            return
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=conv.title)
        if ok and title.strip():
            self.model.rename(conv.id, title)
            conv.title = title.strip()  # also when a search hides it from the list

    def delete_current(self, *, confirm: bool = True) -> None:
        # ``confirm`` keyword-only: a button's clicked(checked=False) or an
        # action's triggered cannot pass for it, so Delete always asks.
        conv = self._current
        if conv is None or self._read_only is not None:
            return
        if confirm and QMessageBox.question(
                self, "Delete conversation",
                f"Delete “{conv.title}”? This cannot be undone.") != QMessageBox.StandardButton.Yes:
            return
        report_failure(self.store.delete(conv.id), self.failed.emit, "delete the conversation")
        self.select(None)
        self.refresh()  # queued after the delete, so it no longer lists it
        self.deleted.emit(conv.id)

    def export_current(self, path: str | None = None) -> asyncio.Future | None:
        """Ask where (unless ``path`` is given), then write the Markdown once
        the store has read it; the future gives the path, or None on failure.
        The file dialog runs here, in the slot: a modal dialog inside an
        asyncio task would run other tasks from within it."""
        conv = self._current
        if conv is None:
            return None
        if path is None:
            safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip()
            path, _ = QFileDialog.getSaveFileName(self, "Export conversation",
                                                  f"{safe or 'conversation'}.md",
                                                  "Markdown (*.md)")
            if not path:
                return None
        return asyncio.ensure_future(self._export(conv.id, path))

    async def _export(self, conversation_id: str, path: str) -> str | None:
        """The file is the person's choice, and the save dialog asked before
        replacing one; a named pipe, a device or a folder is still refused
        (specchat/outputs.py): opening a pipe to write waits for a reader,
        which would freeze the window. Written whole or not at all: a full
        disk leaves the file it was to replace as it was."""
        try:
            text = await self.store.export_markdown(conversation_id)
            outputs.write_text(path, text, "the conversation", lambda _file: True,
                               "choose a file to export it to")
        except outputs.Refused as exc:
            self.failed.emit(str(exc))
            return None
        except (OSError, sqlite3.Error) as exc:
            self.failed.emit(f"Could not export the conversation to {path}: {exc}")
            return None
        return path
