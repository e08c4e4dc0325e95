"""Training a draft head from the window, as a person does it: the model
manager's row for the loaded target, a progress bar that moves, chat
refused in words while the engine trains, Cancel that keeps a checkpoint,
Resume that goes on from it, and the head listed under its target."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from specchat.library import trained_heads
from specchat.ui import head_training, library_view
from ui_support import load, wait_until

ENGINE = Path(__file__).resolve().parents[2] / "app" / "specchat" / "engine"


@pytest.fixture
def texts(tmp_path, monkeypatch):
    """Text found on the machine: here, some of the engine's sources."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for f in sorted(ENGINE.glob("*.py"))[:20]:
        shutil.copy(f, folder / f.name)
    monkeypatch.setattr(trained_heads, "default_texts", lambda: [folder])
    return folder


def _updates(text: str) -> int:
    found = re.search(r"([\d,]+) updates", text)
    return int(found.group(1).replace(",", "")) if found else 0


def test_train_cancel_resume_and_list_a_head_from_the_window(qtbot, window, tiny_target,
                                                             texts):
    dlg = window.open_model_manager()
    assert not dlg.train_button.isEnabled()
    assert dlg.train_note.text().startswith("Load a model first")
    load(qtbot, window, tiny_target)
    wait_until(lambda: dlg.train_button.isEnabled())
    assert dlg.train_button.text() == "Train a draft head…"

    out = trained_heads.default_out(str(tiny_target))
    at_once = dlg.train_head(5)  # cancelled while the texts are still being read
    dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().cancel_button.click()
    wait_until(at_once.done, timeout=120_000)
    assert dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text() == (
        "Cancelled; nothing was saved.")
    assert not (out / "model.safetensors").exists()
    assert window.session.engine.held_by is None and dlg.train_button.isEnabled()

    first = dlg.train_head(5)  # five minutes: it is cancelled long before
    row = dlg.tasks.itemAt(dlg.tasks.count() - 1).widget()
    wait_until(lambda: window.session.engine.held_by == head_training.HOLDER)
    assert not dlg.train_button.isEnabled()
    assert window.open_model_manager() is dlg  # one manager while it trains: Cancel in reach
    window.composer.edit.setPlainText("Hello there")
    window.composer.send_button.click()  # refused in words, not queued behind the training
    wait_until(lambda: "Training a draft head is running" in window.error_banner.label.text())
    wait_until(lambda: _updates(row.detail.text()) > 0, timeout=120_000)
    row.cancel_button.click()
    wait_until(first.done, timeout=120_000)
    assert "Stopped; train again to go on." in row.detail.text()
    saved = json.loads((out / "specchat-training.json").read_text())
    assert saved["step"] > 0 and (out / "model.safetensors").is_file()
    assert window.session.engine.held_by is None
    assert dlg.train_button.text() == "Resume training…" and dlg.train_button.isEnabled()

    second = dlg.train_head(5, max_steps=saved["step"] + 10)
    row2 = dlg.tasks.itemAt(dlg.tasks.count() - 1).widget()
    wait_until(second.done, timeout=180_000)
    assert second.exception() is None and not row2.failed
    record = json.loads((out / "specchat-training.json").read_text())
    assert record["step"] == saved["step"] + 10  # went on from the checkpoint
    assert row2.bar.value() > 0 and "held-out acceptance by position" in row2.detail.text()

    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    listed = [m for m in library_view.installed_models() if Path(m.path) == out.resolve()]
    assert len(listed) == 1 and listed[0].head
    assert library_view.source_text(listed[0]).endswith(f"(EAGLE-3 head for {tiny_target.name})")
