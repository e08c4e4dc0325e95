"""The model manager: installed models, the catalog, downloads and imports.

Downloads are network work and run on the default executor; imports may
convert weights with MLX, so they run on the engine thread (through
EngineClient.call) like every other MLX job, as does training a draft head
for the loaded target (ui/head_training.py). Progress comes back through
``loop.call_soon_threadsafe``; Cancel sets the event the library polls.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QFileDialog,
    QHeaderView,
    QLabel,
    QMessageBox,
    QProgressBar,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QWidget,
)

from specchat import values
from specchat.library import importing, index, paths, refs, trained_heads
from specchat.library.bundled import PreparedModel
from specchat.library.catalog import CatalogModel
from specchat.library.hub import DownloadProgress
from specchat.library.index import InstalledModel
from specchat.library.units import params_text, size_text
from specchat.ui import head_training, library_view
from specchat.ui.widgets import button, hbox, label, vbox


class TaskRow(QWidget):
    """One download or import: what, how far, and Cancel."""

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.cancelled = threading.Event()
        self.failed = False
        self.title = QLabel(title)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)
        self.detail = label("starting…", name="GaugeLabel")
        self.cancel_button = button("Cancel", clicked=self.cancel)
        hbox((vbox(self.title, self.bar, self.detail), 1), self.cancel_button, parent=self,
             margins=(0, 2, 0, 2))

    def cancel(self) -> None:
        self.cancelled.set()
        self.cancel_button.setEnabled(False)
        self.detail.setText("cancelling…")

    def progress(self, done: int | None, total: int | None, message: str = "") -> None:
        """A download's bytes so far of its total, each if known."""
        if done is not None and total:
            message = f"{size_text(done)} of {size_text(total)}" + (f" · {message}" if message
                                                                    else "")
        self.fraction((done or 0) / total if total else None, message)

    def fraction(self, fraction: float | None, message: str) -> None:
        if self.failed:
            return  # a late report must not cover the failure
        if fraction is not None:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        if message:
            self.detail.setText(message)

    def _ended(self, message: str) -> None:
        """Whatever the end, there is nothing left to cancel: no button."""
        self.detail.setText(message)
        self.cancel_button.setEnabled(False)
        self.cancel_button.hide()

    def finish(self, message: str) -> None:
        """A task that ran to its end: a full bar."""
        self.bar.setRange(0, 1)
        self.bar.setValue(1)
        self._ended(message)

    def stop(self, message: str) -> None:
        """A task stopped part-way that kept what it did (a training run
        cancelled with its checkpoint saved): the bar stays where it
        stopped, never full, since a full one reads as done."""
        if self.bar.maximum() == 0:  # never measured: a busy bar would read as still going
            self.bar.hide()
        self._ended(message)

    def fail(self, message: str) -> None:
        """A failed or cancelled task: its message and no bar, since a full
        one reads as done and a part-full one as still going."""
        self.failed = True
        self.bar.hide()
        self._ended(message)


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.verticalHeader().hide()
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return t


def _fill(table: QTableWidget, rows: list[tuple[str, ...]]) -> None:
    table.setRowCount(len(rows))
    for i, row in enumerate(rows):
        for j, text in enumerate(row):
            table.setItem(i, j, QTableWidgetItem(text))


