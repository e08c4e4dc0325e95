"""Markdown -> QTextDocument for chat bubbles.

Qt's own Markdown reader (md4c) handles the prose. Fenced code blocks are
cut out first and drawn by hand: a tinted monospace frame with a header
holding the language and a "Copy" link (``copy:N``), so the chat view can
copy exactly the code, not the rendered text. A fence that is still open
(the reply is streaming) is shown as code up to the end of the text.

Colour tokens tints the *rendered* document (``tint_origins``): each
character on screen is traced back to the character of the reply it came
from (code verbatim, prose by ``align``), so code blocks, inline code and
lists look exactly as without it, only with their backgrounds tinted by
where each token came from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QFontInfo,
    QImage,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFrameFormat,
)

COPY_SCHEME = "copy:"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
_MD_FEATURES = (QTextDocument.MarkdownFeature.MarkdownDialectGitHub
                | QTextDocument.MarkdownFeature.MarkdownNoHTML)


@dataclass(frozen=True)
class Segment:
    kind: str  # "text" or "code"
    text: str
    lang: str = ""
    start: int = field(default=0, compare=False)
    """Where ``text`` begins in the source: it is always a verbatim slice of it."""


@dataclass(frozen=True)
class DocColors:
    text: QColor
    code_bg: QColor
    code_header: QColor
    link: QColor

    @classmethod
    def of(cls, colors) -> DocColors:
        """A reply's colours in a theme (theme.Colors)."""
        return cls(colors.text, colors.code_bg, colors.code_header, colors.link)


def split_segments(text: str) -> list[Segment]:
    """Prose and fenced code, in order, each with its offset in ``text``."""
    segments: list[Segment] = []
    prose: list[str] = []
    code: list[str] = []
    fence = ""
    lang = ""
    pos = prose_start = code_start = 0
    for line in text.split("\n"):
        line_start, pos = pos, pos + len(line) + 1
        if not fence:
            m = _FENCE.match(line)
            if m:
                if prose:
                    segments.append(Segment("text", "\n".join(prose), start=prose_start))
                    prose = []
                fence, lang, code, code_start = m.group(1), m.group(2), [], min(pos, len(text))
            else:
                if not prose:
                    prose_start = line_start
                prose.append(line)
        elif line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            segments.append(Segment("code", "\n".join(code), lang, code_start))
            fence = ""
        else:
            code.append(line)
    if fence:  # still streaming: the fence is not closed yet
        while code and not code[-1].strip():
            code.pop()
        segments.append(Segment("code", "\n".join(code), lang, code_start))
    elif prose and "\n".join(prose).strip():
        segments.append(Segment("text", "\n".join(prose), start=prose_start))
    return [s for s in segments if s.kind == "code" or s.text.strip()]


# A paragraph break: a blank line followed by text at column 0 (so indented
# list continuations and indented code stay with what they belong to).
_PARA_BREAK = re.compile(r"\n[ \t]*\n(?=\S)")
# In plain text (a reasoning) any blank line ends a paragraph.
_BLANK_LINE = re.compile(r"\n[ \t]*\n(?=[ \t]*\S)")


def split_chunks(text: str) -> list[Segment]:
    """Segments, with prose further cut at paragraph breaks: the units a
    reply is rendered in. While a reply streams only its last chunk changes,
    so only that one is rendered again."""
    out: list[Segment] = []
    for seg in split_segments(text):
        if seg.kind == "code":
            out.append(seg)
            continue
        at = 0
        for brk in [*_PARA_BREAK.finditer(seg.text), None]:
            end = brk.start() if brk is not None else len(seg.text)
            part = seg.text[at:end]
            if part.strip():
                lead = len(part) - len(part.lstrip("\n"))
                out.append(Segment("text", part.strip("\n").rstrip(), start=seg.start + at + lead))
            if brk is not None:
                at = brk.end()
    return out


