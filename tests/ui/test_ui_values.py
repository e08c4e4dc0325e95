"""Bad values in the window: the settings dialog shows the one line from
specchat.values and cannot be accepted until it is fixed; any integer is a
seed; the options bar shows the K that replies really run with."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QDialog, QDialogButtonBox
from specchat.store.settings import AppSettings
from specchat.ui.settings import SettingsDialog


def retype(widget, text: str) -> None:
    widget.setFocus()
    widget.selectAll()
    QTest.keyClick(widget, Qt.Key.Key_Delete)
    QTest.keyClicks(widget, text)


def test_settings_refuse_a_bad_value_with_one_visible_line(qtbot):
    dlg = SettingsDialog(AppSettings())
    qtbot.addWidget(dlg)
    dlg.show()
    ok = dlg.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not dlg.error.isVisible() and ok.isEnabled()
    for field, typed, words in ((dlg.temperature, "nan", "temperature must be a number from 0 to 5"),
                                (dlg.temperature, "-1", "temperature must be"),
                                (dlg.top_p, "0", "top-p must be a number above 0 and at most 1"),
                                (dlg.top_k, "-2", "top-k must be a whole number from 0 to"),
                                (dlg.max_tokens, "0", "max tokens must be a whole number from 1"),
                                (dlg.seed, "1.5", "seed must be a whole number")):
        before = field.text()
        retype(field, typed)
        assert dlg.error.isVisible() and words in dlg.error.text(), dlg.error.text()
        assert "\n" not in dlg.error.text() and not ok.isEnabled()
        QTest.keyClick(field, Qt.Key.Key_Return)  # Enter does not save it either
        assert dlg.isVisible() and dlg.result() != QDialog.DialogCode.Accepted
        retype(field, before)
        assert not dlg.error.isVisible() and ok.isEnabled()


def test_settings_take_any_integer_as_a_seed(qtbot):
    dlg = SettingsDialog(AppSettings(seed=5))
    qtbot.addWidget(dlg)
    assert dlg.seed.text() == "5"
    for typed, saved in (("-1", 2 ** 64 - 1), (str(10 ** 30), 10 ** 30 % 2 ** 64),
                         (str(2 ** 40), 2 ** 40), ("", None)):
        retype(dlg.seed, typed)
        assert not dlg.error.isVisible()
        assert dlg.edited()["seed"] == saved
    assert dlg.seed.placeholderText() == "random"


def test_options_bar_shows_the_k_replies_run_with(qtbot, window):
    """Values are checked once, by the session, for every caller: one out of
    range is refused with one line and nothing changes (before, the session
    took K = 99 and the options bar, re-checking it inside its
    settingsChanged handler, changed it again to auto)."""
    bar, session = window.options, window.session
    refused: list[str] = []
    session.failed.connect(refused.append)
    changes: list = []
    session.settingsChanged.connect(changes.append)
    session.update_settings(k=12)  # in range, not one of the listed choices
    assert bar.k_box.currentData() == 12 and "12" in bar.k_box.currentText()
    assert len(changes) == 1 and not refused
    session.update_settings(k=99, temperature=float("nan"))  # e.g. set through the API
    assert (session.settings.k, session.settings.temperature) == (12, 0.0)
    assert bar.k_box.currentData() == 12 and len(changes) == 1
    assert refused == [
        "K must be a whole number from 1 to 32 (draft length; auto = adaptive); got 99; "
        "not changed.",
        "temperature must be a number from 0 to 5 (0 = greedy); got nan; not changed."]
    assert window.error_banner.isVisible() and "not changed" in window.error_banner.label.text()
    session.update_settings(k=99, max_tokens=20)  # the valid part of a change applies
    assert (session.settings.k, session.settings.max_tokens) == (12, 20)
