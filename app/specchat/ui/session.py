"""The app session: the services one window works with, and its settings.

The window, its controllers and its dialogs are views over a session: they
read the settings from it, change them through ``update_settings`` (which
saves), and follow ``settingsChanged`` instead of being handed values. The
session owns the engine (EngineController and its client thread), the store
(its thread and the conversation and settings stores), the lag monitor and
the per-pair plain speeds; closing it finishes the queued writes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from specchat.engine import modes
from specchat.store.conversations import ConversationStore
from specchat.store.settings import AppSettings
from specchat.store.worker import Remote, StoreWorker, report_failure
from specchat.ui.engine_controller import EngineController
from specchat.ui.gauges import PlainSpeeds
from specchat.ui.lag import LagMonitor
from specchat.ui.requests import reply_mode


class AppSession(QObject):
    settingsChanged = Signal(object)  # AppSettings, after a change
    failed = Signal(str)  # a write of the settings that did not reach the disk

    def __init__(self, client=None, db_path: str | Path | None = None, parent=None):
        """``client``: an EngineClient (the library's by default);
        ``db_path``: the history file (the library home's by default)."""
        super().__init__(parent)
        self.store = StoreWorker(db_path)
        self.conversations: Remote[ConversationStore] = self.store.conversations
        self._settings: AppSettings = self.store.settings.blocking.load()  # start-up
        self.engine = EngineController(client, self)
        self.lag = LagMonitor()
        self.plain_speeds = PlainSpeeds()

    @property
    def settings(self) -> AppSettings:
        return self._settings

    @property
    def notice(self) -> str | None:
        """Set if an unreadable history file was moved aside at start."""
        return self.store.notice

    def update_settings(self, **changes) -> None:
        """Change some settings, save them (on the store's thread) and tell
        every view."""
        new = replace(self._settings, **changes)
        if new == self._settings:
            return
        self._settings = new
        self._save()
        self.settingsChanged.emit(new)

    def next_mode(self, speculative: bool | None = None) -> modes.Mode:
        """How the next reply on the loaded pair will be decoded."""
        return reply_mode(self._settings, self.engine.pair, speculative)

    def _save(self) -> None:
        report_failure(self.store.settings.save(self._settings), self.failed.emit,
                       "save the settings")

    def close(self) -> None:
        """Stop the engine's work and finish the queued writes, this last
        settings save included. A reply or load still finishing must not
        reach the views any more."""
        self.engine.blockSignals(True)
        self.lag.stop()
        self._save()
        self.engine.close()
        self.store.close()
        self.blockSignals(True)