class Paragraphs:
    """A growing plain text (a reply's reasoning) cut at its paragraph
    breaks, as ``split_chunks`` cuts prose, but kept between updates: text
    that only grew is cut again from its last paragraph on, so the
    paragraphs before it stay the same objects and a long reasoning costs
    each update its last paragraph, not its length."""

    def __init__(self):
        self.text = ""
        self.closed: list[Segment] = []  # paragraphs a later break has ended
        self._open_at = 0  # where the last, still open paragraph begins

    def update(self, text: str) -> list[Segment]:
        """The paragraphs of ``text`` (each with its offset)."""
        if not text.startswith(self.text):  # not an append: start over
            self.closed, self._open_at = [], 0
        self.text = text
        for brk in _BLANK_LINE.finditer(text, self._open_at):
            self._add(self.closed, self._open_at, brk.start())
            self._open_at = brk.end()
        last: list[Segment] = []
        self._add(last, self._open_at, len(text))
        return self.closed + last

    def _add(self, out: list[Segment], start: int, end: int) -> None:
        part = self.text[start:end]
        if part.strip():
            lead = len(part) - len(part.lstrip("\n"))
            out.append(Segment("text", part.strip("\n").rstrip(), start=start + lead))


def plain_document(text: str, font: QFont, color: QColor) -> QTextDocument:
    """``text`` shown as it is (a reply's reasoning), in ``color``; like
    ``build_document``'s, it loads nothing, and Colour tokens tints it
    (``tint_origins``: its text is drawn verbatim)."""
    doc = ReplyDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    doc.setPlainText(text)
    fmt = QTextCharFormat()
    fmt.setForeground(color)
    _merge(doc, [(0, len(text), fmt)])
    doc.placements = [Placement("code", 0, text, 0, len(text))]
    return doc


def code_font() -> QFont:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


@functools.cache
def code_family() -> str:
    """The real family behind the system fixed font (resolved once: asking
    the font database costs milliseconds)."""
    return QFontInfo(code_font()).family()


@dataclass(frozen=True)
class Placement:
    """Where one segment of the source landed in the document: its text
    starts at ``src`` in the source and is drawn from ``start`` to ``end``
    (code: its body, verbatim, after the header line)."""

    kind: str
    src: int
    text: str
    start: int
    end: int


class ReplyDocument(QTextDocument):
    """A document of untrusted text that loads nothing: Qt would otherwise
    read a Markdown image (``![x](file:///home/me/photo.png)`` or a bare
    path) from disk and show it. Every resource is one transparent pixel (an
    empty answer would make Qt try the path itself); raw HTML is text anyway
    (``MarkdownNoHTML``). ``placements`` say where each segment of the
    source was drawn, for ``tint_origins``."""

    placements: list[Placement]

    def loadResource(self, _type: int, _name) -> QImage:  # noqa: N802 - Qt override
        blank = QImage(1, 1, QImage.Format.Format_ARGB32)
        blank.fill(0)
        return blank


def build_document(text: str, font: QFont, colors: DocColors) -> tuple[QTextDocument, list[str]]:
    """The rendered document and the code blocks its ``copy:N`` links refer to.
    Used for every model reply (chat bubbles and Compare): HTML in the text
    stays text, and no file or image is loaded."""
    doc = ReplyDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    doc.setDefaultStyleSheet(f"a {{ color: {colors.link.name()}; }}")
    cursor = QTextCursor(doc)
    blocks: list[str] = []
    doc.placements = []
    first = True
    segs = split_segments(text)
    for seg in segs:
        if seg.kind == "text":
            if not first:
                cursor.insertBlock()
            start = cursor.position()
            body = seg.text.strip("\n")
            cursor.insertMarkdown(body, _MD_FEATURES)
            _style_inline_code(doc, colors, start, cursor.position())
            lead = len(seg.text) - len(seg.text.lstrip("\n"))
            doc.placements.append(Placement("text", seg.start + lead, body, start,
                                            cursor.position()))
        else:
            start = _insert_code(doc, cursor, seg, len(blocks), font, colors, first)
            doc.placements.append(Placement("code", seg.start, seg.text, start,
                                            start + len(seg.text)))
            blocks.append(seg.text)
        cursor = doc.rootFrame().lastCursorPosition()
        first = False
    if segs and segs[0].kind == "code":
        # The document's first block sits before the first frame: flatten it
        # so a reply that starts with code does not start with a blank line.
        _flatten(QTextCursor(doc))
    if segs and segs[-1].kind == "code":
        # Qt always keeps an (empty) block after a frame; flatten it so a
        # reply that ends in code does not end in a blank line.
        _flatten(cursor)
    return doc, blocks


