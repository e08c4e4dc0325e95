"""Issue 20's first-run papercuts, in a real window (offscreen) on the tiny
models: the load banner while the built-in models are prepared, Enter
while loading, the wait for the first token, the model boxes' names, a
stale load refusal, and K beyond the menu."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from PySide6.QtCore import Qt
from specchat.library import bundled
from specchat.library.bundled import BundledModel
from tinygguf import write_gguf
from ui_support import load, send_and_wait, wait_until


# -- the first launch's progress ------------------------------------------------
@pytest.fixture
def fake_pair(tmp_path, tiny_tokenizer, monkeypatch):
    """Two tiny GGUFs, each split into parts, standing in for the built-in
    target and draft (tests/library/test_bundled.py's fake_bundled, twice)."""
    parts: dict[str, list] = {}
    for name, display, seed in (("tiny-t", "Tiny Target 2M", 3), ("tiny-d", "Tiny Draft 1M", 4)):
        data = write_gguf(tmp_path / f"{name}.gguf", tiny_tokenizer, seed=seed).path.read_bytes()
        folder = tmp_path / f"{name}-parts"
        folder.mkdir()
        half = len(data) // 2
        parts[name] = [folder / "part01.bin", folder / "part02.bin"]
        parts[name][0].write_bytes(data[:half])
        parts[name][1].write_bytes(data[half:])
        monkeypatch.setitem(bundled.BUNDLED, name, BundledModel(
            name, display, "1M", "llama", "F32", hashlib.sha256(data).hexdigest(), ()))
    monkeypatch.setattr(bundled, "part_files", lambda name: parts[bundled.get(name).name])
    return "bundled:tiny-t", "bundled:tiny-d"


def test_the_load_banner_says_which_model_which_stage_and_how_far(window, fake_pair, home):
    w = window
    target, draft = fake_pair
    lines: list[tuple[str, int]] = []
    # Connected after the banner's own slot: reads what it shows for each event.
    w.session.engine.loadProgress.connect(
        lambda *_: lines.append((w.load_banner.label.text(), w.load_banner.bar.value())))
    w.load_pair(target, draft)
    wait_until(lambda: not w.session.engine.loading)
    assert w.session.engine.pair is not None, w.error_banner.label.text()
    shown = [t for t, _ in lines]
    first = [t for t in shown if t.endswith("(model 1 of 2)")]
    second = [t for t in shown if t.endswith("(model 2 of 2)")]
    assert first and second
    # the target is prepared, then the draft (and then both are loaded)
    assert shown.index(second[0]) > max(i for i, t in enumerate(shown)
                                        if t.startswith("Preparing the built-in model Tiny T"))
    assert any(t.startswith("Preparing the built-in model Tiny Target 2M: checking the download"
                            " — ") for t in first), first
    assert any(t.startswith("Preparing the built-in model Tiny Target 2M: converting — ")
               for t in first), first
    assert any(t.startswith("Preparing the built-in model Tiny Draft 1M: converting — 100%")
               for t in second), second
    text = " ".join(shown)
    for leak in ("blk.", "token_embd", ".gguf", ".bin", str(home), "bundled-tiny"):
        assert leak not in text, leak
    converting = [v for t, v in lines if "Tiny Target 2M: converting" in t]
    assert converting == sorted(converting) and converting[-1] == 1000  # the bar moves on
    assert w.load_banner.isHidden()


# -- a stale refusal ---------------------------------------------------------------
def test_a_new_load_clears_the_last_refusal(window, tiny_target, tmp_path):
    """The person fixes the files and loads the same pair again: the old
    "Could not load" must not stay up while the new load succeeds."""
    w = window
    later = tmp_path / "copied-later"
    w.picker.set_pair(str(later), None)
    w.picker.load_button.click()  # at once: the pair's check may end after the refusal
    wait_until(lambda: not w.session.engine.loading and w.session.pairs.checking.done())
    # ... and when it does, the refusal stays up (it is the news)
    assert w.picker.verdict_label.text().startswith("✗ could not load:")
    assert w.error_banner.isVisible()

    shutil.copytree(tiny_target, later)
    w.picker.load_button.click()
    assert w.session.engine.loading
    label = w.picker.verdict_label.text()
    assert "could not load" not in label and label.startswith("✓"), label
    assert not w.error_banner.isVisible()
    wait_until(lambda: not w.session.engine.loading)
    assert w.session.engine.pair is not None
    assert "could not load" not in w.picker.verdict_label.full_text()


# -- the model boxes -----------------------------------------------------------------
def _shown_in_edit(box) -> str:
    """The start of the chosen name that fits in the box's line edit (it
    shows the start, _show_start): what a person reads in the closed box."""
    edit = box.lineEdit()
    fm, width = edit.fontMetrics(), edit.contentsRect().width() - 4
    text = edit.text()
    n = len(text)
    while n and fm.horizontalAdvance(text[:n]) > width:
        n -= 1
    return text[:n]


def _shown_in_list(box, row: int) -> str:
    """A row of the open list as its view draws it: elided to the view's width."""
    view = box.view()
    return view.fontMetrics().elidedText(box.itemText(row), view.textElideMode(),
                                         view.viewport().width() - 12)


@pytest.mark.parametrize("width", [1180, 860])  # the default and the smallest window
def test_the_two_built_in_models_read_differently(window, width):
    w = window
    w.resize(width, 780)
    wait_until(lambda: w.width() == width and w.picker.target.findData(
        "bundled:qwen2.5-coder-0.5b") >= 0)  # and the lists read
    for box in (w.picker.target, w.picker.draft):
        rows = [box.findData(r) for r in ("bundled:qwen2.5-coder-1.5b",
                                          "bundled:qwen2.5-coder-0.5b")]
        box.showPopup()
        listed = [_shown_in_list(box, r) for r in rows]
        box.hidePopup()
        assert "1.5B" in listed[0] and "0.5B" in listed[1], listed
        closed = []
        for r in rows:
            box.setCurrentIndex(r)
            box.activated.emit(r)  # as a choice in the list is
            closed.append(_shown_in_edit(box))
            tip = box.toolTip()  # the whole name, whatever is cut
            assert box.itemText(r) in tip and box.itemData(r) in tip, tip
        assert "1.5B" in closed[0] and "0.5B" in closed[1], closed


# -- K beyond the menu -----------------------------------------------------------------
def test_every_k_the_gauge_can_show_can_be_fixed_and_auto_says_so(qtbot, window, tiny_target,
                                                                  tiny_draft):
    """The gauge showed K 9 while the menu stopped at 8: K auto may draft up
    to the longest block of any drafter kind. The menu now reaches that far,
    and the gauge says when the K it shows was chosen by K auto."""
    from specchat.engine import drafter_kinds, modes
    from specchat.engine.events import StepEvent
    from specchat.ui.stats import LiveStats

    w = window
    menu = [w.options.k_box.itemData(i) for i in range(w.options.k_box.count())]
    longest = max(kind.cap for kind in drafter_kinds.KINDS.values())
    assert menu == [None, *range(1, longest + 1)]  # K auto, then every K it can reach
    assert longest >= 9

    live = LiveStats(modes.for_pair(True, has_draft=True))  # K auto
    live.add(StepEvent(0, (1,) * 10, "x" * 10, ("draft",) * 9 + ("target",), 9, 9, 9, "draft",
                       0.1, 0.1, 10))
    w.gauges.show_values(live.values())
    assert w.gauges.k.value.text() == "9 (auto)"

    load(qtbot, w, tiny_target, tiny_draft)
    send_and_wait(qtbot, w)  # K auto (the default)
    shown = w.gauges.k.value.text()
    assert shown.endswith(" (auto)") and w.options.k_box.findData(int(shown.split()[0])) > 0
    w.options.k_box.setCurrentIndex(w.options.k_box.findData(3))
    send_and_wait(qtbot, w, "And again, please.")
    fixed = w.gauges.k.value.text()  # 3, or less in the last step of the token budget
    assert fixed.isdigit() and 1 <= int(fixed) <= 3, fixed


# -- Enter while the models load ---------------------------------------------------------
def _enter(qtbot, w, text: str) -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)


