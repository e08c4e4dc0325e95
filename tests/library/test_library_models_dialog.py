"""The Models dialog against real files and the local Hub: the Installed tab
lists the built-in models already prepared in <home>/bundled (so the space
it shows in use adds up), and a failed or cancelled task shows its failure,
never a full bar."""

from __future__ import annotations

import json
import time

import pytest
from PySide6.QtCore import Qt
from specchat.library import bundled, index, paths
from specchat.library.gguf_import import FORMAT, MARKER
from specchat.library.units import size_text

REF = "hf:test-org/tiny-target"


def _spin_until(cond, seconds: float) -> None:
    """Run Qt (and so asyncio) until ``cond()``, letting the download thread
    have the GIL between rounds (qtbot.waitUntil keeps it while it waits)."""
    from PySide6.QtCore import QCoreApplication

    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not done within {seconds} s"
        QCoreApplication.processEvents()
        time.sleep(0.005)


def _prepare(name: str, weight_bytes: int, *, complete: bool = True):
    """A converted built-in model on disk, as bundled.ensure leaves it."""
    model = bundled.get(name)
    dest = paths.bundled_dir(create=True) / model.name
    dest.mkdir(parents=True)
    (dest / "model.safetensors").write_bytes(b"\0" * weight_bytes)
    (dest / "config.json").write_text("{}", encoding="utf-8")
    if complete:
        (dest / MARKER).write_text(json.dumps(
            {"format": FORMAT, "source": {"bundled": model.name, "sha256": model.sha256}}),
            encoding="utf-8")
    return model


@pytest.fixture
def manager(qtbot, aloop):
    from specchat.ui.model_manager import ModelManager

    def make():
        dlg = ModelManager()
        qtbot.addWidget(dlg)
        return dlg

    return make


def _rows(dlg) -> list[list[str]]:
    t = dlg.installed
    return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]


def test_installed_lists_prepared_built_in_models_with_their_size_and_no_delete(
        lib_home, manager):
    smol = _prepare("smollm2-135m", 300_000)
    _prepare("qwen2.5-coder-0.5b", 100_000, complete=False)  # a conversion cut short
    dlg = manager()
    rows = _rows(dlg)
    assert len(rows) == 1
    size = paths.disk_usage(bundled.folder(smol.name))
    assert rows[0] == [smol.display_name, "bundled:smollm2-135m (built in)", size_text(size),
                       "135M"]
    # What is listed accounts for the space shown in use (only the prepared
    # model's files are in this home, plus the unfinished one's).
    assert f"{size_text(paths.disk_usage())} used" in dlg.where.text()
    dlg.installed.selectRow(0)
    assert not dlg.delete_button.isEnabled()
    assert "cannot be deleted" in dlg.delete_button.toolTip()
    assert dlg.delete_selected(confirm=False) is None
    assert (bundled.folder(smol.name) / MARKER).is_file()  # still there


def test_a_failed_download_shows_its_failure_not_a_full_bar(hub, manager):
    from specchat.ui.model_manager import TaskRow

    hub.fail("model.safetensors", 503, "upstream connect error", "text/plain")
    dlg = manager()
    done = dlg.download(REF, "tiny-target")
    _spin_until(done.done, 30)
    row = dlg.findChildren(TaskRow)[-1]
    assert row.bar.isHidden() and row.failed  # not a full bar: the failure instead
    assert "503" in row.detail.text() and "model.safetensors" in row.detail.text()
    assert not row.cancel_button.isEnabled()
    assert _rows(dlg) == []


def test_a_cancelled_download_shows_cancelled_not_a_full_bar(hub, qtbot, manager):
    from specchat.ui.model_manager import TaskRow

    hub.stall("info")
    dlg = manager()
    done = dlg.download(REF, "tiny-target")
    row = dlg.findChildren(TaskRow)[-1]
    try:
        time.sleep(0.2)
        qtbot.mouseClick(row.cancel_button, Qt.MouseButton.LeftButton)
        _spin_until(done.done, 10)
    finally:
        hub.released.set()
    assert row.bar.isHidden() and row.failed and row.detail.text() == "Cancelled."


def test_downloading_a_built_in_catalog_row_prepares_and_lists_it(lib_home, manager,
                                                                monkeypatch, tiny_draft):
    from specchat.ui.model_manager import TaskRow

    # A stand-in for the conversion (tests/library/test_bundled.py runs it).
    monkeypatch.setattr(bundled, "ensure", lambda name, progress, cancelled: tiny_draft)
    dlg = manager()
    done = dlg.download("bundled:qwen2.5-coder-0.5b", "Qwen2.5-Coder 0.5B")
    _spin_until(done.done, 30)
    row = dlg.findChildren(TaskRow)[-1]
    assert not row.failed, row.detail.text()
    assert index.find_source("bundled:qwen2.5-coder-0.5b").path == str(tiny_draft)
