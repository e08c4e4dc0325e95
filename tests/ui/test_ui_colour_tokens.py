"""Colour tokens tints the rendered reply and changes nothing else: code
blocks stay framed monospace code (no raw ``` fences), inline code and lists
stay as they are, and each tint sits on the characters its token wrote, in
its source's colour."""

from __future__ import annotations

import re

import pytest
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QTextCursor, QTextDocument, QTextFrame
from specchat.ui import theme
from specchat.ui.chat_model import ChatMessage
from specchat.ui.markdown import (
    align,
    build_document,
    code_family,
    origin_spans,
    spans_per_range,
    spans_within,
    split_chunks,
)
from ui_support import make_view

REPLY = """Here is a function that uses `sorted` to order the words:

```python
def sort_words(words):
    \"\"\"Sort case-insensitively.\"\"\"
    return sorted(words, key=str.lower)
```

Why it works:

- **Fast**: one pass over the list
- Stable for equal keys
- Works with `str.casefold` too

Call `sort_words(["b", "A"])`."""

# Which source wrote which token (what the engine's StepEvent.origins say).
CHOSEN = {"sorted": "history", "return": "conversation", "Fast": "draft", "Stable": "target",
          "casefold": "lookup"}  # "lookup": an origin this version does not know
CYCLE = ("target", "draft", "target", "conversation", "draft", "history", "head")


def _runs(text: str) -> list[list[str]]:
    """The reply cut into token-like pieces, each with an origin, merged into
    runs the way ChatMessage keeps them."""
    runs: list[list[str]] = []
    for i, m in enumerate(re.finditer(r"\w+|\s+|[^\w\s]+", text)):
        origin = CHOSEN.get(m.group(), CYCLE[i % len(CYCLE)])
        if runs and runs[-1][0] == origin:
            runs[-1][1] += m.group()
        else:
            runs.append([origin, m.group()])
    return runs


def _reply() -> ChatMessage:
    runs = _runs(REPLY)
    assert "".join(t for _, t in runs) == REPLY
    return ChatMessage("assistant", REPLY, runs=runs)


def _chunks(view, msg):
    return view.delegate.rendered(msg).chunks


def _fmt_at(doc: QTextDocument, pos: int):
    cursor = QTextCursor(doc)
    cursor.setPosition(pos + 1)  # the format of the character before the cursor
    return cursor.charFormat()


def _find(chunks, word: str):
    """(doc, position) of the first chunk whose rendered text shows ``word``."""
    for chunk in chunks:
        raw = chunk.doc.toRawText()
        if word in raw:
            return chunk.doc, raw.index(word)
    raise AssertionError(f"{word!r} is not shown")


def _fixed_pitch(font: QFont) -> bool:
    """Every glyph as wide as every other, in the font Qt really uses."""
    metrics = QFontMetricsF(font)
    return len({metrics.horizontalAdvance(c) for c in "iIl1.mMW0 _"}) == 1


def _frames(doc: QTextDocument) -> list[QTextFrame]:
    return [f for f in doc.rootFrame().childFrames()]


@pytest.fixture
def view(qtbot):
    model, view = make_view(qtbot, 900, 700)
    return model, view


