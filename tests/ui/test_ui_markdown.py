"""Markdown rendering for chat bubbles: fenced code is cut out (copyable),
an unclosed fence while streaming is still code, inline code is monospace."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QFontMetricsF
from specchat.ui.markdown import COPY_SCHEME, DocColors, build_document, split_segments

COLORS = DocColors(QColor("black"), QColor("#eeeeee"), QColor("gray"), QColor("blue"))


def test_split_segments():
    text = "Intro **bold**\n\n```python\ndef f():\n    return 1\n```\nAfter `x`.\n\n~~~\nraw\n"
    segs = split_segments(text)
    assert [s.kind for s in segs] == ["text", "code", "text", "code"]
    assert segs[1].lang == "python" and segs[1].text == "def f():\n    return 1"
    assert segs[3].text == "raw"  # unclosed: streaming, trailing blank line dropped


def test_document_has_copy_links_and_monospace(qapp):
    doc, blocks = build_document("Use `sorted`:\n\n```py\nsorted(xs)\n```", QFont(), COLORS)
    assert blocks == ["sorted(xs)"]
    html = doc.toHtml()
    assert f'href="{COPY_SCHEME}0"' in html
    plain = doc.toPlainText()
    assert "Use sorted:" in plain and "sorted(xs)" in plain and "Copy" in plain
    mono = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.text() == "sorted":
                mono.append(_fixed_pitch(frag.charFormat().font()))
            it += 1
        block = block.next()
    assert mono == [True]  # inline code resolves to a real fixed-pitch font


def _fixed_pitch(font: QFont) -> bool:
    """Every glyph as wide as every other, measured in the font Qt really
    uses. Not QFontInfo.fixedPitch(): that is fontconfig's spacing flag,
    which is "dual", so False, for Noto Sans Mono, a monospace font."""
    metrics = QFontMetricsF(font)
    return len({metrics.horizontalAdvance(c) for c in "iIl1.mMW0 _"}) == 1


def test_no_html_injection(qapp):
    doc, _ = build_document("Include <vector> and <b>this</b>", QFont(), COLORS)
    assert "<vector>" in doc.toPlainText()