def _flatten(cursor: QTextCursor) -> None:
    """Make the (empty) block at ``cursor`` take no height."""
    fmt = QTextBlockFormat()
    fmt.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
    cursor.setBlockFormat(fmt)
    small = QTextCharFormat()
    small.setFontPointSize(1)
    cursor.setBlockCharFormat(small)


def _style_inline_code(doc: QTextDocument, colors: DocColors, start: int, end: int) -> None:
    """md4c marks `inline code` as fixed pitch with the family "monospace",
    which is not a real font on every system: use the system fixed font and
    tint it like a code block."""
    spans = []
    block = doc.findBlock(start)
    while block.isValid() and block.position() <= end:
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.fontFixedPitch() and not fmt.isAnchor():
                spans.append((frag.position(), frag.length()))
            it += 1
        block = block.next()
    fmt = QTextCharFormat()
    fmt.setFontFamilies([code_family()])
    fmt.setBackground(colors.code_bg)
    _merge(doc, [(pos, pos + length, fmt) for pos, length in spans])


def _merge(doc: QTextDocument, spans: Sequence[tuple[int, int, QTextCharFormat]]) -> None:
    """Merge each (start, end, format) into ``doc`` in one edit block: one
    relayout at the end, not one per span."""
    if not spans:
        return
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for a, b, fmt in spans:
        cursor.setPosition(a)
        cursor.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(fmt)
    cursor.endEditBlock()


def _insert_code(doc: QTextDocument, cursor: QTextCursor, seg: Segment, n: int, font: QFont,
                 colors: DocColors, first: bool) -> int:
    """The code block's frame; returns where its body (the code) begins."""
    frame = QTextFrameFormat()
    frame.setBackground(colors.code_bg)
    frame.setPadding(8)
    frame.setBorder(0)
    frame.setTopMargin(0 if first else 6)
    frame.setBottomMargin(2)
    cursor.insertFrame(frame)
    header = QTextCharFormat()
    header.setFont(font)
    header.setFontPointSize(max(7.0, font.pointSizeF() * 0.85))
    header.setForeground(colors.code_header)
    cursor.insertText((seg.lang or "code") + "    ", header)
    link = QTextCharFormat(header)
    link.setForeground(colors.link)
    link.setAnchor(True)
    link.setAnchorHref(f"{COPY_SCHEME}{n}")
    cursor.insertText("Copy", link)
    mono = QTextCharFormat()
    mono.setFont(code_font())
    mono.setForeground(colors.text)
    gap = QTextBlockFormat()
    gap.setBottomMargin(4)
    cursor.setBlockFormat(gap)  # the header line
    cursor.insertBlock(QTextBlockFormat(), mono)
    body = cursor.position()
    # One call for the whole block: insertText turns "\n" into new blocks,
    # which inherit the plain format above (a call per line costs ~10x).
    cursor.insertText(seg.text, mono)
    return body


# -- colour by origin ----------------------------------------------------------

_FRAME_MARKS = "\ufdd0\ufdd1"  # QTextDocument's frame and table-cell boundaries
_BREAKS = "\u2029\u2028"  # paragraph and line separators in a document's raw text
LOOKAHEAD = 256  # how far markup (a link's address, say) may push a character