class ModelManager(QDialog):
    modelsChanged = Signal()

    def __init__(self, engine_client=None, parent=None, trainer=None):
        super().__init__(parent)
        self.pending = 0  # downloads, imports and deletions under way (their rows live here)
        self.trainer: head_training.HeadTraining | None = trainer
        self.setWindowTitle("Models — SpecChat")
        self.resize(820, 560)
        self.client = engine_client
        self.where = label(selectable=True)
        self.installed = _table(["Name", "Source", "Size", "Parameters"])
        self.catalog = _table(["Model", "Reference", "Download", "Status"])
        self.delete_button = button("Delete…", clicked=self.delete_selected)
        self.download_button = button("Download", clicked=self.download_selected)
        self.import_folder_button = button("Import folder…", clicked=self.import_folder)
        self.import_gguf_button = button("Import .gguf…", clicked=self.import_gguf)
        inst = QWidget()
        il = vbox(self.installed, hbox(self.import_folder_button, self.import_gguf_button, 1,
                                       self.delete_button), parent=inst)
        self.train_minutes = QSpinBox()  # whole minutes within the command line's range
        self.train_minutes.setRange(1, int(values.LIMITS["minutes"].high))
        self.train_minutes.setValue(60)
        self.train_minutes.setSuffix(" min")
        self.train_minutes.setToolTip(values.LIMITS["minutes"].describe())
        # As the command line's --restart: a checkpoint there (damaged, or for
        # another target) is replaced instead of gone on from.
        self.train_restart = QCheckBox("Start over")
        self.train_restart.setToolTip("Train a new head in place of the checkpoint, instead of "
                                      "going on from it")
        self.train_restart.toggled.connect(self.update_training)
        self.train_button = button("Train a draft head…",
                                   clicked=lambda: self.train_head(self.train_minutes.value()))
        self.train_note = label(name="GaugeLabel", wrap=True)
        trow = hbox((self.train_note, 1), self.train_minutes, self.train_restart,
                    self.train_button)
        if trainer is not None:
            il.addLayout(trow)
        cat = QWidget()
        vbox(self.catalog, hbox(1, self.download_button), parent=cat)
        tabs = QTabWidget()
        tabs.addTab(inst, "Installed")
        tabs.addTab(cat, "Catalog")
        self.tasks = vbox(spacing=2)
        vbox(self.where, (tabs, 1), self.tasks, parent=self)
        self.installed.itemSelectionChanged.connect(self._selection_changed)
        # Built-in models first (not index entries: listed, never deleted here).
        self._installed_rows: list[PreparedModel | InstalledModel] = []
        self._built_in: list[PreparedModel] = []
        self._catalog_rows: list[CatalogModel] = []
        self.refresh()

    # -- listing -------------------------------------------------------------
    def refresh(self) -> None:
        try:
            home = paths.home()
            used = size_text(paths.disk_usage())
            self.where.setText(f"Models are stored in {home}  ·  {used} used")
        except Exception as exc:  # noqa: BLE001
            self.where.setText(f"Model folder unavailable: {exc}")
        models = library_view.heads_under_targets(library_view.installed_models())
        listed = {m.source for m in models}
        built = [b for b in library_view.built_in_models() if b.model.ref not in listed]
        self._built_in = built
        rows: list = []
        for b in built:  # a built-in target, and the heads made for it
            mine = [m for m in models if m.head and m.head.get("for") in (b.model.name,
                                                                          b.model.ref)]
            rows += [b, *mine]
        rows += [m for m in models if m not in rows]
        self._installed_rows = rows
        # A head's arrow points at its target's row above it; a head whose
        # target is not listed (loaded from a folder) has no arrow, and its
        # source says which model it drafts for.
        nested = library_view.nested_heads(models, [b.model.name for b in built]
                                           + [b.model.ref for b in built])
        _fill(self.installed, [
            (b.model.display_name, f"{b.model.ref} (built in)", size_text(b.size_bytes),
             b.model.params) if b in built else
            (("↳ " if b in nested else "") + b.name,
             library_view.source_text(b, listed=not b.head or b in nested),
             size_text(b.size_bytes), params_text(b.params) if b.params else "")
            for b in rows])
        self._catalog_rows = library_view.catalog_models()
        _fill(self.catalog, [
            (m.name, m.ref, size_text(m.download_bytes),
             "installed" if m.ref in listed else "built in" if m.bundled else "")
            for m in self._catalog_rows])
        self._selection_changed()
        self.update_training()

    def update_training(self, *_args) -> None:
        """The training row: for the loaded target, or why not now."""
        if self.trainer is None:
            return
        refusal, out = self.trainer.refusal(), self.trainer.out()
        self.train_button.setEnabled(refusal is None)
        resume = refusal is None and out is not None and trained_heads.can_resume(out)
        self.train_restart.setEnabled(resume)
        if not resume:
            self.train_restart.setChecked(False)
        restart = self.train_restart.isChecked()
        self.train_button.setText("Resume training…" if resume and not restart
                                  else "Train a draft head…")
        self.train_note.setText(refusal or (
            f"An EAGLE-3 head for {self.trainer.target}, learnt from your conversations and "
            "the installed packages' text; chat waits while it trains."))

    def _selection_changed(self) -> None:
        """Delete is for what SpecChat installed: a built-in model comes
        with the app and is converted again on its next use."""
        m = self._selected(self.installed, self._installed_rows)
        built_in = m is not None and m in self._built_in
        self.delete_button.setEnabled(m is not None and not built_in)
        self.delete_button.setToolTip("Built-in models come with SpecChat and cannot be deleted"
                                      if built_in else "")

    def _selected(self, table: QTableWidget, rows: list):
        r = table.currentRow()
        return rows[r] if 0 <= r < len(rows) else None

    # -- actions -------------------------------------------------------------
    def delete_selected(self, *, confirm: bool = True) -> asyncio.Future | None:
        # ``confirm`` keyword-only: the button's clicked(checked=False) cannot
        # pass for it, so Delete always asks.
        m = self._selected(self.installed, self._installed_rows)
        if m is None or m in self._built_in:
            return None
        if confirm and QMessageBox.question(
                self, "Delete model", f"Delete {m.name} ({size_text(m.size_bytes)}) from disk?"
        ) != QMessageBox.StandardButton.Yes:
            return None
        row = self._add_task(f"Deleting {m.name} ({size_text(m.size_bytes)})")
        row.cancel_button.setEnabled(False)  # it is unlisted first: nothing to cancel
        return asyncio.ensure_future(self._delete(m.name, row))

    async def _delete(self, name: str, row: TaskRow) -> None:
        # Unlinking gigabytes can take a while: off the GUI thread, which may
        # be streaming a reply meanwhile. The list changes even when it fails
        # (the model was unlisted first).
        work = asyncio.get_running_loop().run_in_executor(None, index.remove, name)
        await self._task(row, work, "Deleted.", relist_on_failure=True)

    def _add_task(self, title: str) -> TaskRow:
        row = TaskRow(title)
        self.tasks.addWidget(row)
        return row

    async def _task(self, row: TaskRow, work, done: str, relist_on_failure: bool = False) -> None:
        """Await a download, import or deletion: its row says how it ended
        (a LibraryError's text is for people); the list is read again and
        the picker told when the models changed."""
        self.pending += 1
        try:
            await work
        except Exception as exc:  # noqa: BLE001
            row.fail("Cancelled." if row.cancelled.is_set() else str(exc))
            if not relist_on_failure:
                return
        else:
            row.finish(done)
        finally:
            self.pending -= 1
        self.refresh()
        self.modelsChanged.emit()

    def download_selected(self) -> None:
        m = self._selected(self.catalog, self._catalog_rows)
        if m is not None:
            self.download(m.ref, m.name)

    def download(self, ref: str, title: str | None = None) -> asyncio.Future:
        row = self._add_task(f"Downloading {title or ref}")
        return asyncio.ensure_future(self._download(ref, row))

    async def _download(self, ref: str, row: TaskRow) -> None:
        loop = asyncio.get_running_loop()

        def progress(p: DownloadProgress) -> None:
            loop.call_soon_threadsafe(row.progress, p.done_bytes, p.total_bytes, p.message)

        await self._task(row, loop.run_in_executor(None, refs.pull, ref, progress, row.cancelled),
                         "Done.")

    def train_head(self, minutes: float, max_steps: int | None = None) -> asyncio.Future | None:
        """Start training for the loaded target (from scratch if Start over
        is ticked); None (and the reason shown) when it cannot start now."""
        refusal = self.trainer.refusal()
        if refusal is not None:
            self.update_training()
            return None
        row = self._add_task(f"Training a draft head for {self.trainer.target}")
        row.cancel_button.clicked.connect(self.trainer.cancel)
        self.train_button.setEnabled(False)
        restart = self.train_restart.isChecked()
        self.train_restart.setChecked(False)  # once: the next run goes on from this one's
        return asyncio.ensure_future(self._train(minutes, max_steps, restart, row))

    async def _train(self, minutes: float, max_steps: int | None, restart: bool,
                     row: TaskRow) -> None:
        line = head_training.ProgressLine()  # keeps the last held-out measurement shown

        def progress(p) -> None:
            row.fraction(min(1.0, p.elapsed_s / p.budget_s) if p.budget_s else None,
                         line.update(p))

        try:
            head = await self.trainer.run(minutes, progress, max_steps, restart)
        except Exception as exc:  # noqa: BLE001 - EngineError/LibraryError text is for people
            row.fail(str(exc))
        else:
            if head is None:  # nothing learnt: cancelled, or the budget ran out first
                done = line.last.message if line.last is not None else ""
                row.fail("Cancelled; nothing was saved." if row.cancelled.is_set() or not done
                         else done[0].upper() + done[1:] + ".")
                self.refresh()
                return
            accept = line.accept_text()
            said = (f"{head.name} is listed under its target"
                    + (f"; held-out acceptance by position {accept}." if accept else "."))
            if row.cancelled.is_set():
                row.stop("Stopped; train again to go on. " + said)
            else:
                row.finish(said)
            self.modelsChanged.emit()
        self.refresh()

    def import_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Import an MLX model folder")
        if path:
            self.import_path(path)

    def import_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF file", "", "GGUF (*.gguf)")
        if path:
            self.import_path(path)

    def import_path(self, path: str, name: str | None = None) -> asyncio.Future:
        row = self._add_task(f"Importing {Path(path).name}")
        return asyncio.ensure_future(self._import(path, name, row))

    async def _import(self, path: str, name: str | None, row: TaskRow) -> None:
        loop = asyncio.get_running_loop()

        def progress(message: str, fraction: float | None = None) -> None:
            loop.call_soon_threadsafe(row.fraction, fraction, str(message))

        def work(_engine=None):
            return importing.import_path(path, name, progress, row.cancelled)

        # The conversion may run MLX: keep it on the engine thread.
        job = (self.client.call(work, loop=loop).result() if self.client is not None
               else loop.run_in_executor(None, work))
        await self._task(row, job, "Imported.")
