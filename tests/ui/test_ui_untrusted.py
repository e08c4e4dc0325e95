"""A model's reply is untrusted text: in the chat and in Compare, HTML in it
stays text, no file or image is loaded, and only http(s) links open (a
click on any other is refused in the status line)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QGuiApplication,
    QImage,
    QTextDocument,
)
from PySide6.QtTest import QTest
from specchat.engine.events import GenerationResult, Summary
from specchat.ui.chat_model import ChatMessage
from specchat.ui.compare import CompareDialog
from specchat.ui.compare_runner import CompareOutcome
from specchat.ui.markdown import DocColors, build_document
from ui_support import link_at, make_view

REFUSED = ["file:///etc/passwd", "javascript:alert(1)", "data:text/html,<b>x</b>",
           "smb://server/share", "myapp://do-something", "https:no-host", "relative/page.html"]
OPENED = ["https://example.com/a?b=1", "http://example.org/"]

REPLY = ('Raw <img src="file:///etc/hosts"> and <a href="file:///etc/passwd">here</a> '
         "and <b>not bold</b>, but **bold**.")


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """What QDesktopServices was asked to open (nothing really opens)."""
    calls: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl",
                        staticmethod(lambda url: calls.append(url.toString()) or True))
    return calls


def _anchors(view, rect) -> dict[str, QPoint]:
    """Where each link of the message in ``rect`` is drawn."""
    found: dict[str, QPoint] = {}
    for y in range(rect.top(), rect.bottom(), 3):
        for x in range(rect.left(), rect.right(), 4):
            href = link_at(view, QPoint(x, y))
            if href and href not in found:
                found[href] = QPoint(x, y)
    return found


def test_chat_opens_only_http_and_https_links(qtbot, qapp, opened):
    model, view = make_view(qtbot, 900, 900)
    text = "\n\n".join(f"[link {i}]({href})" for i, href in enumerate(REFUSED + OPENED))
    model.set_messages([ChatMessage("assistant", text)])
    qapp.processEvents()
    where = _anchors(view, view.visualRect(model.index(0)))
    assert set(where) == set(REFUSED + OPENED), where
    for href in REFUSED:
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=where[href])
        assert opened == [], href
    notices: list[str] = []
    view.notice.connect(notices.append)  # the status line says why nothing opened
    QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=where[REFUSED[0]])
    assert notices == ["Link not opened: only http and https links open from a reply "
                       "(file:///etc/passwd)"]
    for href in OPENED:
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=where[href])
        assert QUrl(opened[-1]) == QUrl(href)
    assert len(opened) == len(OPENED)


def test_a_copy_link_the_model_wrote_copies_nothing(qtbot, qapp, opened):
    """A reply may write links that look like a code block's Copy link
    ("copy:N"); one that names no code block of the reply does nothing: no
    error, nothing copied, nothing opened, no status line."""
    model, view = make_view(qtbot, 900, 900)
    model.set_messages([ChatMessage("assistant", "[a](copy:abc)\n\n[b](copy:7)")])
    qapp.processEvents()
    where = _anchors(view, view.visualRect(model.index(0)))
    assert set(where) == {"copy:abc", "copy:7"}, where
    QGuiApplication.clipboard().setText("before")
    said: list[str] = []
    view.copied.connect(said.append)
    view.notice.connect(said.append)
    for pos in where.values():
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert said == [] and opened == []
    assert QGuiApplication.clipboard().text() == "before"


def _result(text: str) -> GenerationResult:
    summary = Summary(mode="plain", finish_reason="stop", new_tokens=3, steps=3, drafted=0,
                      accepted=0, acceptance_rate=0.0, tokens_per_step=1.0, tokens_per_s=10.0,
                      ttft_s=0.1, wall_s=0.3, prompt_tokens=4, reused_prompt_tokens=0,
                      prefill_s=0.1, forward_s=0.2, overhead_s=0.0)
    return GenerationResult(text=text, token_ids=(1, 2, 3), summary=summary)


def _has_image(doc: QTextDocument) -> bool:
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            if it.fragment().charFormat().isImageFormat():
                return True
            it += 1
        block = block.next()
    return False


def test_compare_renders_markdown_without_html_and_opens_only_http(qtbot, opened):
    dlg = CompareDialog(runner=None)
    qtbot.addWidget(dlg)
    code = "print('<b>')"
    dlg.show_outcome(CompareOutcome("p", _result(REPLY), _result(f"```python\n{code}\n```"),
                                    greedy=True))
    shown = dlg.plain_text.toPlainText()
    assert '<img src="file:///etc/hosts">' in shown and "<b>not bold</b>" in shown
    assert '<a href="file:///etc/passwd">here</a>' in shown
    assert not _has_image(dlg.plain_text.document())
    assert "**" not in shown and "<b>bold</b>" not in dlg.plain_text.toHtml()  # Markdown works
    assert code in dlg.spec_text.toPlainText() and "Copy" in dlg.spec_text.toPlainText()

    for href in REFUSED:
        dlg.plain_text.anchorClicked.emit(QUrl(href))
        assert opened == [] and "not opened" in dlg.status.text()
    dlg.plain_text.anchorClicked.emit(QUrl(OPENED[0]))
    assert QUrl(opened[-1]) == QUrl(OPENED[0])
    dlg.spec_text.anchorClicked.emit(QUrl("copy:0"))  # the code block's Copy link
    assert QGuiApplication.clipboard().text() == code and len(opened) == 1


def test_a_markdown_image_loads_no_file(qapp, tmp_path):
    picture = tmp_path / "private.png"
    image = QImage(40, 30, QImage.Format.Format_RGB32)
    image.fill(QColor("red"))
    assert image.save(str(picture))
    colors = DocColors(QColor("black"), QColor("#eee"), QColor("gray"), QColor("blue"))
    for src in (picture.as_uri(), str(picture)):
        doc, _ = build_document(f"Look: ![secret]({src})", QFont(), colors)
        doc.setTextWidth(400)
        doc.size()  # lays it out, which is when Qt asks for images
        got = doc.resource(QTextDocument.ResourceType.ImageResource, QUrl(src))
        assert got.width() <= 1 and got.height() <= 1, src
