"""Drawing the conversation: one delegate paints every message bubble.

Each message's QTextDocument is built once per (uid, version) and kept, so
a finished message is never parsed again; while a reply streams, only the
last row's document is rebuilt. The view is a QTreeView used as a list
because it caches row heights and, on ``dataChanged`` for one row, asks the
delegate for that row's size only (QListView re-measures every row).

A reply that reasoned has a Thinking section at the top of its bubble: a
real button (``ThinkingToggle``, a persistent editor the delegate places
over the bubble, so Tab reaches it, Space folds it and a screen reader
names it) and, when open, the reasoning as plain text, cut into paragraphs
kept between updates (``markdown.Paragraphs``): a long reasoning streaming
in costs each update its last paragraph. The answer below it is the
Markdown reply it always was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import (
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QPoint,
    QRect,
    QRectF,
    QSize,
    Qt,
    Signal,
)
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
    QToolButton,
    QTreeView,
    QWidget,
)

from specchat.store.summary import ReplySummary
from specchat.ui import links, theme
from specchat.ui import thinking_header as words
from specchat.ui.chat_model import ChatMessage, ChatModel, MessageRole
from specchat.ui.markdown import (
    COPY_SCHEME,
    DocColors,
    Paragraphs,
    build_document,
    origin_spans,
    plain_document,
    spans_per_range,
    split_chunks,
    tint_origins,
)

CHUNK_GAP = 6
REASONING_INDENT = 12  # the reasoning sits right of a thin rule, apart from the answer
REASONING_GAP = 6  # and a little above it

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
    indent: int = 0  # x offset (the reasoning's)


@dataclass
class _Rendered:
    """A message drawn as a stack of documents, one per chunk (paragraph or
    code block), so a streaming reply re-renders only its last chunk; under
    its Thinking toggle (``header`` pixels) if it reasoned."""

    version: int
    chunks: list[_Chunk] = field(default_factory=list)
    width: int = -1
    size: QSize = QSize()
    header: int = 0


class ThinkingToggle(QToolButton):
    """Opens and folds a reply's Thinking section; its text says how long
    the reasoning was. Checked: open."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ThinkingToggle")
        self.setCheckable(True)
        self.setAutoRaise(True)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)  # a click leaves the message box its focus
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setAccessibleName("Thinking")

    def show_state(self, text: str, tip: str, described: str, shown: bool) -> None:
        """Called at every update of a streaming reply: only what changed is set."""
        if shown != self.isChecked():
            self.blockSignals(True)
            self.setChecked(shown)
            self.blockSignals(False)
        if text != self.text():
            self.setText(text)
        if tip != self.toolTip():
            self.setToolTip(tip)
        if described != self.accessibleDescription():
            self.setAccessibleDescription(described)


