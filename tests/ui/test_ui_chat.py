"""The chat window end to end with the tiny models: streaming, gauges,
stop, the speculative toggle, regenerate, edit-and-resend, compare and a
screenshot."""

from __future__ import annotations

from PySide6.QtCore import Qt
from specchat.engine.events import ComputeInfo, LoadedPair, ModelInfo
from ui_support import load, run_compare, send_and_wait, wait_until


def test_window_title_and_shortcut_tooltip(window):
    assert window.windowTitle() == "SpecChat"  # nothing loaded yet
    assert "Ctrl+Shift+S" in window.options.spec_box.toolTip()
    assert not window.composer.send_button.isEnabled()  # nothing loaded yet


def test_send_streams_text_and_gauges(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    assert window.windowTitle().endswith(" — SpecChat")  # the pair first, the app once
    seen: list = []
    window.conversation.gaugesChanged.connect(seen.append)
    partial_lengths: list[int] = []
    window.chat_model.dataChanged.connect(
        lambda *_: partial_lengths.append(len(window.chat_model.messages[-1].text)))
    window.session.update_settings(max_tokens=120)
    msg = send_and_wait(qtbot, window)
    assert msg.role == "assistant" and msg.text and not msg.streaming
    # Streamed: the reply grew over several updates, not in one piece.
    assert len({n for n in partial_lengths if n}) >= 2
    live = [v for v in seen if v.live]
    assert live and live[-1].tokens_per_s > 0 and live[-1].steps > 0
    final = window.gauges.values
    assert final.acceptance is not None and 0 <= final.acceptance <= 1
    assert final.tokens_per_step >= 1
    assert window.gauges.speed.value.text() != "–"
    assert msg.summary.mode == "hybrid" and msg.summary.new_tokens > 0
    footer = window.chat_view.delegate.footer(msg)
    assert "tok/s" in footer and "first token" in footer and "hybrid" in footer
    assert window.composer.send_button.isVisible()
    assert not window.composer.stop_button.isVisible()


def test_stop_mid_reply(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=1500)
    window.composer.edit.setPlainText("Tell me a long story")
    window.composer.send_button.click()
    wait_until(lambda: len(window.chat_model.messages[-1].text) > 0, timeout=30_000)
    assert window.composer.stop_button.isVisible()
    window.composer.stop_button.click()
    wait_until(lambda: not window.conversation.busy, timeout=30_000)
    msg = window.chat_model.messages[-1]
    assert msg.summary.finish_reason == "cancelled"
    assert msg.summary.new_tokens < 1500
    assert "stopped" in window.chat_view.delegate.footer(msg)


def test_stop_while_the_chat_template_renders_is_a_stop_not_an_error(
        qtbot, window, tiny_target, tmp_path):
    """A model's template that loops for long is stopped by Stop like any
    reply: the bubble says stopped, no error banner, and the next reply runs."""
    import threading
    import time

    from specchat.engine import template
    from tinymodels import with_chat_template

    slow = with_chat_template(
        tiny_target, tmp_path / "slow-template",
        "{% if messages[-1].content == 'slow' %}{% for i in range(99999) %}"
        "{% for j in range(99999) %}{% endfor %}{% endfor %}{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    load(qtbot, window, slow)
    window.composer.edit.setPlainText("slow")
    window.composer.send_button.click()
    # Stop once the template is being rendered (its helper thread is alive).
    wait_until(lambda: any(t.name == template.RENDER_THREAD and t.is_alive()
                           for t in threading.enumerate()), timeout=30_000)
    assert window.conversation.busy
    started = time.monotonic()
    window.composer.stop_button.click()
    wait_until(lambda: not window.conversation.busy, timeout=10_000)
    assert time.monotonic() - started < 3.0  # the issue asks for 1 s; slack for a busy box
    msg = window.chat_model.messages[-1]
    assert msg.error == "Stopped." and not msg.text
    assert window.error_banner.isHidden(), window.error_banner.label.text()
    reply = send_and_wait(qtbot, window, "fast")
    assert reply.error is None and reply.summary is not None


def test_speculative_toggle_takes_effect_next_reply(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    assert window.options.spec_box.isChecked() and window.options.spec_box.isEnabled()
    qtbot.keyClick(window, Qt.Key.Key_S,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert not window.options.spec_box.isChecked() and window.session.settings.speculative is False
    plain = send_and_wait(qtbot, window)
    assert plain.summary.mode == "plain" and plain.summary.drafted == 0
    assert window.gauges.acceptance.value.text() == "–"
    window.options.spec_box.setChecked(True)
    window.options.k_box.setCurrentIndex(window.options.k_box.findData(3))
    assert window.session.settings.k == 3
    spec = send_and_wait(qtbot, window, "And again, please.")
    assert spec.summary.mode == "hybrid"
    assert window.gauges.values.speedup is not None  # compared with the plain reply


def test_lookup_pair_uses_prompt_lookup(qtbot, window, tiny_target):
    pair = load(qtbot, window, tiny_target, None)
    assert pair.draft is None
    msg = send_and_wait(qtbot, window, "def fibonacci(n): def fibonacci(n):")
    from specchat.engine import modes

    no_draft = modes.for_pair(True, has_draft=False)  # the registry's mode without a draft model
    assert no_draft.speculative and not no_draft.needs_draft_model
    assert msg.summary.mode == no_draft.name
    assert "suffix matching" in window.windowTitle()


def test_cannot_speculate_disables_toggle_with_reason(qtbot, window):
    info = ModelInfo("m", "/m", "llama", 1, 1, "float32", 10, False, "sliding-window cache")
    window.session.engine.pair = LoadedPair(info, None, ComputeInfo("cpu", "float32", "openblas"),
                                    False, "Speculative decoding is not available for m: "
                                    "sliding-window cache. Plain decoding still works.")
    window.update_state()
    assert not window.options.spec_box.isEnabled()
    assert window.options.spec_reason.isVisible()
    assert "sliding-window cache" in window.options.spec_reason.text()
    assert window.gauges.mode.value.text() == "plain"


def test_regenerate_replaces_last_reply(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    first = send_and_wait(qtbot, window)
    assert window.composer.regen_button.isEnabled()
    window.composer.regen_button.click()
    assert window.conversation.busy
    wait_until(lambda: not window.conversation.busy, timeout=60_000)
    msgs = window.chat_model.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[-1] is not first
    assert msgs[-1].text == first.text  # greedy: same reply again
    stored = window.session.conversations.blocking.messages(window.conversation.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"]


def test_edit_and_resend_last_turn(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    send_and_wait(qtbot, window, "First question")
    window.composer.edit_button.click()
    assert window.composer.edit.toPlainText() == "First question"
    assert window.chat_model.rowCount() == 0
    window.composer.edit.setPlainText("First question, edited")
    window.composer.send_button.click()
    wait_until(lambda: not window.conversation.busy, timeout=60_000)
    msgs = window.chat_model.messages
    assert [m.text for m in msgs][0] == "First question, edited" and len(msgs) == 2
    stored = window.session.conversations.blocking.messages(window.conversation.conversation_id)
    assert stored[0].content == "First question, edited" and len(stored) == 2


def test_compare_plain_and_speculative(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    dlg = run_compare(qtbot, window)
    o = dlg.outcome
    assert o.plain.summary.mode == "plain" and o.speculative.summary.mode == "hybrid"
    assert o.greedy and o.identical  # greedy: speculation must not change the text
    assert o.plain.summary.tokens_per_s > 0 and o.speculative.summary.tokens_per_s > 0
    assert "speedup ×" in dlg.headline.text() and "identical" in dlg.headline.text()
    assert dlg.plain_text.toPlainText() and dlg.spec_text.toPlainText()


def test_colour_tokens_by_origin(qtbot, window, tiny_target, tiny_draft):
    from specchat.ui import theme

    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=96)
    msg = send_and_wait(qtbot, window, "def fibonacci(n): def fibonacci(n):")
    origins = {o for o, _ in msg.runs}
    assert "target" in origins and origins - {"target"}  # some tokens were drafted
    assert origins <= {"target", "draft", "conversation", "history"}
    assert "".join(t for _, t in msg.runs) == msg.text
    window.options.color_box.setChecked(True)
    assert window.options.legend.isVisible()
    delegate = window.chat_view.delegate
    backgrounds = set()
    for chunk in delegate.rendered(msg).chunks:
        block = chunk.doc.begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                backgrounds.add(it.fragment().charFormat().background().color().name())
                it += 1
            block = block.next()
    for origin in origins - {"target"}:  # every source seen is tinted in its own colour
        assert theme.origin_color(delegate.colors, origin).name() in backgrounds, origin


def test_screenshot_during_streamed_reply(qtbot, window, tiny_target, tiny_draft, tmp_path):
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=600)
    window.composer.edit.setPlainText("Write a Python function with a code block, please.")
    window.composer.send_button.click()
    wait_until(lambda: len(window.chat_model.messages[-1].text) > 40, timeout=30_000)
    path = tmp_path / "main-window.png"
    assert window.grab().save(str(path))
    window.conversation.stop()
    wait_until(lambda: not window.conversation.busy, timeout=30_000)
    assert path.exists() and path.stat().st_size > 10_000
    from PySide6.QtGui import QImage

    img = QImage(str(path))
    assert img.width() >= 800 and img.height() >= 500


def test_a_mode_picked_by_name_runs_and_falls_back_without_a_draft(qtbot, window, tiny_target,
                                                                   tiny_draft):
    """The mode menu offers every speculative mode, each with its
    explanation; a picked mode runs on the next reply (ssd included), and
    one that needs a draft model runs on its other drafters without one."""
    from specchat.engine import modes

    load(qtbot, window, tiny_target, tiny_draft)
    box = window.options.mode_box
    names = [box.itemData(i) for i in range(box.count())]
    assert names[0] is None and {"ssd", "hybrid", "suffix", "draft"} <= set(names)
    tip = box.itemData(box.findData("ssd"), Qt.ItemDataRole.ToolTipRole)
    assert tip == modes.get("ssd").description and "Apple" in tip
    box.setCurrentIndex(box.findData("ssd"))
    assert window.session.settings.spec_mode == "ssd"
    assert send_and_wait(qtbot, window).summary.mode == "ssd"
    box.setCurrentIndex(box.findData("hybrid"))
    load(qtbot, window, tiny_target, None)
    assert window.session.next_mode() is modes.get("suffix")
    box.setCurrentIndex(0)
    assert window.session.settings.spec_mode is None
