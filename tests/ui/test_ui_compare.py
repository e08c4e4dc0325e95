"""Compare with the tiny pair in a real window: both panes stream while the
runs go, Cancel and closing the dialog stop the runs at once, and a chat
message sent meanwhile is refused with the reason instead of waiting
silently behind them."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from ui_support import load, send_and_wait, wait_until

LONG = 1500  # tokens per run: far more than any test waits for


@pytest.fixture
def compare(qtbot, window, tiny_target, tiny_draft):
    """A Compare dialog on the loaded tiny pair, with long runs."""
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=LONG)
    dlg = window.open_compare("def fibonacci(n): return fibonacci")
    qtbot.addWidget(dlg)
    return dlg


def _running(dlg) -> bool:
    return dlg.task is not None and not dlg.task.done()


def _cancel_and_time(dlg) -> float:
    t0 = time.monotonic()
    dlg.cancel_button.click()
    wait_until(lambda: not _running(dlg), timeout=30_000)
    return time.monotonic() - t0


def test_both_panes_stream_before_the_runs_finish_and_cancel_stops_at_once(compare):
    dlg = compare
    dlg.run_button.click()
    assert dlg.cancel_button.isEnabled() and not dlg.run_button.isEnabled()
    wait_until(lambda: dlg.plain_text.toPlainText() or not _running(dlg), timeout=30_000)
    assert _running(dlg) and dlg.plain_text.toPlainText()  # plain text shown while it runs
    wait_until(lambda: dlg.spec_text.toPlainText() or not _running(dlg), timeout=60_000)
    assert _running(dlg) and dlg.spec_text.toPlainText()  # and the speculative one's
    assert "Running" in dlg.status.text()
    # Cancel is asked to act within 1 s; 3 s leaves room for a loaded 2-core box.
    assert _cancel_and_time(dlg) < 3
    assert dlg.outcome is None
    assert dlg.status.text() == "Compare cancelled: the speculative run was stopped."
    assert dlg.spec_text.toPlainText()  # what streamed stays shown
    assert dlg.run_button.isEnabled() and not dlg.cancel_button.isEnabled()
    assert dlg.runner.session.engine.held_by is None


def test_cancel_during_the_plain_run_skips_the_speculative_one(compare):
    dlg = compare
    dlg.run_button.click()
    wait_until(lambda: dlg.plain_text.toPlainText() or not _running(dlg), timeout=30_000)
    assert _running(dlg)
    assert _cancel_and_time(dlg) < 3
    assert dlg.status.text() == ("Compare cancelled: the plain run was stopped and the "
                                 "speculative one skipped.")
    assert not dlg.spec_text.toPlainText()


def test_closing_compare_stops_its_runs_and_the_chat_runs_at_once(qtbot, window, compare):
    dlg = compare
    dlg.run_button.click()
    wait_until(lambda: dlg.plain_text.toPlainText() or not _running(dlg), timeout=30_000)
    assert _running(dlg)
    dlg.close()
    wait_until(lambda: not _running(dlg), timeout=3_000)
    assert dlg.outcome is None and "cancelled" in dlg.status.text()
    assert window.options.compare_button.isEnabled()  # the engine is free again
    window.session.update_settings(max_tokens=16)
    msg = send_and_wait(qtbot, window, "Hello after Compare", timeout=30_000)
    assert msg.role == "assistant" and msg.text and msg.error is None
    assert msg.summary.new_tokens <= 16  # this reply's own run, not one queued behind Compare


def test_a_message_sent_during_compare_says_why_it_cannot_go(qtbot, window, compare):
    dlg = compare
    dlg.run_button.click()  # the engine is Compare's from this click on
    window.composer.edit.setPlainText("A question meanwhile")
    window.composer.send_button.click()
    assert window.error_banner.isVisible()
    assert window.error_banner.label.text() == (
        "Compare is running: wait for it to finish or cancel it, then send again.")
    assert window.composer.text() == "A question meanwhile"  # kept, not lost
    assert not window.conversation.busy
    assert [m.text for m in window.chat_model.messages] == []
    assert not window.picker.load_button.isEnabled()  # no load behind it either
    assert not window.options.compare_button.isEnabled()
    # Cancelled before its first run was even submitted: nothing runs at all.
    assert _cancel_and_time(dlg) < 3
    assert dlg.status.text() == ("Compare cancelled: the plain run was stopped and the "
                                 "speculative one skipped.")
    assert not dlg.plain_text.toPlainText() and not dlg.spec_text.toPlainText()
    assert window.picker.load_button.isEnabled()
    window.session.update_settings(max_tokens=16)
    msg = send_and_wait(qtbot, window, "A question meanwhile", timeout=30_000)
    assert msg.text and msg.error is None


def test_compare_decodes_exactly_what_the_bench_decodes(qtbot, window, tiny_target, tiny_draft):
    """The speed Compare shows is the bench's: on the same prompt and
    settings both runs do the same work, step for step (same tokens, same
    verify steps, same drafts kept), and both clock decoding alone, prefill
    excluded. On the bundled pair the two agreed within 1%
    (docs/benchmarks.md, "Compare and the bench")."""
    from specchat.engine.events import Message, SamplingParams
    from specchat.engine.session import Engine
    from specchat.tools.bench_runs import run_variant
    from specchat.tools.prompts import Prompt
    from specchat.tools.variants import PLAIN, VARIANTS
    from specchat.ui.compare_runner import CompareRunner

    prompt_text = "def fibonacci(n): return fibonacci"
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=64, auto_off=False)

    task = CompareRunner(window.session, window.conversation).start(prompt_text)
    wait_until(task.done, timeout=60_000)
    outcome = task.result()

    engine = Engine()
    engine.load(str(tiny_target), str(tiny_draft))
    system = window.session.settings.system_prompt
    prompt = Prompt("compare", "code", (Message("system", system), Message("user", prompt_text)))
    spec = replace(VARIANTS["spec"], auto_off=False)
    for result, variant in ((outcome.plain, PLAIN), (outcome.speculative, spec)):
        bench = run_variant(engine, variant, prompt, 64, SamplingParams())
        s = result.summary
        assert list(result.token_ids) == bench.token_ids
        assert (s.steps, s.drafted, s.accepted) == (bench.steps, bench.drafted, bench.accepted)
        assert s.mode == variant.mode.name


def test_dialogs_closed_and_opened_again_leave_no_old_ones_behind(window):
    """Every Compare, model manager and settings dialog ever opened stayed
    the window's child for the whole session, the old managers still
    following the engine's signals. Now a closed one goes when the next
    opens."""
    from PySide6.QtCore import QCoreApplication, QEvent, QTimer
    from PySide6.QtWidgets import QApplication
    from specchat.ui.compare import CompareDialog
    from specchat.ui.model_manager import ModelManager
    from specchat.ui.settings import SettingsDialog

    def dismiss() -> None:  # the settings dialog, once its exec() shows it
        modal = QApplication.activeModalWidget()
        if modal is None:
            QTimer.singleShot(10, dismiss)
        else:
            modal.reject()

    for _ in range(3):
        window.open_compare("def fibonacci(n): return fibonacci").close()
        window.open_model_manager().close()
        QTimer.singleShot(0, dismiss)
        window.open_settings()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert len(window.findChildren(CompareDialog)) == 1
    assert len(window.findChildren(ModelManager)) == 1
    assert window.findChildren(SettingsDialog) == []
    # A closed manager with a download under way is shown again, its row with it.
    manager = window.findChildren(ModelManager)[0]
    manager.pending = 1
    assert window.open_model_manager() is manager and manager.isVisible()