class MessageDelegate(QStyledItemDelegate):
    def __init__(self, view: ChatView):
        super().__init__(view)
        self._view = view
        self._cache: dict[int, _Rendered] = {}
        self._paragraphs: dict[int, Paragraphs] = {}  # each reply's reasoning, cut so far
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
        self._paragraphs.clear()

    def keep_only(self, uids: set[int]) -> None:
        """Drop the renderings of messages no longer in the model."""
        for uid in set(self._cache) - uids:
            del self._cache[uid]
        for uid in set(self._paragraphs) - uids:
            del self._paragraphs[uid]

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

    def _header_height(self) -> int:
        """The Thinking toggle's row at the top of a bubble."""
        return QFontMetrics(self._view.font()).height() + 10

    def _build(self, key: tuple) -> _Chunk:
        self.builds += 1
        kind, text, lang, tints = key
        if kind == "plain":  # what a person typed is shown as typed
            doc = QTextDocument()
            doc.setDefaultFont(self._view.font())
            doc.setDocumentMargin(0)
            doc.setPlainText(text)
            return _Chunk(key, doc, [])
        if kind in ("reasoning", "note"):  # reasoning reads as plain text, as does our note
            font = QFont(self._view.font())
            font.setItalic(kind == "note")
            doc = plain_document(text, font, self.colors.muted)
            if tints:
                tint_origins(doc, tints, lambda origin: theme.origin_color(self.colors, origin))
            return _Chunk(key, doc, [])
        fence = f"```{lang}\n" if kind == "code" else ""
        source = f"{fence}{text}\n```" if kind == "code" else text
        # Only replies get here (a person's message is "plain"): the reply's colours.
        doc, blocks = build_document(source, self._view.font(), DocColors.of(self.colors))
        if tints:  # Colour tokens: the same rendering, tinted by where each token came from
            tint_origins(doc, [(a + len(fence), b + len(fence), o) for a, b, o in tints],
                         lambda origin: theme.origin_color(self.colors, origin))
        return _Chunk(key, doc, blocks)

    def _tinted(self, chunks, runs, kind: str | None = None) -> list[tuple]:
        """Chunk keys, with Colour tokens' tints of ``runs`` if it is on."""
        spans = origin_spans(runs) if self.color_tokens and runs else []
        tints = (spans_per_range(spans, [(c.start, c.start + len(c.text)) for c in chunks])
                 if spans else [()] * len(chunks))
        return [(kind or c.kind, c.text, c.lang, t) for c, t in zip(chunks, tints, strict=True)]

    def _keys(self, msg: ChatMessage) -> list[tuple]:
        if msg.role == "user":
            return [("plain", msg.text, "", ())]
        keys: list[tuple] = []
        if msg.reasoning and msg.thinking_open:
            cut = self._paragraphs.setdefault(msg.uid, Paragraphs())
            keys += self._tinted(cut.update(msg.reasoning), msg.reasoning_runs, "reasoning")
        chunks = split_chunks(msg.text)
        if chunks:
            return keys + self._tinted(chunks, msg.runs)
        if not msg.reasoning:
            return [("text", self._text_for(msg), "", ())]
        if not msg.streaming:  # it reasoned, and no answer came
            keys.append(("note", words.no_answer(msg.summary), "", ()))
        return keys

    def has_thinking(self, msg: ChatMessage | None) -> bool:
        """A reply with a Thinking section (and so a toggle over its bubble)."""
        return msg is not None and msg.role == "assistant" and bool(msg.reasoning)

    def rendered(self, msg: ChatMessage) -> _Rendered:
        r = self._cache.get(msg.uid)
        if r is None or r.version != msg.version:
            prev = r.chunks if r is not None else []
            chunks = [prev[i] if i < len(prev) and prev[i].key == key else self._build(key)
                      for i, key in enumerate(self._keys(msg))]
            r = _Rendered(msg.version, chunks,
                          header=self._header_height() if self.has_thinking(msg) else 0)
            self._cache[msg.uid] = r
        width = self._max_text_width(msg)
        if r.width != width:
            widest, top = self._toggle_width(msg) if r.header else 0, r.header
            after_reasoning = False
            for chunk in r.chunks:
                reasoning = chunk.key[0] == "reasoning"
                if after_reasoning and not reasoning:
                    top += REASONING_GAP
                after_reasoning = reasoning
                chunk.indent = REASONING_INDENT if reasoning else 0
                if chunk.width != width:
                    chunk.doc.setTextWidth(width - chunk.indent)
                    if msg.role == "user":
                        ideal = int(chunk.doc.idealWidth()) + 1
                        if ideal < width:
                            chunk.doc.setTextWidth(ideal)
                    chunk.width = width
                chunk.top = top
                size = chunk.doc.size()
                widest = max(widest, int(size.width()) + 1 + chunk.indent)
                top += int(size.height()) + 1 + CHUNK_GAP
            r.width = width
            r.size = QSize(widest, max(r.header, top - CHUNK_GAP))
        return r

    # -- the Thinking toggle (a persistent editor over the bubble) -----------
    def toggle_state(self, msg: ChatMessage) -> tuple[str, str, str, bool]:
        """The toggle's text, tooltip, accessible description and state."""
        numbers, shown = msg.reasoning_numbers(), msg.thinking_open
        unfinished = msg.summary is not None and msg.summary.ended_in_reasoning
        return (words.toggle_text(numbers, msg.thinking, shown, unfinished),
                words.toggle_tip(numbers, shown), words.description(numbers, shown), shown)

    def _toggle_width(self, msg: ChatMessage) -> int:
        text = self.toggle_state(msg)[0]
        return QFontMetrics(self._view.font()).horizontalAdvance(text) + 16

    def createEditor(self, parent: QWidget, option, index: QModelIndex) -> QWidget:  # noqa: N802
        toggle = ThinkingToggle(parent)
        row = QPersistentModelIndex(index)

        def toggled(on: bool) -> None:
            model = self._view.model()
            if row.isValid() and isinstance(model, ChatModel):
                model.set_thinking_shown(row.row(), on)

        toggle.toggled.connect(toggled)
        return toggle

    def setEditorData(self, editor: QWidget, index: QModelIndex) -> None:  # noqa: N802
        msg: ChatMessage = index.data(MessageRole)
        if isinstance(editor, ThinkingToggle) and msg is not None:
            editor.show_state(*self.toggle_state(msg))

    def updateEditorGeometry(self, editor: QWidget, option, index: QModelIndex) -> None:  # noqa: N802
        msg: ChatMessage = index.data(MessageRole)
        if msg is None:
            return
        bubble = self.bubble_rect(msg, option.rect)
        width = min(self._toggle_width(msg), bubble.width() - 2 * PAD_X + 8)
        editor.setGeometry(bubble.left() + PAD_X - 4, bubble.top() + PAD_Y - 4, width,
                           self._header_height())

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
        """What is written under a bubble (``footer_lines``, one a line)."""
        return "\n".join(self.footer_lines(msg))

    def footer_lines(self, msg: ChatMessage) -> list[str]:
        """The lines under a bubble: the reply's state, or its summary (and,
        for a reply that reasoned, each part's numbers on a line of their own)."""
        if msg.role != "assistant":
            return []
        if msg.error:
            return [msg.error]
        if msg.waiting:
            return []  # the bubble says it: Reading the prompt…
        if msg.streaming:
            return ["thinking…" if msg.thinking else "generating…"]
        if not msg.complete:
            return ["interrupted (the app closed during this reply)"]
        if msg.summary is None:
            return []
        return [line for line in (msg.summary.line(), msg.summary.parts_line()) if line]

    def _footer_height(self, msg: ChatMessage) -> int:
        lines = len(self.footer_lines(msg))
        if not lines:
            return 0
        return FOOTER_GAP + lines * QFontMetrics(self._small_font()).height()

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
        ruled = [ch for ch in r.chunks if ch.indent]
        if ruled:  # the reasoning's rule, beside its paragraphs
            painter.fillRect(QRectF(2, ruled[0].top, 2, ruled[-1].top - ruled[0].top
                                    + ruled[-1].doc.size().height()), c.border)
        # Only what the viewport shows: a long reply's (or reasoning's)
        # paragraphs out of sight cost nothing to paint.
        seen = self._view.viewport().rect()
        left, top = bubble.left() + PAD_X, bubble.top() + PAD_Y
        for chunk in r.chunks:
            height = int(chunk.doc.size().height()) + 1
            if not seen.intersects(QRect(left, top + chunk.top, bubble.width(), height)):
                continue
            painter.save()
            painter.translate(chunk.indent, chunk.top)
            size = chunk.doc.size()
            ctx.clip = QRectF(0, 0, size.width(), size.height())
            chunk.doc.documentLayout().draw(painter, ctx)
            painter.restore()
        painter.restore()
        lines = self.footer_lines(msg)
        if lines:
            painter.save()
            painter.setFont(self._small_font())
            painter.setPen(c.error if msg.error else c.muted)
            metrics = QFontMetrics(self._small_font())
            align = Qt.AlignmentFlag.AlignRight if msg.role == "user" else Qt.AlignmentFlag.AlignLeft
            top = bubble.bottom() + 1 + FOOTER_GAP
            for line in lines:
                rect = QRect(option.rect.left() + MARGIN_X + 2, top,
                             option.rect.width() - 2 * MARGIN_X - 4, metrics.height())
                elided = metrics.elidedText(line, Qt.TextElideMode.ElideRight, rect.width())
                painter.drawText(rect, align | Qt.AlignmentFlag.AlignVCenter, elided)
                top += metrics.height()
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
                return (chunk.doc.documentLayout().anchorAt(
                    local - QPoint(chunk.indent, chunk.top)), chunk.code_blocks)
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
        model.rowsInserted.connect(lambda _parent, first, last: self._add_toggles(first, last))
        model.dataChanged.connect(lambda a, b, *_: self._add_toggles(a.row(), b.row()))

    def _on_reset(self) -> None:
        self.delegate.clear_cache()
        self._stick = True
        self._add_toggles(0, self.model().rowCount() - 1)

    def _add_toggles(self, first: int, last: int) -> None:
        """A Thinking toggle over each reply that has reasoning (from its
        first reasoning token on), showing the reply as it is now; Qt keeps
        it in place and drops it with its row. (QTreeView skips a change
        while a layout is pending, as it is just after a row came: its
        toggle is told here, every time.)"""
        model = self.model()
        for row in range(max(0, first), last + 1):
            index = model.index(row, 0)
            if not self.delegate.has_thinking(index.data(MessageRole)):
                continue
            if self.isPersistentEditorOpen(index):
                self.delegate.setEditorData(self.indexWidget(index), index)
            else:
                self.openPersistentEditor(index)
        if first < model.rowCount() - 1:
            # A row above others changed (a section opened): the toggles
            # below it move with their bubbles. (The last row, streaming,
            # grows downwards: nothing under it moves.)
            self.updateEditorGeometries()

    def thinking_toggle(self, row: int) -> ThinkingToggle | None:
        """The Thinking toggle over a row's bubble, if it has one."""
        widget = self.indexWidget(self.model().index(row, 0))
        return widget if isinstance(widget, ThinkingToggle) else None

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
        for label, text, said in self.copy_actions(msg):
            menu.addAction(label, lambda t=text, s=said: self._copy(t, s))
        menu.exec(event.globalPos())

    @staticmethod
    def copy_actions(msg: ChatMessage) -> list[tuple[str, str, str]]:
        """What a message's menu copies: (label, text, what the status line
        says). A reply's answer alone; its reasoning on its own line."""
        if not msg.reasoning:
            return [("Copy message", msg.text, "Message copied to the clipboard")]
        return [("Copy answer", msg.text, "Answer copied to the clipboard"),
                ("Copy thinking", msg.reasoning, "Thinking copied to the clipboard")]

    def _copy(self, text: str, said: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(said)

    def event(self, e) -> bool:
        if e.type() == QEvent.Type.PaletteChange:
            self.delegate.clear_cache()
        return super().event(e)
