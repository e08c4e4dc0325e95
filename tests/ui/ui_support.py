"""Helpers for the UI tests: spin Qt until something holds, open a window,
load a pair, send a message and wait for the reply. The fixtures are in
this folder's conftest.py."""

from __future__ import annotations

from spin import wait_until  # noqa: F401 - the UI tests import it from here


class NoEngine:
    """Stands in for EngineClient in an AppSession made without a window:
    nothing there loads or generates."""

    def close(self) -> None:
        pass


def make_view(qtbot, width: int, height: int, show: bool = True):
    """A chat view over an empty ChatModel, sized (and shown): (model, view)."""
    from specchat.ui.chat_model import ChatModel
    from specchat.ui.chat_view import ChatView

    model = ChatModel()
    view = ChatView()
    qtbot.addWidget(view)
    view.setModel(model)
    view.resize(width, height)
    if show:
        view.show()
    return model, view


def make_window(qtbot, **kwargs):
    from specchat.ui.main_window import MainWindow

    w = MainWindow(**kwargs)
    qtbot.addWidget(w)
    w.resize(1100, 760)
    w.show()
    w.start()
    return w


def load(qtbot, w, target, draft=None, timeout=60_000):
    w.picker.set_pair(str(target), str(draft) if draft else None)
    w.load_pair(str(target), str(draft) if draft else None)
    wait_until(lambda: not w.session.engine.loading, timeout=timeout)
    assert w.session.engine.pair is not None, w.error_banner.label.text()
    return w.session.engine.pair


def send_and_wait(qtbot, w, text="Hello, world! How are you today?", timeout=60_000):
    w.composer.edit.setPlainText(text)
    w.composer.send_button.click()
    assert w.conversation.busy
    wait_until(lambda: not w.conversation.busy, timeout=timeout)
    return w.chat_model.messages[-1]


def run_compare(qtbot, w, prompt="def fibonacci(n): return fibonacci", timeout=60_000):
    """Open Compare on ``prompt``, run it to its end and return the dialog
    (its outcome checked to be there)."""
    dlg = w.open_compare(prompt)
    qtbot.addWidget(dlg)
    dlg.run_button.click()
    wait_until(lambda: dlg.task is not None and dlg.task.done(), timeout=timeout)
    assert dlg.outcome is not None, dlg.status.text()
    return dlg


def link_at(view, pos) -> str:
    """The link the chat view draws at ``pos`` ("" if none), as a click
    there would follow it: the message under it, asked through its
    delegate (ChatDelegate.anchor_at)."""
    index = view.indexAt(pos)
    return view.delegate.anchor_at(index, view.visualRect(index), pos)[0] if index.isValid() else ""