def align(source: str, rendered: str) -> list[int]:
    """For each character of ``rendered`` (a document's raw text), the index
    of the ``source`` character it shows, or -1 (a list bullet, a frame
    boundary). Markdown only removes characters (markup) or turns them into
    whitespace, so a greedy walk that matches each shown character with the
    next equal one in the source finds the right one; whitespace matches
    whitespace across markup only (``- ``, ``#``, ``|``), never across words."""
    out: list[int] = []
    append = out.append
    i, n = 0, len(source)
    for ch in rendered:
        if i < n and source[i] == ch:  # most characters: the very next one
            append(i)
            i += 1
        elif ch in _FRAME_MARKS:
            append(-1)
        elif ch.isspace() or ch in _BREAKS:
            k, limit = i, min(n, i + 16)
            while k < limit and not source[k].isspace() and not source[k].isalnum():
                k += 1
            if k < limit and source[k].isspace():
                append(k)
                i = k + 1
            else:
                append(-1)
        else:
            k = source.find(ch, i, i + LOOKAHEAD)
            if k >= 0:
                append(k)
                i = k + 1
            else:
                append(-1)
    return out


def origin_spans(runs: Sequence[Sequence[str]]) -> list[tuple[int, int, str]]:
    """(start, end, origin) in the reply's text for every run not the
    target's own: what Colour tokens tints."""
    spans, at = [], 0
    for origin, text in runs:
        if origin != "target" and text:
            spans.append((at, at + len(text), origin))
        at += len(text)
    return spans


def spans_within(spans: Sequence[tuple[int, int, str]], start: int, end: int
                 ) -> tuple[tuple[int, int, str], ...]:
    """The part of ``spans`` inside [start, end), relative to ``start``."""
    return tuple((max(a, start) - start, min(b, end) - start, o) for a, b, o in spans
                 if a < end and b > start)


def spans_per_range(spans: Sequence[tuple[int, int, str]], ranges: Sequence[tuple[int, int]]
                    ) -> list[tuple[tuple[int, int, str], ...]]:
    """``spans_within`` for each of several ranges, in one walk: both lists
    are in text order, so a long reply's thousands of runs are visited about
    once per update, not once per paragraph."""
    out = []
    first = 0
    for start, end in ranges:
        while first < len(spans) and spans[first][1] <= start:
            first += 1
        last = first
        while last < len(spans) and spans[last][0] < end:
            last += 1
        out.append(spans_within(spans[first:last], start, end))
    return out


def tint_origins(doc: QTextDocument, spans: Sequence[tuple[int, int, str]],
                 color_of: Callable[[str], QColor | None]) -> int:
    """Give every character drawn from a source span the background
    ``color_of(origin)`` (None: leave it). ``spans`` are offsets in the text
    ``doc`` was built from (``build_document``); fonts, frames and lists are
    untouched. Returns how many characters were tinted."""
    if not spans or not getattr(doc, "placements", None):
        return 0
    raw = doc.toRawText()
    ranges: list[tuple[int, int, str]] = []  # document positions to tint
    for place in doc.placements:
        rel = spans_within(spans, place.src, place.src + len(place.text))
        if not rel:
            continue
        if place.kind == "code":  # drawn verbatim ("\n" is a block break, one position too)
            found = [(place.start + a, place.start + b, o) for a, b, o in rel]
        else:
            to_doc = [-1] * len(place.text)
            for j, src in enumerate(align(place.text, raw[place.start:place.end])):
                if src >= 0:
                    to_doc[src] = place.start + j
            found = []
            for a, b, o in rel:
                first = next((to_doc[x] for x in range(a, b) if to_doc[x] >= 0), -1)
                if first >= 0:  # else: all markup (a "**" token), nothing shown
                    last = next(to_doc[x] for x in range(b - 1, a - 1, -1) if to_doc[x] >= 0)
                    found.append((first, last + 1, o))
        for a, b, o in found:
            if ranges and ranges[-1][1] == a and ranges[-1][2] == o:
                ranges[-1] = (ranges[-1][0], b, o)
            else:
                ranges.append((a, b, o))

    @functools.cache  # one format per origin
    def tint(origin: str) -> QTextCharFormat | None:
        color = color_of(origin)
        fmt = QTextCharFormat() if color is not None else None
        if fmt is not None:
            fmt.setBackground(color)
        return fmt

    tinted = [(a, b, fmt) for a, b, origin in ranges if (fmt := tint(origin)) is not None]
    _merge(doc, tinted)
    return sum(b - a for a, b, _ in tinted)