def test_enter_while_loading_waits_and_sends_once_loaded(qtbot, window, tiny_target, tiny_draft):
    w = window
    w.load_pair(str(tiny_target), str(tiny_draft))
    assert w.session.engine.loading
    assert w.composer.send_button.isEnabled()  # it can be pressed, and is heard
    _enter(qtbot, w, "Hello while loading")
    assert w.composer.text() == "Hello while loading"  # kept, as written
    assert w.composer.edit.isReadOnly()
    assert w.composer.note_bar.isVisible()
    assert w.composer.note.text() == "Will be sent when the models are loaded."
    assert w.composer.unqueue_button.isVisible() and not w.composer.send_button.isVisible()
    assert w.chat_model.messages == []

    wait_until(lambda: len(w.chat_model.messages) == 2)  # loaded: sent at once
    assert w.chat_model.messages[0].text == "Hello while loading"
    wait_until(lambda: not w.conversation.busy)
    assert w.chat_model.messages[1].summary is not None  # a real reply
    assert w.composer.text() == "" and not w.composer.edit.isReadOnly()
    assert not w.composer.note_bar.isVisible() and w.composer.send_button.isVisible()


def test_a_waiting_message_can_be_held_back(qtbot, window, tiny_target, tiny_draft):
    w = window
    w.load_pair(str(tiny_target), str(tiny_draft))
    _enter(qtbot, w, "Not this one")
    assert w.composer.unqueue_button.shortcut().toString() == "Esc"
    w.composer.unqueue_button.click()  # "Don't send"
    assert not w.composer.queued and not w.composer.note_bar.isVisible()
    assert w.composer.text() == "Not this one" and not w.composer.edit.isReadOnly()
    wait_until(lambda: not w.session.engine.loading)
    assert w.session.engine.pair is not None and w.chat_model.messages == []
    assert w.composer.text() == "Not this one"


