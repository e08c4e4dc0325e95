"""Markdown -> QTextDocument for chat bubbles.

Qt's own Markdown reader (md4c) handles the prose. Fenced code blocks are
cut out first and drawn by hand: a tinted monospace frame with a header
holding the language and a "Copy" link (``copy:N``), so the chat view can
copy exactly the code, not the rendered text. A fence that is still open
(the reply is streaming) is shown as code up to the end of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class DocColors:
    text: QColor
    code_bg: QColor
    code_header: QColor
    link: QColor


def split_segments(text: str) -> list[Segment]:
    """Prose and fenced code, in order."""
    segments: list[Segment] = []
    prose: list[str] = []
    code: list[str] = []
    fence = ""
    lang = ""
    for line in text.split("\n"):
        if not fence:
            m = _FENCE.match(line)
            if m:
                if prose:
                    segments.append(Segment("text", "\n".join(prose)))
                    prose = []
                fence, lang, code = m.group(1), m.group(2), []
            else:
                prose.append(line)
        elif line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            segments.append(Segment("code", "\n".join(code), lang))
            fence = ""
        else:
            code.append(line)
    if fence:  # still streaming: the fence is not closed yet
        while code and not code[-1].strip():
            code.pop()
        segments.append(Segment("code", "\n".join(code), lang))
    elif prose and "\n".join(prose).strip():
        segments.append(Segment("text", "\n".join(prose)))
    return [s for s in segments if s.kind == "code" or s.text.strip()]


# A paragraph break: a blank line followed by text at column 0 (so indented
# list continuations and indented code stay with what they belong to).
_PARA_BREAK = re.compile(r"\n[ \t]*\n(?=\S)")


def split_chunks(text: str) -> list[Segment]:
    """Segments, with prose further cut at paragraph breaks: the units a
    reply is rendered in. While a reply streams only its last chunk changes,
    so only that one is rendered again."""
    out: list[Segment] = []
    for seg in split_segments(text):
        if seg.kind == "code":
            out.append(seg)
            continue
        out.extend(Segment("text", part.strip("\n").rstrip())
                   for part in _PARA_BREAK.split(seg.text) if part.strip())
    return out


_code_family: str | None = None


def code_font() -> QFont:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


def code_family() -> str:
    """The real family behind the system fixed font (resolved once: asking
    the font database costs milliseconds)."""
    global _code_family
    if _code_family is None:
        _code_family = QFontInfo(code_font()).family()
    return _code_family


class ReplyDocument(QTextDocument):
    """A document of untrusted text that loads nothing: Qt would otherwise
    read a Markdown image (``![x](file:///home/me/photo.png)`` or a bare
    path) from disk and show it. Every resource is one transparent pixel (an
    empty answer would make Qt try the path itself); raw HTML is text anyway
    (``MarkdownNoHTML``)."""

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
    first = True
    segs = split_segments(text)
    for seg in segs:
        if seg.kind == "text":
            if not first:
                cursor.insertBlock()
            start = cursor.position()
            cursor.insertMarkdown(seg.text.strip("\n"), _MD_FEATURES)
            _style_inline_code(doc, colors, start, cursor.position())
        else:
            _insert_code(doc, cursor, seg, len(blocks), font, colors, first)
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
    if not spans:
        return
    fmt = QTextCharFormat()
    fmt.setFontFamilies([code_family()])
    fmt.setBackground(colors.code_bg)
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()  # one relayout at the end, not one per span
    for pos, length in spans:
        cursor.setPosition(pos)
        cursor.setPosition(pos + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(fmt)
    cursor.endEditBlock()


def _insert_code(doc: QTextDocument, cursor: QTextCursor, seg: Segment, n: int, font: QFont,
                 colors: DocColors, first: bool) -> None:
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
    # One call for the whole block: insertText turns "\n" into new blocks,
    # which inherit the plain format above (a call per line costs ~10x).
    cursor.insertText(seg.text, mono)


def build_runs_document(runs: list[tuple[str, str]], font: QFont, colors: DocColors,
                        draft_bg: QColor) -> QTextDocument:
    """The reply as plain text with every accepted draft token tinted: the
    "colour by origin" view. Markdown is not rendered here on purpose, so
    token boundaries stay visible."""
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    cursor = QTextCursor(doc)
    target_fmt = QTextCharFormat()
    target_fmt.setForeground(colors.text)
    draft_fmt = QTextCharFormat(target_fmt)
    draft_fmt.setBackground(draft_bg)
    for origin, text in runs:
        fmt = draft_fmt if origin == "draft" else target_fmt
        parts = text.split("\n")
        for i, part in enumerate(parts):
            if i:
                cursor.insertBlock()
            if part:
                cursor.insertText(part, fmt)
    return doc