def test_colour_tokens_keeps_the_markdown_and_tints_each_source(view):
    model, chat = view
    msg = _reply()
    model.append(msg)
    plain = _chunks(chat, msg)
    chat.set_color_tokens(True)
    model.refresh_all()
    tinted = _chunks(chat, msg)
    colors = chat.delegate.colors

    # The same rendering: the same chunks, the same text on screen, and the
    # code block in its frame with the code font; no fence is shown.
    assert [c.key[:3] for c in tinted] == [c.key[:3] for c in plain]
    assert [c.doc.toRawText() for c in tinted] == [c.doc.toRawText() for c in plain]
    assert not any("```" in c.doc.toPlainText() for c in tinted)
    code = next(c for c in tinted if c.key[0] == "code")
    frames = _frames(code.doc)
    assert len(frames) == 1 and frames[0].frameFormat().background().color() == colors.code_bg
    assert code.code_blocks == ['def sort_words(words):\n    """Sort case-insensitively."""\n'
                                '    return sorted(words, key=str.lower)']
    doc, at = _find(tinted, "return sorted")
    fmt = _fmt_at(doc, at)
    assert fmt.font() == _fmt_at(_find(plain, "return sorted")[0], at).font()
    assert _fixed_pitch(fmt.font())
    assert fmt.background().color() == theme.origin_color(colors, "conversation")  # "return": conversation

    # Inline code stays monospace; its tint is its source's.
    doc, at = _find(tinted, "sorted to order")
    fmt = _fmt_at(doc, at)
    assert code_family() in fmt.fontFamilies() and _fixed_pitch(fmt.font())
    assert fmt.background().color() == theme.origin_color(colors, "history")
    # A list item keeps its list and its bold; "Fast" came from the draft model.
    doc, at = _find(tinted, "Fast")
    assert doc.findBlock(at).textList() is not None
    fmt = _fmt_at(doc, at)
    assert fmt.fontWeight() >= 600 and fmt.background().color() == theme.origin_color(colors, "draft")
    # The target's own words are not tinted, nor an origin this version does
    # not know (it is not counted as the draft model's).
    doc, at = _find(tinted, "Stable")
    assert doc.findBlock(at).textList() is not None
    assert _fmt_at(doc, at).background().style().name == "NoBrush"
    doc, at = _find(tinted, "casefold")  # inline code: its own background, untinted
    assert _fmt_at(doc, at).background() == _fmt_at(_find(plain, "casefold")[0], at).background()

    # Every tinted character carries the colour of the token it shows.
    spans = origin_spans(msg.runs)
    for chunk, c in zip(tinted, split_chunks(REPLY), strict=True):
        raw = chunk.doc.toRawText()
        rel = spans_within(spans, c.start, c.start + len(c.text))
        origin_at = [None] * len(c.text)
        for a, b, o in rel:
            origin_at[a:b] = [o] * (b - a)
        if c.kind == "code":
            start = raw.index(c.text[:10])
            where = [(start + i, i) for i in range(len(c.text))]
        else:
            where = [(j, s) for j, s in enumerate(align(c.text, raw)) if s >= 0]
        checked = 0
        for pos, s in where:
            assert raw[pos] == c.text[s] or (raw[pos] in "\u2029\u2028" and c.text[s] == "\n")
            if raw[pos] in "\u2029\u2028":
                continue  # a line break: nothing on screen to tint
            want = theme.origin_color(colors, origin_at[s]) if origin_at[s] else None
            got = _fmt_at(chunk.doc, pos).background()
            if want is None:
                assert got.style().name == "NoBrush" or got.color() in (colors.code_bg,)
            else:
                assert got.color() == want, (c.text[s], origin_at[s])
            checked += 1
        assert checked > 0.8 * len(c.text.replace("*", "").replace("`", "").replace("\n", ""))


def test_a_streaming_reply_keeps_its_open_code_block_as_code(view):
    model, chat = view
    chat.set_color_tokens(True)
    text = "Sure:\n\n```python\ndef f(x):\n    return x"  # the fence is not closed yet
    msg = ChatMessage("assistant", text, runs=_runs(text), streaming=True, complete=False)
    model.append(msg)
    chunks = _chunks(chat, msg)
    assert [c.key[0] for c in chunks] == ["text", "code"]
    assert "```" not in chunks[1].doc.toPlainText() and len(_frames(chunks[1].doc)) == 1
    assert chunks[1].key[3]  # tinted
    doc, at = _find(chunks, "return x")
    assert _fmt_at(doc, at).background().color() != QColor(0, 0, 0, 0)


def test_chunks_are_verbatim_slices_of_the_reply():
    texts = [REPLY, "a\n\n\n\nb", "```\nx\n```", "x\n```py\nopen", "\n\nlead\n\n  - i\n\n~~~\n~~~\n",
             "```\n", "p\n\n    code\n\nq"]
    for text in texts:
        for c in split_chunks(text):
            assert text[c.start:c.start + len(c.text)] == c.text, (text, c)


def test_align_traces_rendered_markdown_to_its_source(qapp):
    src = ("Some **bold**, `code`, [a link](https://example.com/x) and *more*.\n\n"
           "1. first\n2. second item\n\n# Heading\n\nend")
    doc, _ = build_document(src, QFont(), _doc_colors())
    raw = doc.toRawText()
    where = align(src, raw)
    shown = [(raw[j], src[s]) for j, s in enumerate(where) if s >= 0]
    assert all(r == s or (r.isspace() or r in "\u2029\u2028") and s.isspace() for r, s in shown)
    letters = [j for j, ch in enumerate(raw) if ch.isalnum()]
    assert sum(where[j] >= 0 for j in letters) == len(letters)  # every word found
    assert src[where[raw.index("second")]:].startswith("second")
    assert src[where[raw.index("Heading")]:].startswith("Heading")


def test_spans_per_range_equals_spans_within():
    runs = _runs(REPLY)
    spans = origin_spans(runs)
    ranges = [(c.start, c.start + len(c.text)) for c in split_chunks(REPLY)]
    assert spans_per_range(spans, ranges) == [spans_within(spans, a, b) for a, b in ranges]
    assert origin_spans([["target", "ab"], ["draft", "cd"], ["history", ""], ["x", "e"]]) == \
        [(2, 4, "draft"), (4, 5, "x")]


def _doc_colors():
    from specchat.ui.markdown import DocColors

    c = theme.LIGHT
    return DocColors(c.text, c.code_bg, c.code_header, c.link)
