"""Drawing the conversation: one delegate paints every message bubble.

Each message's QTextDocument is built once per (uid, version) and kept, so
a finished message is never parsed again; while a reply streams, only the
last row's document is rebuilt. The view is a QTreeView used as a list
because it caches row heights and, on ``dataChanged`` for one row, asks the
delegate for that row's size only (QListView re-measures every row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QEvent, QModelIndex, QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QPainter,
    QPalette,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QMenu,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTreeView,
)

from specchat.store.summary import ReplySummary
from specchat.ui import links, theme
from specchat.ui.chat_model import ChatMessage, MessageRole
from specchat.ui.markdown import (
    COPY_SCHEME,
    DocColors,
    build_document,
    origin_spans,
    spans_per_range,
    split_chunks,
    tint_origins,
)

CHUNK_GAP = 6

MARGIN_X = 16
MARGIN_Y = 6
PAD_X = 12
PAD_Y = 9
FOOTER_GAP = 3
MAX_TEXT_WIDTH = 860
RADIUS = 10
READING = "Reading the prompt…"  # a reply's bubble until its first token


@dataclass
class _Chunk:
    key: tuple  # (kind, text, lang, tints): equal keys render the same
    doc: QTextDocument
    code_blocks: list[str]
    width: int = -1
    top: int = 0  # y offset inside the bubble's text area


@dataclass
class _Rendered:
    """A message drawn as a stack of documents, one per chunk (paragraph or
    code block), so a streaming reply re-renders only its last chunk."""

    version: int
    chunks: list[_Chunk] = field(default_factory=list)
    width: int = -1
    size: QSize = QSize()


class MessageDelegate(QStyledItemDelegate):
    def __init__(self, view: ChatView):
        super().__init__(view)
        self._view = view
        self._cache: dict[int, _Rendered] = {}
        self.colors = theme.current()
        self.color_tokens = False
        # Counters for tests and the debug line: work done per update.
        self.builds = 0
        self.size_hints = 0
        self.paints = 0

    # -- configuration ---------------------------------------------------
    def set_colors(self, colors: theme.Colors) -> None:
        self.colors = colors
        self._cache.clear()

    def set_color_tokens(self, on: bool) -> None:
        self.color_tokens = on
        self._cache.clear()

    def clear_cache(self) -> None:
        self._cache.clear()

    def keep_only(self, uids: set[int]) -> None:
        """Drop the renderings of messages no longer in the model."""
        for uid in set(self._cache) - uids:
            del self._cache[uid]

    # -- layout ----------------------------------------------------------
    def _small_font(self) -> QFont:
        f = QFont(self._view.font())
        f.setPointSizeF(max(7.0, f.pointSizeF() * 0.85))
        return f

    def _max_text_width(self, msg: ChatMessage) -> int:
        avail = self._view.viewport().width() - 2 * MARGIN_X - 2 * PAD_X
        if msg.role == "user":
            avail = int(avail * 0.8)
        return max(120, min(MAX_TEXT_WIDTH, avail))

    def _text_for(self, msg: ChatMessage) -> str:
        if msg.text:
            return msg.text
        if msg.waiting:
            return READING
        return "…" if msg.streaming else ""

    def _build(self, key: tuple) -> _Chunk:
        self.builds += 1
        kind, text, lang, tints = key
        if kind == "plain":  # what a person typed is shown as typed
            doc = QTextDocument()
            doc.setDefaultFont(self._view.font())
            doc.setDocumentMargin(0)
            doc.setPlainText(text)
            return _Chunk(key, doc, [])
        fence = f"```{lang}\n" if kind == "code" else ""
        source = f"{fence}{text}\n```" if kind == "code" else text
        # Only replies get here (a person's message is "plain"): the reply's colours.
        doc, blocks = build_document(source, self._view.font(), DocColors.of(self.colors))
        if tints:  # Colour tokens: the same rendering, tinted by where each token came from
            tint_origins(doc, [(a + len(fence), b + len(fence), o) for a, b, o in tints],
                         lambda origin: theme.origin_color(self.colors, origin))
        return _Chunk(key, doc, blocks)

    def _keys(self, msg: ChatMessage) -> list[tuple]:
        if msg.role == "user":
            return [("plain", msg.text, "", ())]
        chunks = split_chunks(msg.text)
        if not chunks:
            return [("text", self._text_for(msg), "", ())]
        spans = origin_spans(msg.runs) if self.color_tokens and msg.runs else []
        tints = (spans_per_range(spans, [(c.start, c.start + len(c.text)) for c in chunks])
                 if spans else [()] * len(chunks))
        return [(c.kind, c.text, c.lang, t) for c, t in zip(chunks, tints, strict=True)]

    def rendered(self, msg: ChatMessage) -> _Rendered:
        r = self._cache.get(msg.uid)
        if r is None or r.version != msg.version:
            prev = r.chunks if r is not None else []
            chunks = [prev[i] if i < len(prev) and prev[i].key == key else self._build(key)
                      for i, key in enumerate(self._keys(msg))]
            r = _Rendered(msg.version, chunks)
            self._cache[msg.uid] = r
        width = self._max_text_width(msg)
        if r.width != width:
            widest, top = 0, 0
            for chunk in r.chunks:
                if chunk.width != width:
                    chunk.doc.setTextWidth(width)
                    if msg.role == "user":
                        ideal = int(chunk.doc.idealWidth()) + 1
                        if ideal < width:
                            chunk.doc.setTextWidth(ideal)
                    chunk.width = width
                chunk.top = top
                size = chunk.doc.size()
                widest = max(widest, int(size.width()) + 1)
                top += int(size.height()) + 1 + CHUNK_GAP
            r.width = width
            r.size = QSize(widest, max(0, top - CHUNK_GAP))
        return r

    def warm_up(self) -> None:
        """Render a sample reply once, off the record: PySide initialises
        types and enums on first use (~50 ms), better at start than at the
        first token."""
        sample = ChatMessage("assistant", "**Hi** `x`\n\n```python\nprint(1)\n```\n\n- a",
                             summary=ReplySummary(new_tokens=1))
        builds = self.builds
        self.rendered(sample)
        self.footer(sample)
        self._footer_height(sample)
        self._cache.pop(sample.uid, None)
        self.builds = builds

    def footer(self, msg: ChatMessage) -> str:
        if msg.role != "assistant":
            return ""
        if msg.error:
            return msg.error
        if msg.waiting:
            return ""  # the bubble says it: Reading the prompt…
        if msg.streaming:
            return "generating…"
        if not msg.complete:
            return "interrupted (the app closed during this reply)"
        return msg.summary.line() if msg.summary else ""

    def _footer_height(self, msg: ChatMessage) -> int:
        if not self.footer(msg):
            return 0
        return FOOTER_GAP + QFontMetrics(self._small_font()).height()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        self.size_hints += 1
        msg: ChatMessage = index.data(MessageRole)
        if msg is None:
            return QSize(0, 0)
        r = self.rendered(msg)
        h = MARGIN_Y * 2 + PAD_Y * 2 + r.size.height() + self._footer_height(msg)
        return QSize(self._view.viewport().width(), h)

    def bubble_rect(self, msg: ChatMessage, item: QRect) -> QRect:
        r = self.rendered(msg)
        w = r.size.width() + 2 * PAD_X
        if msg.role == "assistant":
            w = max(w, min(r.width + 2 * PAD_X, 260))
        h = r.size.height() + 2 * PAD_Y
        x = item.right() - MARGIN_X - w if msg.role == "user" else item.left() + MARGIN_X
        return QRect(x, item.top() + MARGIN_Y, w, h)

    # -- painting --------------------------------------------------------
    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        self.paints += 1
        msg: ChatMessage = index.data(MessageRole)
        if msg is None:
            return
        c = self.colors
        r = self.rendered(msg)
        bubble = self.bubble_rect(msg, option.rect)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen if msg.role == "user" else c.border)
        painter.setBrush(c.user_bubble if msg.role == "user" else c.assistant_bubble)
        painter.drawRoundedRect(bubble, RADIUS, RADIUS)
        painter.translate(bubble.left() + PAD_X, bubble.top() + PAD_Y)
        ctx = QAbstractTextDocumentLayout.PaintContext()
        ctx.palette.setColor(QPalette.ColorRole.Text,
                             c.user_text if msg.role == "user" else c.text)
        for chunk in r.chunks:
            painter.save()
            painter.translate(0, chunk.top)
            size = chunk.doc.size()
            ctx.clip = QRectF(0, 0, size.width(), size.height())
            chunk.doc.documentLayout().draw(painter, ctx)
            painter.restore()
        painter.restore()
        foot = self.footer(msg)
        if foot:
            painter.save()
            painter.setFont(self._small_font())
            painter.setPen(c.error if msg.error else c.muted)
            top = bubble.bottom() + 1 + FOOTER_GAP
            rect = QRect(option.rect.left() + MARGIN_X + 2, top,
                         option.rect.width() - 2 * MARGIN_X - 4,
                         QFontMetrics(self._small_font()).height())
            align = Qt.AlignmentFlag.AlignRight if msg.role == "user" else Qt.AlignmentFlag.AlignLeft
            elided = QFontMetrics(self._small_font()).elidedText(
                foot, Qt.TextElideMode.ElideRight, rect.width())
            painter.drawText(rect, align | Qt.AlignmentFlag.AlignVCenter, elided)
            painter.restore()

    # -- hit testing -----------------------------------------------------
    def anchor_at(self, index: QModelIndex, item: QRect, pos: QPoint) -> tuple[str, list[str]]:
        msg: ChatMessage = index.data(MessageRole)
        if msg is None:
            return "", []
        bubble = self.bubble_rect(msg, item)
        r = self.rendered(msg)
        local = pos - QPoint(bubble.left() + PAD_X, bubble.top() + PAD_Y)
        for chunk in r.chunks:
            if chunk.top <= local.y() <= chunk.top + chunk.doc.size().height():
                return (chunk.doc.documentLayout().anchorAt(local - QPoint(0, chunk.top)),
                        chunk.code_blocks)
        return "", []


class ChatView(QTreeView):
    """The conversation. Stays scrolled to the bottom while a reply streams,
    unless the person has scrolled up to read."""

    copied = Signal(str)  # what was copied, for a status message
    notice = Signal(str)  # a link opened or refused (ui/links.py), for the status line

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ChatView")
        self.setHeaderHidden(True)
        self.setRootIsDecorated(False)
        self.setItemsExpandable(False)
        self.setIndentation(0)
        self.setUniformRowHeights(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.verticalScrollBar().setSingleStep(24)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setAllColumnsShowFocus(False)
        self.delegate = MessageDelegate(self)
        self.setItemDelegate(self.delegate)
        self._stick = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range)

    def setModel(self, model) -> None:  # noqa: N802 - Qt override
        super().setModel(model)
        model.modelReset.connect(self._on_reset)
        model.rowsRemoved.connect(lambda *_: self._prune())

    def _on_reset(self) -> None:
        self.delegate.clear_cache()
        self._stick = True

    def _prune(self) -> None:
        live = {m.uid for m in self.model().messages}
        self.delegate.keep_only(live)

    def _on_scrolled(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 8

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(hi)

    # -- configuration (the window's view of the delegate) -----------------
    @property
    def color_tokens(self) -> bool:
        return self.delegate.color_tokens

    def set_color_tokens(self, on: bool) -> None:
        """Tint accepted draft tokens by their source or not (the model's
        refresh_all then has every row drawn again)."""
        self.delegate.set_color_tokens(on)

    def set_colors(self, colors: theme.Colors) -> None:
        self.delegate.set_colors(colors)

    def warm_up(self) -> None:
        self.delegate.warm_up()

    def stick_to_bottom(self) -> None:
        self._stick = True
        self.scrollToBottom()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        # Bubble widths follow the viewport; heights must be measured again.
        self.scheduleDelayedItemsLayout()

    def _anchor(self, pos: QPoint) -> tuple[str, list[str]]:
        index = self.indexAt(pos)
        if not index.isValid():
            return "", []
        return self.delegate.anchor_at(index, self.visualRect(index), pos)

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        href, _ = self._anchor(event.position().toPoint())
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor if href
                                  else Qt.CursorShape.ArrowCursor)
        # Where a link goes, before it is clicked (and that it will not open).
        self.viewport().setToolTip("" if not href or href.startswith(COPY_SCHEME)
                                   else href if links.openable(href)
                                   else f"{href}: not opened (only http and https links open)")
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            href, blocks = self._anchor(event.position().toPoint())
            if href:
                said = links.follow(href, blocks)
                if said:
                    (self.copied if said == links.CODE_COPIED else self.notice).emit(said)
                return
        super().mouseReleaseEvent(event)

    def contextMenuEvent(self, event) -> None:  # noqa: N802
        index = self.indexAt(event.pos())
        if not index.isValid():
            return
        msg: ChatMessage = index.data(MessageRole)
        menu = QMenu(self)
        menu.addAction("Copy message", lambda: self._copy(msg.text))
        menu.exec(event.globalPos())

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit("Message copied to the clipboard")

    def event(self, e) -> bool:
        if e.type() == QEvent.Type.PaletteChange:
            self.delegate.clear_cache()
        return super().event(e)
