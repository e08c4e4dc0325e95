"""Composer keys and the chat view's Copy links."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from specchat.ui.chat_model import ChatMessage
from specchat.ui.composer import Composer
from ui_support import link_at, make_view


def test_enter_sends_and_shift_enter_adds_a_line(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    sent: list[str] = []
    c.sendRequested.connect(sent.append)
    c.set_state(generating=False, can_send=True, has_turn=False)
    c.edit.setFocus()
    QTest.keyClicks(c.edit, "first line")
    QTest.keyClick(c.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(c.edit, "second line")
    assert sent == []
    assert c.edit.toPlainText() == "first line\nsecond line"
    QTest.keyClick(c.edit, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"]
    c.set_state(generating=True, can_send=True, has_turn=True)
    assert c.stop_button.isVisibleTo(c) and not c.send_button.isVisibleTo(c)
    QTest.keyClick(c.edit, Qt.Key.Key_Return)  # no second send while generating
    assert len(sent) == 1
    assert not c.regen_button.isEnabled() and not c.edit_button.isEnabled()


def test_copy_link_copies_the_code(qtbot, qapp):
    model, view = make_view(qtbot, 700, 400)
    code = "def f(x):\n    return x * 2"
    model.set_messages([ChatMessage("assistant", f"Here:\n\n```python\n{code}\n```\n\nDone.")])
    qapp.processEvents()
    rect = view.visualRect(model.index(0))
    copied: list[str] = []
    view.copied.connect(copied.append)
    hit = None
    for y in range(rect.top(), rect.bottom(), 3):
        for x in range(rect.left(), rect.left() + 300, 4):
            href = link_at(view, QPoint(x, y))
            if href == "copy:0":
                hit = QPoint(x, y)
                break
        if hit:
            break
    assert hit is not None, "no Copy link drawn"
    QGuiApplication.clipboard().clear()
    QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=hit)
    assert QGuiApplication.clipboard().text() == code
    assert copied and "copied" in copied[0]


def test_the_window_opens_with_the_cursor_in_the_message_box(qtbot, aloop, home):
    """Issue 33: the installed app, opened in a real X session, took no
    keys: no widget had the focus, so what a person typed went nowhere until
    they clicked into the box. Activated, the window gives the keys to the
    composer."""
    from PySide6.QtWidgets import QApplication
    from ui_support import make_window, wait_until

    w = make_window(qtbot)
    w.activateWindow()
    wait_until(lambda: QApplication.focusWidget() is not None)
    assert QApplication.focusWidget() is w.composer.edit
    QTest.keyClicks(QApplication.focusWidget(), "typed")
    assert w.composer.text() == "typed"
    w.close()
