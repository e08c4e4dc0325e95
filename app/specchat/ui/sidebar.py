"""The conversation list: new, rename, delete, search, export."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from specchat.store.conversations import Conversation, ConversationStore


class ConversationListModel(QAbstractListModel):
    def __init__(self, store: ConversationStore, parent=None):
        super().__init__(parent)
        self.store = store
        self.items: list[Conversation] = []
        self.search = ""

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
        return (Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                | Qt.ItemFlag.ItemIsEditable)

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if role != Qt.ItemDataRole.EditRole or not str(value).strip():
            return False
        conv = self.items[index.row()]
        self.store.rename(conv.id, str(value))
        conv.title = str(value).strip()
        self.dataChanged.emit(index, index)
        return True

    def reload(self) -> None:
        self.beginResetModel()
        self.items = self.store.list(self.search)
        self.endResetModel()

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self.items) if c.id == conversation_id), -1)


class Sidebar(QWidget):
    openRequested = Signal(object)  # conversation id, or None for a new chat
    deleted = Signal(int)

    def __init__(self, store: ConversationStore, parent=None):
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
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.setShortcut("Ctrl+N")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        buttons = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        self.export_button = QPushButton("Export")
        self.export_button.setToolTip("Save the conversation as a Markdown file")
        for b in (self.rename_button, self.delete_button, self.export_button):
            buttons.addWidget(b)
        lay.addLayout(buttons)
        self._debounce = QTimer(self, singleShot=True, interval=200)
        self._debounce.timeout.connect(self._apply_search)
        self.search.textChanged.connect(self._debounce.start)
        self.new_button.clicked.connect(lambda: self.openRequested.emit(None))
        self.list.clicked.connect(self._open_index)
        self.list.activated.connect(self._open_index)
        self.list.customContextMenuRequested.connect(self._menu)
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button.clicked.connect(self.delete_current)
        self.export_button.clicked.connect(self.export_current)
        self.current_id: int | None = None
        self.model.reload()

    def _apply_search(self) -> None:
        self.model.search = self.search.text()
        self.refresh()

    def refresh(self) -> None:
        self.model.reload()
        self.select(self.current_id)

    def select(self, conversation_id: int | None) -> None:
        self.current_id = conversation_id
        row = self.model.row_of(conversation_id) if conversation_id else -1
        if row >= 0:
            self.list.setCurrentIndex(self.model.index(row))
        else:
            self.list.clearSelection()
        for b in (self.rename_button, self.delete_button, self.export_button):
            b.setEnabled(conversation_id is not None)

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
        menu.addAction("Rename", self.rename_current)
        menu.addAction("Export as Markdown…", self.export_current)
        menu.addAction("Delete", self.delete_current)
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def rename_current(self) -> None:
        if self.current_id is None:
            return
        conv = self.store.get(self.current_id)
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=conv.title)
        if ok and title.strip():
            self.store.rename(conv.id, title)
            self.refresh()

    def delete_current(self, confirm: bool = True) -> None:
        if self.current_id is None:
            return
        conv = self.store.get(self.current_id)
        if confirm and QMessageBox.question(
                self, "Delete conversation",
                f"Delete “{conv.title}”? This cannot be undone.") != QMessageBox.StandardButton.Yes:
            return
        self.store.delete(conv.id)
        self.current_id = None
        self.refresh()
        self.deleted.emit(conv.id)

    def export_current(self, path: str | None = None) -> str | None:
        if self.current_id is None:
            return None
        conv = self.store.get(self.current_id)
        if path is None:
            safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip()
            path, _ = QFileDialog.getSaveFileName(self, "Export conversation",
                                                  f"{safe or 'conversation'}.md",
                                                  "Markdown (*.md)")
            if not path:
                return None
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.store.export_markdown(conv.id))
        return path