def test_a_waiting_message_stays_when_loading_is_cancelled(qtbot, window, tiny_target,
                                                           tiny_draft):
    w = window
    w.load_pair(str(tiny_target), str(tiny_draft))
    _enter(qtbot, w, "Keep me")
    w.load_banner.button.click()  # Cancel the load
    wait_until(lambda: not w.session.engine.loading)
    assert w.session.engine.pair is None and w.chat_model.messages == []
    assert w.composer.text() == "Keep me" and not w.composer.edit.isReadOnly()
    assert w.composer.note_bar.isVisible() and w.composer.note.text().startswith("Not sent:")
    assert not w.composer.unqueue_button.isVisible()
    w.composer.edit.insertPlainText("!")  # editing it again: the note has said its piece
    assert not w.composer.note_bar.isVisible()


def test_enter_with_no_model_says_why(qtbot, window):
    w = window
    assert w.session.engine.pair is None and not w.session.engine.loading
    _enter(qtbot, w, "Anyone there?")
    assert w.error_banner.isVisible() and "No model is loaded" in w.error_banner.label.text()
    assert w.composer.text() == "Anyone there?"


# -- the wait for the first token ----------------------------------------------------------
def test_the_reply_says_it_reads_the_prompt_until_the_first_token(qtbot, window, tiny_target,
                                                                  tiny_draft):
    """From send until the first token the target reads the prompt (seconds
    for a long one on a real model): the bubble says so, not just "…"."""
    w = window
    load(qtbot, w, tiny_target, tiny_draft)
    delegate = w.chat_view.delegate

    def shown(msg) -> tuple[str, str]:  # the bubble's text and its footer, as painted
        return ("".join(c.doc.toPlainText() for c in delegate.rendered(msg).chunks),
                delegate.footer(msg))

    # The reply's row changes only when steps arrive (and when it ends).
    changes: list[tuple[str, str]] = []
    w.chat_model.dataChanged.connect(lambda *_: changes.append(shown(w.chat_model.messages[-1])))
    w.composer.edit.setPlainText(" ".join(["Please read this long prompt carefully."] * 55))
    w.composer.send_button.click()
    reply = w.chat_model.messages[-1]
    assert reply.role == "assistant" and reply.streaming and not reply.text
    assert shown(reply) == ("Reading the prompt…", "")
    wait_until(lambda: not w.conversation.busy)
    assert reply.error is None, reply.error
    assert changes and changes[0][1] == "generating…"  # the first token's update
    assert all("Reading the prompt" not in text for text, _ in changes)
    assert reply.summary is not None
