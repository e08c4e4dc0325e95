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
from specchat.engine.events import TrainProgress
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
    out = trained_heads.default_out(str(tiny_target))
    out.mkdir()  # the head's folder in the library holds something of the person's
    (out / "notes.txt").write_text("mine")
    load(qtbot, window, tiny_target)
    wait_until(lambda: "Will not write the head at" in dlg.train_note.text())
    assert not dlg.train_button.isEnabled() and "notes.txt" in dlg.train_note.text()
    shutil.rmtree(out)
    dlg.update_training()
    assert dlg.train_button.isEnabled()
    assert dlg.train_button.text() == "Train a draft head…"
    assert not dlg.train_restart.isEnabled()  # nothing to start over from

    at_once = dlg.train_head(5)  # cancelled while the texts are still being read
    dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().cancel_button.click()
    wait_until(at_once.done, timeout=120_000)
    assert dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text() == (
        "Cancelled; nothing was saved.")
    assert not (out / "model.safetensors").exists()
    assert window.session.engine.held_by is None and dlg.train_button.isEnabled()

    no_time = dlg.train_head(0)  # refused in the command line's words (--minutes 0)
    wait_until(no_time.done, timeout=120_000)
    assert dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text() == (
        "minutes must be a number above 0 and at most 10080 (this run's training budget); "
        "got 0")
    no_time = dlg.train_head(1e-9)  # a budget that ends before the first update: said, not "Cancelled"
    wait_until(no_time.done, timeout=120_000)
    assert dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text() == (
        "The 1e-09-minute budget ended before the first update; give it more minutes; "
        "nothing was saved.")
    assert not (out / "model.safetensors").exists()

    first = dlg.train_head(5)  # five minutes: it is cancelled long before
    row = dlg.tasks.itemAt(dlg.tasks.count() - 1).widget()
    wait_until(lambda: window.session.engine.held_by == head_training.HOLDER)
    assert not dlg.train_button.isEnabled()
    assert window.open_model_manager() is dlg  # one manager while it trains: Cancel in reach
    window.composer.edit.setPlainText("Hello there")
    window.composer.send_button.click()  # refused in words, not queued behind the training
    wait_until(lambda: "Training a draft head is running" in window.error_banner.label.text())
    wait_until(lambda: _updates(row.detail.text()) > 0, timeout=120_000)
    # The untrained head's held-out acceptance stays on the line while
    # later labelling and training reports come in.
    assert "held-out acceptance by position" in row.detail.text()
    assert row.cancel_button.isEnabled() and not row.cancel_button.isHidden()
    row.cancel_button.click()
    wait_until(first.done, timeout=120_000)
    assert "Stopped; train again to go on." in row.detail.text()
    # Stopped, not finished: the bar stays where training stopped (never
    # full), and there is nothing left to cancel.
    assert row.bar.maximum() == 1000 and row.bar.value() < row.bar.maximum()
    assert not row.bar.isHidden() and row.cancel_button.isHidden()
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
    assert row2.bar.value() == row2.bar.maximum()  # a finished run's bar is full
    assert row2.cancel_button.isHidden() and not row.cancel_button.isEnabled()
    assert dlg.train_button.text() == "Resume training…" and dlg.train_button.isEnabled()

    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    listed = [m for m in library_view.installed_models() if Path(m.path) == out.resolve()]
    assert len(listed) == 1 and listed[0].head
    assert library_view.source_text(listed[0]).endswith(f"(EAGLE-3 head for {tiny_target.name})")
    # Its target was loaded from a folder, not listed: no arrow pointing at
    # a row that is not there, and the head's source says so.
    names = [dlg.installed.item(i, 0).text() for i in range(dlg.installed.rowCount())]
    i = names.index(listed[0].name)
    assert dlg.installed.item(i, 1).text().endswith(
        f"(EAGLE-3 head for {tiny_target.name}, which is not in the library)")
    # Only the head's weights count, not the optimizer's checkpoint beside it.
    assert (out / "optimizer.safetensors").is_file()
    assert listed[0].size_bytes < (out / "model.safetensors").stat().st_size + 64_000

    # A damaged checkpoint is said to be, with how to start over here; Start
    # over trains a new head in its place.
    record["draft_ids"] = [10 ** 9]
    (out / "specchat-training.json").write_text(json.dumps(record))
    damaged = dlg.train_head(5)
    wait_until(damaged.done, timeout=120_000)
    text = dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text()
    assert text.startswith(f"The training checkpoint in {out.resolve()} is damaged: "
                           "specchat-training.json lists the draft id 1,000,000,000, past")
    assert text.endswith("Nothing was changed; to start over, tick Start over and train again.")
    assert dlg.train_restart.isEnabled()
    dlg.train_restart.setChecked(True)
    assert dlg.train_button.text() == "Train a draft head…"
    again = dlg.train_head(5, max_steps=2)
    assert not dlg.train_restart.isChecked()  # once: the next run goes on from this one
    wait_until(again.done, timeout=180_000)
    assert not dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().failed
    record = json.loads((out / "specchat-training.json").read_text())
    assert record["step"] == 2 and max(record["draft_ids"]) < 10 ** 9


def _progress(stage, step, accept=(), message="", elapsed=60.0):
    return TrainProgress(stage, step, 1000 + step, elapsed, 600.0, 1.5, accept, message=message)


def test_the_progress_line_keeps_the_last_held_out_acceptance():
    """Only some reports carry a held-out measurement: the line keeps the
    last one (and the update it was measured at) until a newer one comes."""
    line = head_training.ProgressLine()
    first = line.update(_progress("measuring", 0, elapsed=0.0, message="3 of 8 pieces"))
    assert first.startswith("labelling the held-out pieces · 1,000 tokens labelled")
    assert "acceptance" not in first and first.endswith("3 of 8 pieces")
    assert "acceptance" not in line.update(_progress("training", 0))
    assert line.update(_progress("training", 0, (0.05, 0.01), "the untrained head, held out")
                       ).endswith("held-out acceptance by position 5% 1% · the untrained head, "
                                  "held out")
    text = line.update(_progress("labelling", 40))
    assert "40 updates" in text and "held-out acceptance by position 5% 1% (at update 0)" in text
    assert "untrained" not in text
    text = line.update(_progress("checkpoint", 90, (0.4, 0.2)))
    assert text.startswith("checkpoint saved · ") and text.endswith("position 40% 20%")
    assert line.update(_progress("training", 95)).endswith("position 40% 20% (at update 90)")
    assert line.accept_text() == "40% 20%"
    assert line.update(_progress("some_new_stage", 95)).startswith("some new stage · ")
